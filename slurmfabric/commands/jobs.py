"""``slurmfabric jobs status|logs|wait|cancel|list|diagnose|stragglers``: follow jobs.

    slurmfabric jobs status JOB [--json]     state, reason, nodes, elapsed, restarts; why it failed
    slurmfabric jobs logs JOB [--rank N] [--tail N] [--follow]
    slurmfabric jobs wait JOB [--timeout S]  exit 0 only when the job COMPLETED
    slurmfabric jobs cancel JOB [--signal SIG]
    slurmfabric jobs list [--json]           the jobs submit recorded
    slurmfabric jobs diagnose JOB [--json]   every rank's stack: who the others wait for
    slurmfabric jobs stragglers JOB --progress-dir DIR [--seconds S] [--every S] [--json]

JOB is ``123``, ``123;cluster``, ``123_4`` (array task) or ``123+1`` (het component).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from slurmfabric.commands._args import number


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slurmfabric jobs",
                                description="follow jobs after submit: status, logs, wait, "
                                "cancel, list, and why a job failed")
    sub = p.add_subparsers(dest="action", required=True)
    status = sub.add_parser("status", help="state, reason, nodes, elapsed; the failure summary")
    status.add_argument("job")
    status.add_argument("--json", action="store_true")
    logs = sub.add_parser("logs", help="the job's output, or one rank's (launcher.task_output)")
    logs.add_argument("job")
    logs.add_argument("--rank", type=number(0, 10**7, integer=True))
    logs.add_argument("--tail", type=number(1, 10**7, integer=True))
    logs.add_argument("--follow", action="store_true", help="keep printing new lines until "
                      "the job ends")
    wait = sub.add_parser("wait", help="wait for the end; exit 0 only when COMPLETED")
    wait.add_argument("job")
    wait.add_argument("--timeout", type=number(0, 10**7, low_open=True), default=3600)
    wait.add_argument("--json", action="store_true")
    cancel = sub.add_parser("cancel", help="scancel the job (or send it a signal)")
    cancel.add_argument("job")
    cancel.add_argument("--signal", help="send this signal instead of cancelling, e.g. USR2")
    listing = sub.add_parser("list", help="the jobs submit recorded, newest last")
    listing.add_argument("--json", action="store_true")
    diag = sub.add_parser("diagnose", help="a running job: every rank's Python stack (py-spy, "
                          "one srun --overlap step); names the ranks the others wait for")
    diag.add_argument("job")
    diag.add_argument("--json", action="store_true")
    diag.add_argument("--timeout", type=number(1, 3600, integer=True), default=60,
                      help="seconds for the collector step (default 60)")
    diag.add_argument("--progress-dir", help="the ranks' heartbeat directory on each node "
                      "(default: the ranks' SLURMFABRIC_PROGRESS_DIR)")
    diag.add_argument("--flight-prefix", help="PyTorch flight recorder dump prefix on each "
                      "node (default: the ranks' TORCH_FR_DUMP_TEMP_FILE / "
                      "TORCH_NCCL_DEBUG_INFO_TEMP_FILE, else /tmp/nccl_trace_rank_)")
    slow = sub.add_parser("stragglers", help="watch the ranks' heartbeats for a while: each "
                          "rank's compute per step against its peers; the slow and hung ones")
    slow.add_argument("job")
    slow.add_argument("--progress-dir", required=True, help="the job's heartbeat directory "
                      "(the ranks' SLURMFABRIC_PROGRESS_DIR), readable from here")
    slow.add_argument("--seconds", type=number(1, 86400), default=60,
                      help="how long to watch (default 60)")
    slow.add_argument("--hang-timeout", type=number(1, 86400), default=300)
    slow.add_argument("--every", type=number(0.5, 3600), default=5,
                      help="seconds between two looks at the beats (default 5)")
    slow.add_argument("--input-share", type=number(0.01, 1), default=0.25,
                      help="a rank waiting this share of its steps for its next batch is "
                      "input-bound (default 0.25)")
    slow.add_argument("--json", action="store_true")
    return p


def _stragglers(args: argparse.Namespace) -> int:
    from slurmfabric.progress.watch import Watch, node_shares, observe

    watch, beats, found = observe(args.progress_dir, args.seconds, every=args.every,
                                  watch=Watch(timeout=args.hang_timeout,
                                              window=min(40.0, max(4 * args.every,
                                                                   args.seconds)),
                                              input_share=args.input_share))
    nodes = node_shares(watch, beats)
    if args.json:
        print(json.dumps({"job": args.job, "findings": [f.to_dict() for f in found],
                          "ratios": {str(r): v for r, v in sorted(watch.ratios.items())},
                          "compute_per_step": {str(r): v for r, v in
                                               sorted(watch.per_step.items())},
                          "data_share": {str(r): round(v, 4) for r, v in
                                         sorted(watch.shares.items())},
                          "nodes": nodes}, indent=2, sort_keys=True))
        return 0
    print(f"job {args.job}: {len(beats)} rank(s) beating; watched {args.seconds:g} s")
    for rank in sorted(beats):
        b = beats[rank]
        ratio, share = watch.ratios.get(rank), watch.shares.get(rank)
        print(f"  rank {rank} on {b.host or '?'} (gpu {b.gpu or '?'}): step {b.step}"
              + (f", {watch.per_step[rank]:.4f} s compute/step, {ratio:.2f}x peers"
                 if ratio is not None else "")
              + (f", {share:.0%} of each step waiting for data" if share is not None
                 else ""))
    for host, node in nodes.items():
        if node["data_share"] is not None:
            ranks = ",".join(str(r) for r in node["ranks"])  # type: ignore[union-attr]
            print(f"  node {host} (ranks {ranks}): "
                  f"{node['data_share']:.0%} of each step waiting for data"
                  + (": input-bound" if node["input_bound"] else ""))
    for f in found:
        print(f.log_line())
    if not found:
        print("no straggler or hang found")
    return 0


def _report(job, status, as_json: bool) -> int:
    summary = job.summary() if status.done and status.state != "COMPLETED" else None
    if as_json:
        data = asdict(status)
        data["summary"] = summary.to_dict() if summary else None
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(f"job {status.key}: {status.state}"
              + (f" ({status.reason})" if status.reason not in ("", "None") else "")
              + (f" on {status.nodes}" if status.nodes else "")
              + (f", elapsed {status.elapsed}" if status.elapsed else "")
              + (f", restarts {status.restarts}" if status.restarts else "")
              + (f", exit {status.exit_code}" if status.exit_code else "")
              + (" [from accounting]" if status.source == "sacct" else ""))
        if summary is not None:
            print(summary.text())
    return 0


def _follow(job, rank) -> int:
    path, seen = job.log_path(rank), 0
    while True:
        from slurmfabric.slurm import cmd

        text = cmd.read_output_file(path)
        if len(text) > seen:
            sys.stdout.write(text[seen:])
            sys.stdout.flush()
            seen = len(text)
        if job.status().done:
            rest = cmd.read_output_file(path)[seen:]
            sys.stdout.write(rest)
            return 0
        time.sleep(0.5)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from slurmfabric.job.follow import Job, load_records

    if args.action == "stragglers":
        return _stragglers(args)
    if args.action == "list":
        records = load_records()
        if args.json:
            print(json.dumps([asdict(r) for r in records], indent=2, sort_keys=True))
            return 0
        for r in records:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.submitted))
            print(f"{r.key:<14} {stamp}  {r.name:<24} {r.workdir}")
        return 0
    job = Job.from_text(args.job)
    if args.action == "diagnose":
        from slurmfabric.progress.diagnose import diagnose

        result = diagnose(job.job_id, job.cluster, timeout=args.timeout,
                          progress_dir=args.progress_dir, flight_prefix=args.flight_prefix)
        print(json.dumps(result.to_dict(), indent=2, sort_keys=True) if args.json
              else result.text())
        return 0
    if args.action == "status":
        return _report(job, job.status(), args.json)
    if args.action == "wait":
        status = job.wait(timeout=args.timeout)
        _report(job, status, args.json)
        return 0 if status.state == "COMPLETED" else 1
    if args.action == "cancel":
        job.cancel(args.signal)
        print(f"job {job.key}: " + (f"sent {args.signal}" if args.signal else "cancelled"))
        return 0
    if args.follow:
        return _follow(job, args.rank)
    sys.stdout.write(job.logs(rank=args.rank, tail=args.tail))
    return 0
