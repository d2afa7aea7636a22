"""The unit suite under load: it must pass N times in a row while busy loops occupy every
core (issue 29: no test may depend on an idle machine).

    python benchmarks/unit_suite_under_load.py [--runs 3] [--busy 2] [-- PYTEST ARGS]

Starts ``--busy`` processes that spin forever (default: one per core), runs the unit suite
(``-m "not cluster and not sim and not hostile"``) ``--runs`` times, and prints each run's
outcome and wall time, then the ratio of the loaded runs to one unloaded run measured first
in the same invocation. Exit 0 only if every loaded run passed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

UNIT = ["-m", "not cluster and not sim and not hostile", "-q", "-p", "no:cacheprovider",
        "-x", "--no-header"]


def run_suite(extra: list[str]) -> tuple[int, float, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(),
                                                       f"slurmfabric-pycache-{os.getuid()}"))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", *UNIT, *extra], env=env,
                          capture_output=True, text=True)
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode, time.monotonic() - start, tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the unloaded run")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    baseline = None
    if not args.no_baseline:
        rc, baseline, tail = run_suite(args.pytest_args)
        print(f"unloaded: rc={rc} {baseline:.0f} s  {tail}", flush=True)
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    failed = 0
    try:
        for index in range(1, args.runs + 1):
            rc, seconds, tail = run_suite(args.pytest_args)
            ratio = f" ({seconds / baseline:.2f}x unloaded)" if baseline else ""
            print(f"loaded run {index}/{args.runs} with {args.busy} busy loops: rc={rc} "
                  f"{seconds:.0f} s{ratio}  {tail}", flush=True)
            failed += rc != 0
    finally:
        for proc in spin:
            proc.kill()
            proc.wait()
    print(f"{args.runs - failed} of {args.runs} loaded runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
