"""A local "rank" for the diagnosis tests: a gloo all_reduce loop with torch on CPU.

``python progress_rank.py RANK WORLD INIT_FILE [--sleep-at N]``: every step computes a
little (inside ``progress.compute()``), all-reduces a tensor and calls ``progress.step()``.
With ``--sleep-at N`` this rank sleeps outside the collective at step N (``stall``), so
the others wait in all_reduce. After 3 steps each rank touches ``<INIT_FILE>.ready-RANK``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import slurmfabric.progress as progress


def stall() -> None:
    time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rank", type=int)
    p.add_argument("world", type=int)
    p.add_argument("init")
    p.add_argument("--sleep-at", type=int, default=-1)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.init}", rank=args.rank,
                            world_size=args.world)
    value = torch.ones(16)
    step = 0
    while True:
        step += 1
        with progress.compute():
            value = value * 0.5 + 1.0
            if step == args.sleep_at:
                stall()
        dist.all_reduce(value)
        value /= args.world
        progress.step()
        if step == 3:
            open(f"{args.init}.ready-{args.rank}", "w").close()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
