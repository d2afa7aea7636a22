"""``slurmfabric zipapp [--dir DIR]``: build (once per version) and print the path of the
single-file slurmfabric that container jobs mount into their image (job/zipapp.py).
``--configmap [--namespace NS]`` prints it as the Kubernetes ConfigMap the rendered pods
mount instead (job/k8s.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slurmfabric.errors import UsageError


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
    parser.add_argument("--configmap", action="store_true",
                        help="print the ConfigMap (YAML) that the pods of 'render --target "
                        "pytorchjob|trainjob|jobset|mpijob' mount, for 'kubectl apply -f -'")
    parser.add_argument("--namespace", help="the ConfigMap's namespace (with --configmap; "
                        "the job's kubernetes.namespace)")
    args = parser.parse_args(argv)
    if args.configmap:
        import re

        from slurmfabric.job import k8s

        if args.namespace is not None and not re.match(
                r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", args.namespace):
            raise UsageError(f"--namespace {args.namespace!r} is not a Kubernetes namespace",
                             hint="lower-case letters, digits and '-', at most 63")
        sys.stdout.write(k8s.to_yaml(k8s.zipapp_configmap(args.namespace)))
        return 0
    if args.namespace:
        raise UsageError("--namespace is for --configmap", hint="add --configmap")
    print(zipapp.ensure(args.dir))
    return 0
