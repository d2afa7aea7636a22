"""``slurmfabric zipapp [--dir DIR]``: build (once per version) and print the path of the
single-file slurmfabric that container jobs mount into their image (job/zipapp.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str]) -> int:
    from slurmfabric.job import zipapp

    parser = argparse.ArgumentParser(
        prog="slurmfabric zipapp",
        description="Print the path of this slurmfabric as one zipapp file (built if absent), "
        "run in container images by their own python3: 'python3 FILE launch -- CMD'.",
    )
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"cache directory (default: ${zipapp.ENV_DIR}, else "
                        "$XDG_CACHE_HOME/slurmfabric or ~/.cache/slurmfabric); every compute "
                        "node must see it")
    args = parser.parse_args(argv)
    print(zipapp.ensure(args.dir))
    return 0
