"""Guard: reading NCCL logs and nccl-tests output."""
