"""``slurmfabric submit``: render, then submit, validate (--test-only) or show (--dry-run)."""

from __future__ import annotations

import argparse
import sys

from slurmfabric.commands._args import number
from slurmfabric.commands.render import (
    add_config_arguments,
    chosen_bin,
    config_from_args,
    rerender_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmfabric submit",
        description="Render a job config and submit it; prints the job id.",
    )
    add_config_arguments(parser)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true",
                      help="print the exact submission command and script; submit nothing")
    mode.add_argument("--test-only", action="store_true",
                      help="ask Slurm to validate the job (sbatch --test-only); no job starts")
    parser.add_argument("--backend", choices=("sbatch", "pyslurm", "auto"), default="sbatch",
                        help="sbatch (default), pyslurm (optional extra), or auto: pyslurm "
                        "when it is installed, matches the running Slurm's release line and "
                        "can send this job as sbatch would (a dry run asks no Slurm)")
    parser.add_argument("--workdir", metavar="DIR",
                        help="directory to submit from (job output lands there by default)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for the job to end, print its output file, and exit 0 only "
                        "if it COMPLETED")
    parser.add_argument("--timeout", type=number(0, 10**7, low_open=True), default=600,
                        help="seconds --wait waits before giving up (default 600)")
    parser.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[],
                        metavar="ARG", help="extra sbatch command-line argument (repeatable)")
    parser.add_argument("--param", dest="params", action="append", default=[],
                        metavar="NAME=VALUE", help="a run-time parameter declared in "
                        "program.params (repeatable); the job's environment carries it")
    parser.epilog = ("Arguments after '--' go to the script (its \"$@\"), which passes them "
                     "to the program when program.pass_args = true.")
    return parser


def _params(items: list[str]) -> dict[str, str]:
    from slurmfabric.errors import UsageError

    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--param {item!r} is not NAME=VALUE", hint="e.g. --param lr=3e-4")
        out[name] = value
    return out


def main(argv: list[str]) -> int:
    script_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    from slurmfabric.job import submit

    config = config_from_args(args)
    request = submit.build_request(
        config,
        backend=args.backend,
        test_only=args.test_only,
        sbatch_args=args.sbatch_args,
        workdir=args.workdir,
        rerender=rerender_command(args),
        slurmfabric_bin=chosen_bin(args, config),
        params=_params(args.params),
        script_args=script_args,
        dry_run=args.dry_run,
    )
    if args.dry_run:
        sys.stdout.write(request.describe())
        return 0
    job_id = submit.submit(request)
    print(job_id, flush=True)
    if args.test_only:
        return 0
    from slurmfabric.job.follow import record_for

    record_for(config, job_id, request.script, args.workdir)
    if not args.wait:
        return 0
    if config.launcher.resume.enabled:
        return _wait_resumable(job_id, args.timeout, config, args.workdir)
    return _wait_and_show(job_id, args.timeout)


def _wait_resumable(job_key: str, timeout: float, config, workdir: str | None) -> int:
    """Wait through requeues and successors; print the output and the restart history."""
    import os

    from slurmfabric.job.follow import parse_job_id
    from slurmfabric.job.render import checkpoint_dir
    from slurmfabric.restart.follow import wait_run
    from slurmfabric.restart.report import format_history, history
    from slurmfabric.slurm import cmd

    base = os.path.join(workdir or os.getcwd(), config.program.workdir or "")
    directory = os.path.join(base, checkpoint_dir(config))
    job_id, cluster = parse_job_id(job_key)
    last, record = wait_run(job_id, directory, timeout, cluster=cluster)
    state = cmd.job_state(record.get("JobState"))
    out_path = record.get("StdOut", "")
    print(f"job {last} {state} (exit {record.get('ExitCode', '?')}); output: {out_path}")
    sys.stdout.write(cmd.read_output_file(out_path))
    found = history(directory, job_id)
    if found is not None:
        print(format_history(found))
    return 0 if state == "COMPLETED" else 1


def _wait_and_show(job_key: str, timeout: float) -> int:
    """Wait for the job, print its output file, and turn its state into an exit code."""
    from slurmfabric.job.follow import Job, parse_job_id
    from slurmfabric.slurm import cmd

    job_id, cluster = parse_job_id(job_key)  # 123;cluster: every command gets --clusters
    record = cmd.wait_job(job_id, timeout, cluster=cluster)
    state = cmd.job_state(record.get("JobState"))
    out_path = record.get("StdOut", "")
    print(f"job {job_key} {state} (exit {record.get('ExitCode', '?')}); output: {out_path}")
    sys.stdout.write(cmd.read_output_file(out_path))
    if state != "COMPLETED":
        print(Job(job_id, cluster).summary().text())
    return 0 if state == "COMPLETED" else 1
