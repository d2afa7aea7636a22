"""A local "rank" for the diagnosis tests: a gloo training loop with torch on CPU.

``python progress_rank.py RANK WORLD INIT_FILE [--sleep-at N] [--depth D] [--workers W]
[--mode sync|async|ddp]``: every step computes a little (inside ``progress.compute()``),
then synchronises with the other ranks and calls ``progress.step()``. With ``--sleep-at
N`` this rank sleeps outside any collective at step N (``stall``, reached ``D`` frames
deep), so the others wait for it. After 3 steps each rank touches
``<INIT_FILE>.ready-RANK``.

Modes, as NCCL programs synchronise (issue 45):
- ``sync``: a blocking ``all_reduce``; the others wait inside its Python frame.
- ``async``: ``all_reduce(async_op=True)``, then ``wait()`` later; the others wait at the
  ``wait()`` line, in no torch.distributed Python frame.
- ``ddp``: DistributedDataParallel; the reducer issues the all-reduce from autograd hooks
  during ``backward()``, where the others wait (the culprit stalls before backward).

``--workers W``: a DataLoader with W worker processes (fork), which inherit RANK: the
collector must not count them as ranks.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

import slurmfabric.progress as progress


def stall() -> None:
    time.sleep(3600)


def deeper(depth: int) -> None:
    if depth <= 1:
        stall()
    else:
        deeper(depth - 1)


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((16,), float(index % 7))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rank", type=int)
    p.add_argument("world", type=int)
    p.add_argument("init")
    p.add_argument("--sleep-at", type=int, default=-1)
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--mode", choices=("sync", "async", "ddp"), default="sync")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.init}", rank=args.rank,
                            world_size=args.world)
    batches = iter(torch.utils.data.DataLoader(
        Numbers(), batch_size=1, num_workers=args.workers,
        persistent_workers=args.workers > 0)) if args.workers else None
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1)) \
        if args.mode == "ddp" else None
    value = torch.ones(16)
    step = 0
    while True:
        step += 1
        with progress.compute():
            batch = next(batches)[0] if batches is not None else torch.ones(16)
            value = value * 0.5 + batch * 0.01 + 1.0
            if step == args.sleep_at:
                deeper(args.depth)
            if model is not None:
                model(value).sum().backward()  # DDP's all-reduce runs in here
        if args.mode == "sync":
            dist.all_reduce(value)
        elif args.mode == "async":
            work = dist.all_reduce(value, async_op=True)
            value = value * 1.0  # other work while the collective runs
            work.wait()
        value /= args.world
        progress.step()
        if step == 3:
            open(f"{args.init}.ready-{args.rank}", "w").close()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
