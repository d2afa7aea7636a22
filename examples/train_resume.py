"""A CPU training loop that survives interruptions (gloo, run by torchrun or srun tasks).

It keeps the resume contract of ``slurmfabric.restart``: it resumes from the newest complete
checkpoint in ``SLURMFABRIC_CHECKPOINT_DIR``, checkpoints every ``TRAIN_CHECKPOINT_EVERY``
steps and whenever the supervisor asks for a checkpoint (``save_requested()``), and marks
each step it reaches for the restart report. The "model" is one parameter ``w``. Every step
all-reduces the ranks' numbers, and ``w`` moves by a known amount, so the final ``w`` of an
interrupted run must equal an uninterrupted one exactly (``expected_w``).

Knobs (environment): TRAIN_STEPS (300), TRAIN_STEP_SECONDS (0.05),
TRAIN_CHECKPOINT_EVERY (20). TRAIN_FAIL_AT=N makes rank 1 exit with code 3 at step N, once
per checkpoint directory, to show a worker failure.
"""

from __future__ import annotations

import json
import os
import time

LR = 0.5


def gradient(step: int) -> float:
    return float((step * 7) % 11 - 5)


def expected_w(steps: int) -> float:
    """``w`` after ``steps`` uninterrupted steps (the same float operations as training)."""
    w = 0.0
    for step in range(1, steps + 1):
        w -= LR * gradient(step)
    return w


def main() -> int:
    import torch
    import torch.distributed as dist

    import slurmfabric

    steps = int(os.environ.get("TRAIN_STEPS", "300"))
    pause = float(os.environ.get("TRAIN_STEP_SECONDS", "0.05"))
    every = int(os.environ.get("TRAIN_CHECKPOINT_EVERY", "20"))
    fail_at = int(os.environ.get("TRAIN_FAIL_AT", "0"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    checkpoints = slurmfabric.Checkpoints()

    # Rank 0 picks the checkpoint and sends it to everyone, so all ranks start alike.
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
                          "worker_restart": os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                          "node": os.environ.get("SLURMD_NODENAME")}), flush=True)
    total = world * (world + 1) / 2
    answered = False  # one checkpoint per save request
    for step in range(start + 1, steps + 1):
        value = torch.tensor([float(rank + 1)], dtype=torch.float64)
        dist.all_reduce(value)
        w -= LR * gradient(step) * value.item() / total
        time.sleep(pause)
        if fail_at and step == fail_at and rank == 1:
            marker = os.path.join(checkpoints.directory, ".worker-failed-once")
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(3)
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
                          "restart": slurmfabric.restart_count()}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
