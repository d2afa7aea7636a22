"""Validation of the fabric: NCCL debug logs, nccl-tests results and node-pair sweeps.

Parsers here are pure functions over recorded text (tested on real excerpts from public
issues); the Slurm side of the pair sweep goes through ``slurmfabric.slurmcmd``.
"""

from __future__ import annotations
