"""Smoke test for a multi-node launch: a gloo all_reduce of rank+1 on CPU.

Every rank prints one JSON line: rank, local_rank, world_size, node (SLURMD_NODENAME), the
all_reduce sum, which must be world_size * (world_size + 1) / 2 on every rank, and what
`slurmfabric launch` gave this rank: its CPUs (sched_getaffinity), memory node, nearest
rail NIC and the NCCL variables.
Reads the standard torch.distributed variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) that torchrun or `slurmfabric launch` set.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

SHOWN = ("SLURMFABRIC_NIC", "SLURMFABRIC_MEM_NODE", "NCCL_NET", "NCCL_IB_HCA",
         "NCCL_IB_GID_INDEX", "NCCL_IB_DISABLE")


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    record = json.dumps({
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
        "world_size": world_size,
        "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()),
        "sum": int(value.item()),
        "cpus": sorted(os.sched_getaffinity(0)),
        **{name: os.environ.get(name) for name in SHOWN},
    })
    # One write per line: ranks share the step's output pipe.
    sys.stdout.write(record + "\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
