"""A torch flight-recorder dump for the tests that read them (progress/flight.py): the
shape and field names of torch 2.10's own dumps, with one rank's progress set by ``seq``."""

from __future__ import annotations


def fr_dump(seq: int, state: str = "completed") -> dict:
    """A dump in the shape torch/distributed/flight_recorder/components/loader.py reads."""
    return {"version": "2.10", "pg_config": {}, "entries": [
        {"record_id": i, "process_group": ("0", "default_pg"), "collective_seq_id": i,
         "p2p_seq_id": 0, "profiling_name": "nccl:all_reduce", "state": state if i == seq
         else "completed", "frames": [{"name": "train", "filename": "train.py", "line": 9}],
         "input_sizes": [[4]], "output_sizes": [[4]], "is_p2p": False}
        for i in range(1, seq + 1)]}
