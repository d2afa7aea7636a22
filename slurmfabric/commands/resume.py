"""``slurmfabric resume supervise|history``: the batch shell's supervisor, and what each
restart of a job cost.

    slurmfabric resume supervise --events timeout,preempt ... -- srun ... (job scripts)
    slurmfabric resume history CHECKPOINT_DIR [--run ID] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from slurmfabric.commands._args import number
from slurmfabric.config.vocabulary import RESUME_EVENTS as EVENTS
from slurmfabric.errors import UsageError


def _events(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    bad = [name for name in names if name not in EVENTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown event(s) {bad}; accepted: {', '.join(EVENTS)}")
    return names


def _signal(text: str) -> str:
    import signal

    name = text.upper().removeprefix("SIG")
    if not hasattr(signal, f"SIG{name}") or name in ("KILL", "STOP"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a signal the supervisor can catch "
                                         "(e.g. USR2, USR1, TERM)")
    return name


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slurmfabric resume",
                                description="survive timeout, preemption, node and worker "
                                "failure; report what each restart cost")
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("supervise", help="run the launch as the batch shell (job scripts)")
    s.add_argument("--events", type=_events, required=True)
    s.add_argument("--max-restarts", type=number(0, 1000, integer=True), default=3)
    s.add_argument("--signal", type=_signal, default="USR2")
    s.add_argument("--grace", type=number(10, 65535, integer=True), default=120)
    s.add_argument("--mode", choices=("requeue", "chain"), default="requeue")
    s.add_argument("--keep", type=number(1, 1000, integer=True), default=2)
    s.add_argument("--launcher", default="srun")
    s.add_argument("--script", help="the job script, resubmitted in chain mode")
    s.add_argument("--checkpoint-dir", default=os.environ.get("SLURMFABRIC_CHECKPOINT_DIR"),
                   help="default: $SLURMFABRIC_CHECKPOINT_DIR")
    s.add_argument("--progress-dir", default=os.environ.get("SLURMFABRIC_PROGRESS_DIR", ""),
                   help="the ranks' heartbeats (slurmfabric.progress): watched for hangs and "
                   "slow ranks (default: $SLURMFABRIC_PROGRESS_DIR; empty: not watched)")
    s.add_argument("--hang-timeout", type=number(10, 86400, integer=True), default=300)
    s.add_argument("--slow-ratio", type=number(1, 10, low_open=True), default=1.10)
    s.add_argument("--prom", default="", help="Prometheus textfile for the heartbeat findings")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- then the launch command")
    h = sub.add_parser("history", help="the restarts of a job, from its checkpoint directory")
    h.add_argument("directory")
    h.add_argument("--run", help="the run id (default: the run that started last)")
    h.add_argument("--json", action="store_true")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.action == "supervise":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            raise UsageError("resume supervise needs the launch command after --")
        if not args.checkpoint_dir:
            raise UsageError("no checkpoint directory: give --checkpoint-dir or set "
                             "SLURMFABRIC_CHECKPOINT_DIR")
        from slurmfabric.restart.supervisor import Options, supervise

        options = Options(events=args.events, max_restarts=int(args.max_restarts),
                          signal=args.signal, grace=int(args.grace), mode=args.mode,
                          keep=int(args.keep), launcher=args.launcher, script=args.script,
                          checkpoint_dir=os.path.abspath(args.checkpoint_dir),
                          progress_dir=args.progress_dir, hang_timeout=float(args.hang_timeout),
                          slow_ratio=float(args.slow_ratio), prom=args.prom)
        return supervise(command, options)
    from slurmfabric.restart.report import format_history, history

    found = history(args.directory, args.run)
    if found is None:
        print(f"slurmfabric: no restart record under {args.directory}", file=sys.stderr)
        return 1
    if args.json:
        data = asdict(found)
        for item, restart in zip(data["restarts"], found.restarts):
            item.update(steps_redone=restart.steps_redone, seconds_lost=restart.seconds_lost)
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(format_history(found))
    return 0
