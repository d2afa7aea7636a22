"""A CPU training loop with fault switches: the hang, stop and slow scenarios of
docs/progress.md (tests/cluster/test_faults_cluster.py), run by srun tasks with gloo.

The same resume contract and arithmetic as ``train_resume.py`` (one parameter ``w``; every
step all-reduces the ranks' numbers; the final ``w`` of an interrupted run equals an
uninterrupted one, ``expected_w``), plus the progress contract: the step's compute is
timed with ``slurmfabric.progress.compute()`` and each step ends with
``slurmfabric.progress.step()``.

Knobs (environment): TRAIN_STEPS (400), TRAIN_COMPUTE_SECONDS (0.05),
TRAIN_CHECKPOINT_EVERY (20); TRAIN_BUSY (0): compute as that many loop iterations of CPU
work instead of a sleep (ranks sharing a core then really compute slower). Faults,
injected in rank FAULT_RANK (3) at step FAULT_STEP (100), inside the step's compute, so
outside the collective the other ranks then wait in:

- FAULT=hang: the rank sleeps for ever;
- FAULT=stop: the rank sends itself SIGSTOP;
- FAULT=crash: the rank exits 1 (srun then ends the others);
- FAULT=slow: from that step on, the rank's compute takes FAULT_SLOW (0.3) longer.

A hang, stop or crash happens once per checkpoint directory (a marker file), so the restarted job
trains on. Each fault prints one JSON line (``{"fault": ...}``) with its time and node.

How the ranks synchronise, as NCCL programs do (SYNC; the arithmetic is the same):
- ``allreduce`` (default): a blocking ``all_reduce``; the others wait in its Python frame;
- ``async``: ``all_reduce(async_op=True)``, the work's ``wait()`` a line later; the
  others wait there, in no torch.distributed Python frame;
- ``ddp``: DistributedDataParallel; its reducer all-reduces the gradient from autograd
  hooks during ``backward()``, where the others wait.

Realistic stacks: FAULT_DEPTH (1) frames between the step and the hang, and TRAIN_WORKERS
(0) DataLoader worker processes per rank, which inherit RANK.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

# Before the slow imports: the job log shows the ranks are alive (log-silence detection).
print(json.dumps({"starting": os.environ.get("SLURM_PROCID"), "time": time.time()}),
      flush=True)


def main() -> int:
    import torch
    import torch.distributed as dist

    print(json.dumps({"imported": os.environ.get("SLURM_PROCID"), "time": time.time()}),
          flush=True)
    import slurmfabric
    import slurmfabric.progress as progress

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_resume import LR, expected_w, gradient

    steps = int(os.environ.get("TRAIN_STEPS", "400"))
    compute = float(os.environ.get("TRAIN_COMPUTE_SECONDS", "0.05"))
    every = int(os.environ.get("TRAIN_CHECKPOINT_EVERY", "20"))
    fault = os.environ.get("FAULT", "")
    fault_rank = int(os.environ.get("FAULT_RANK", "3"))
    fault_step = int(os.environ.get("FAULT_STEP", "100"))
    slower = 1.0 + float(os.environ.get("FAULT_SLOW", "0.3"))
    depth = int(os.environ.get("FAULT_DEPTH", "1"))
    sync = os.environ.get("SYNC", "allreduce")
    workers = int(os.environ.get("TRAIN_WORKERS", "0"))
    busy = int(os.environ.get("TRAIN_BUSY", "0"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoints = slurmfabric.Checkpoints()
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()

    state = torch.zeros(2, dtype=torch.float64)
    if rank == 0:
        latest = checkpoints.latest()
        if latest is not None:
            with open(os.path.join(latest[1], "state.json")) as handle:
                saved = json.load(handle)
            state[0], state[1] = saved["step"], float.fromhex(saved["w"])
    dist.broadcast(state, 0)
    start, w = int(state[0].item()), float(state[1].item())
    if rank == 0:
        print(json.dumps({"resumed_from": start, "restart": slurmfabric.restart_count(),
                          "node": node, "time": time.time()}), flush=True)
    Scale, Numbers = torch_classes()
    batches = iter(torch.utils.data.DataLoader(
        Numbers(), batch_size=1, num_workers=workers, persistent_workers=True)) \
        if workers else None
    # DDP: the gradient of p is rank + 1 on each rank; the reducer averages it, so
    # grad * world is the same sum as the all_reduce's (exact in float64 for small worlds)
    model = None
    if sync == "ddp":  # its first use imports torch._dynamo: seconds of silence
        model = torch.nn.parallel.DistributedDataParallel(Scale())
        print(json.dumps({"ddp": rank, "time": time.time()}), flush=True)
    marker = os.path.join(checkpoints.directory, f".fault-{fault}-once")
    total = world * (world + 1) / 2
    answered = False
    slow = False
    for step in range(start + 1, steps + 1):
        with progress.compute():
            if rank == fault_rank and step == fault_step and fault in ("hang", "stop", "crash") \
                    and not os.path.exists(marker):
                open(marker, "w").close()
                print(json.dumps({"fault": fault, "rank": rank, "node": node, "step": step,
                                  "pid": os.getpid(), "time": time.time()}), flush=True)
                if fault == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                if fault == "crash":
                    sys.exit(1)
                hang(depth)
            if rank == fault_rank and fault == "slow" and step >= fault_step and not slow:
                slow = True
                print(json.dumps({"fault": "slow", "rank": rank, "node": node, "step": step,
                                  "pid": os.getpid(), "time": time.time()}), flush=True)
            if batches is not None:
                next(batches)
            if busy:  # fixed CPU work: ranks that share a core take longer
                spin(int(busy * (slower if slow else 1.0)))
            else:
                time.sleep(compute * (slower if slow else 1.0))
        value = torch.tensor([float(rank + 1)], dtype=torch.float64)
        if model is not None:
            model(value).backward()  # the reducer's all-reduce runs in here
            grad = model.module.p.grad
            value = grad * world
            grad.zero_()
        elif sync == "async":
            work = dist.all_reduce(value, async_op=True)
            work.wait()
        else:
            dist.all_reduce(value)
        w -= LR * gradient(step) * value.item() / total
        progress.step(step=step)
        if rank != 0:
            continue
        checkpoints.mark(step)
        asked = slurmfabric.save_requested() and not answered
        if asked or step % every == 0 or step == steps:
            answered = answered or asked

            def write(directory: str, step: int = step, w: float = w) -> None:
                with open(os.path.join(directory, "state.json"), "w") as handle:
                    json.dump({"step": step, "w": w.hex()}, handle)

            checkpoints.save(step, write)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"final_step": steps, "w": w.hex(), "expected": expected_w(steps).hex(),
                          "node": node, "restart": slurmfabric.restart_count(),
                          "time": time.time()}), flush=True)
    dist.destroy_process_group()
    return 0


def spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def hang(depth: int) -> None:
    """Sleep for ever, ``depth`` frames down (a real program hangs deep in its model)."""
    if depth > 1:
        hang(depth - 1)
    while True:
        time.sleep(3600)


def torch_classes():
    """The model and dataset, defined once torch is imported (the module starts without
    it, so the job log shows the ranks alive before the slow import)."""
    import torch

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))

        def forward(self, x):
            return (self.p * x).sum()

    class Numbers(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, index: int):
            return torch.zeros(4)

    return Scale, Numbers


if __name__ == "__main__":
    raise SystemExit(main())
