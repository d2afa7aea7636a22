"""A training loop whose data loading is slow on one node: the data-loading share in
``slurmfabric jobs stragglers`` (docs/progress.md, "Waiting for data").

A real ``torch.utils.data.DataLoader`` (``LOADER_WORKERS`` workers, default 1) over a
dataset whose items take ``DATA_DELAY`` seconds (default 0.08) to read on the node whose
``SLURM_NODEID`` is ``DATA_SLOW_NODE`` (default 1), none elsewhere: a slow data mount on
that node. Each step computes ``TRAIN_COMPUTE`` seconds (0.02) inside
``slurmfabric.progress.compute()``, all-reduces the batch over gloo and calls
``progress.step()``: the progress contract, nothing more; the helper sees the wait for the
next batch between the two. Runs ``TRAIN_SECONDS`` (40), all ranks stopping together.
Ranks find each other from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (set by
``slurmfabric launch`` or by hand).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import slurmfabric.progress as progress


class Items(torch.utils.data.Dataset):
    """Items that take ``delay`` seconds each to read."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.full((4,), float(index))


def main() -> None:
    dist.init_process_group("gloo")
    slow = os.environ.get("SLURM_NODEID", "0") == os.environ.get("DATA_SLOW_NODE", "1")
    delay = float(os.environ.get("DATA_DELAY", "0.08")) if slow else 0.0
    compute = float(os.environ.get("TRAIN_COMPUTE", "0.02"))
    loader = torch.utils.data.DataLoader(Items(delay), batch_size=1,
                                         num_workers=int(os.environ.get("LOADER_WORKERS", "1")))
    end = time.time() + float(os.environ.get("TRAIN_SECONDS", "40"))
    for batch in loader:
        with progress.compute():
            time.sleep(compute)
        dist.all_reduce(batch)
        done = torch.tensor([float(time.time() > end)])
        dist.all_reduce(done)  # every rank stops at the same step
        progress.step()  # last: what follows until compute() is the wait for data
        if done.item() > 0:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
