"""How long `testbed up` takes to bring N idle nodes up, and `down` to stop them.

Uses its own state directory, ports and node prefix, so it runs beside a live testbed.
Run as root: .venv/bin/python benchmarks/bench_testbed.py [--nodes 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from slurmfabric.testbed import Settings, Testbed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ups, downs = [], []
    for _ in range(args.repeat):
        state = Path(tempfile.mkdtemp(prefix="sf-bench-", dir="/var/tmp"))
        state.chmod(0o755)
        tb = Testbed(Settings(state_dir=state, nodes=args.nodes, prefix="sfb", ctld_port=18817,
                              node_port_base=18901, addr_prefix="127.0.79.",
                              cluster_name="sfbench"))
        t0 = time.monotonic()
        tb.up(timeout=60, log=lambda m: None)
        ups.append(time.monotonic() - t0)
        t0 = time.monotonic()
        tb.down(log=lambda m: None)
        downs.append(time.monotonic() - t0)
    print(f"testbed up ({args.nodes} nodes idle): median {statistics.median(ups):.2f} s, "
          f"max {max(ups):.2f} s over {args.repeat} runs")
    print(f"testbed down: median {statistics.median(downs):.2f} s")


if __name__ == "__main__":
    main()
