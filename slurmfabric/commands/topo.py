"""``slurmfabric topo``: what this node has, what NCCL should use, and why.

slurmfabric topo [--sysfs-root DIR | --from FILE] [--json] [--explain]
slurmfabric topo snapshot -o FILE[.json|.tar.gz] [--sysfs-root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from slurmfabric.commands._args import number
from slurmfabric.errors import UsageError


def _env_nodes() -> int:
    text = os.environ.get("SLURM_JOB_NUM_NODES", "")
    return int(text) if text.isdigit() and int(text) > 0 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmfabric topo",
        description="Discover GPUs, RDMA NICs and NUMA layout and show the NCCL/NUMA plan. "
        "'slurmfabric topo snapshot -o FILE' saves what discovery read (JSON or tarball).",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--sysfs-root",
        metavar="DIR",
        type=sysfs_root,
        help="read sysfs/procfs under DIR (default: $SLURMFABRIC_SYSFS_ROOT or /)",
    )
    source.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="plan from a snapshot written by 'topo snapshot'",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--nccl-topo-xml", metavar="FILE",
                        help="also write NCCL's topology XML for this node (for NCCL_TOPO_FILE)")
    parser.add_argument("--explain", action="store_true", help="the reason for every choice")
    parser.add_argument(
        "--ntasks", type=number(1, 1024, integer=True), default=None,
        help="local ranks to plan for (default: one per GPU)"
    )
    parser.add_argument(
        "--master-addr",
        default=os.environ.get("MASTER_ADDR"),
        help="address rank 0 listens on (default: $MASTER_ADDR)",
    )
    parser.add_argument(
        "--nccl-version", default=None, help="NCCL version the job runs, e.g. 2.21.5"
    )
    parser.add_argument(
        "--nodes", type=number(1, 100000, integer=True),
        default=_env_nodes(), help="the job's node count, for --explain's NCCL settings at "
        "scale (default: $SLURM_JOB_NUM_NODES or 1)"
    )
    parser.add_argument(
        "--fabric-type", choices=("auto", "ib", "roce", "efa", "tcp"),
        default=os.environ.get("SLURMFABRIC_FABRIC_TYPE") or "auto",
        help="the job's fabric.type (default: $SLURMFABRIC_FABRIC_TYPE or auto); exit 1 if "
        "this node cannot honour it",
    )
    return parser


def sysfs_root(text: str) -> str:
    """--sysfs-root: a directory that holds a sys/ tree (a fixture, a container's view)."""
    if not os.path.isdir(os.path.join(text, "sys")):
        raise argparse.ArgumentTypeError(f"{text!r} has no sys/ directory: not a sysfs root")
    return text


def _snapshot(argv: list[str]) -> int:
    from slurmfabric.topology import discover, snapshot

    parser = argparse.ArgumentParser(
        prog="slurmfabric topo snapshot", description="Save the files topology discovery reads."
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="FILE.json for the parsed snapshot, anything else for a tar.gz",
    )
    parser.add_argument("--sysfs-root", metavar="DIR", type=sysfs_root)
    args = parser.parse_args(argv)
    if args.output.endswith(".json"):
        topo = discover(args.sysfs_root)
        snapshot.write_json(topo, args.output)
    else:
        topo = snapshot.write_tarball(args.sysfs_root, args.output)
    print(
        f"wrote {args.output}: {len(topo.gpus)} GPUs, {len(topo.ports)} RDMA ports, "
        f"{len(topo.netdevs)} netdevs"
    )
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["snapshot"]:
        return _snapshot(argv[1:])
    args = build_parser().parse_args(argv)
    from slurmfabric.plan import make_plan, visible_gpus_from_env
    from slurmfabric.topology import discover

    if args.from_file:
        from slurmfabric.topology import snapshot

        topo = snapshot.load(args.from_file)
    else:
        topo = discover(args.sysfs_root)
    plan = make_plan(
        topo,
        args.ntasks or max(len(topo.gpus), 1),
        visible_gpus=None if args.from_file else visible_gpus_from_env(dict(os.environ)),
        master_addr=args.master_addr,
        user_env={k: v for k, v in os.environ.items()
                  if k.startswith("NCCL_") or k == "SLURMFABRIC_ROCE_VLAN"},
        nccl_version=args.nccl_version,
        fabric_type=args.fabric_type,
        node=os.uname().nodename,
    )
    if args.nccl_topo_xml:
        from slurmfabric.topology.nccl_topo import to_xml

        try:
            with open(args.nccl_topo_xml, "w", encoding="utf-8") as handle:
                handle.write(to_xml(topo))
        except OSError as exc:
            raise UsageError(f"--nccl-topo-xml {args.nccl_topo_xml}: {exc.strerror}") from None
        print(f"wrote {args.nccl_topo_xml}", file=sys.stderr)
    if args.json:
        from slurmfabric.topology.snapshot import to_dict

        json.dump({"topology": to_dict(topo), "plan": plan.to_dict()}, sys.stdout, indent=1)
        print()
        return 1 if plan.errors else 0
    from slurmfabric.commands._topo_table import render

    print(render(topo, plan, explain=args.explain))
    if args.explain:
        print("\n".join(_scale_lines(plan, args.nodes)))
    if args.explain and not args.from_file and plan.fabric == "roce":
        print("\n".join(_roce_lines(topo, plan, args.sysfs_root or topo.root)))
    return 1 if plan.errors else 0


def _scale_lines(plan, nodes: int) -> list[str]:
    """NCCL settings for this fabric at the job's scale (plan/scale.py), the user's values
    (the environment's NCCL_*) over the plan's, and the warnings they earn."""
    from slurmfabric.plan import scale

    env = {**plan.nccl_env, **{k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}
    fabric = plan.fabric if plan.fabric in ("ib", "roce", "tcp", "efa") else "auto"
    lines = [f"NCCL settings for {fabric} at {nodes} node(s) (--nodes; "
             "slurmfabric/plan/scale.py):"]
    lines += [f"  {a.line()}" for a in scale.advice(fabric, nodes, env)]
    lines += [f"  warning: {w}" for w in scale.warnings(fabric, nodes, env)]
    return lines


def _roce_lines(topo, plan, root: str) -> list[str]:
    """The RoCE traffic class and lossless check (slurmfabric/roce/explain.py). The tools
    (ethtool, mlnx_qos, dcb at their standard paths) ask the running kernel, so they run
    only when the root is the real one, not a fixture or snapshot tree."""
    from slurmfabric.roce.explain import lines
    from slurmfabric.roce.facts import Tools, collect

    real = os.path.realpath(root) == "/"
    tools = Tools() if real else Tools(ethtool=None, mlnx_qos=None, dcb=None)
    out = lines(topo, plan, collect(root, tools), dict(os.environ))
    if out and not real:
        out.insert(1, f"  (sysfs under {root}: ethtool, mlnx_qos and dcb not run)")
    return out
