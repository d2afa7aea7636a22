"""``slurmfabric render``: print or write the sbatch script for a job config."""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from slurmfabric.errors import UsageError

PARTS = ("script", "env", "launch")


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The config options shared by ``render`` and ``submit``."""
    parser.add_argument("-c", "--config", metavar="FILE", help="job config (TOML)")
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="override one field, e.g. job.nodes=2 or 'program.command=[\"python\", \"t.py\"]'"
        " (highest precedence; repeatable)",
    )
    parser.add_argument(
        "--site-defaults", metavar="FILE",
        help="site defaults TOML (default: $SLURMFABRIC_SITE_DEFAULTS or "
        "/etc/slurmfabric/defaults.toml; '' for none)",
    )
    parser.add_argument("--from-script", metavar="SCRIPT",
                        help="re-render from the config embedded in a rendered script")
    parser.add_argument("--slurmfabric-bin", metavar="PATH",
                        help="slurmfabric command the script runs on the compute nodes "
                        "(default: launcher.slurmfabric, else 'slurmfabric' from their PATH)")
    parser.add_argument("--embed-bin", action="store_true",
                        help="write this machine's slurmfabric path into the script (only "
                        "right when the compute nodes share it)")


def chosen_bin(args: argparse.Namespace, config: Any) -> str | None:
    """The --slurmfabric-bin/--embed-bin choice; warns when the path is login-node only."""
    from slurmfabric.job import render

    override = args.slurmfabric_bin
    if args.embed_bin:
        if override:
            raise UsageError("--embed-bin and --slurmfabric-bin cannot be combined")
        override = render.local_slurmfabric_bin()
    path = render.node_bin(config, override)
    why = render.login_only_path(path)
    if why:
        print(f"slurmfabric: warning: the script runs {path} on every node, but {why}; "
              "compute nodes often lack it (set launcher.slurmfabric to a shared install, or "
              "leave it unset to use the nodes' PATH)", file=sys.stderr)
    return override


@functools.lru_cache(maxsize=4)
def _script_text(path: str) -> str:
    """A rendered script's text, read once for its config and its re-render line."""
    from slurmfabric._common.inputfile import read_text

    return read_text(path, "script", 16 << 20, lenient=True)


def rerender_command(args: argparse.Namespace) -> str:
    """The command line that reproduces this render (shown in the script header); from a
    script, the script's own line, so that re-rendering it gives the same script."""
    if args.from_script:
        from slurmfabric.job.render import rerender_from_script

        line = rerender_from_script(_script_text(args.from_script))
        if line:
            return line
    words = ["slurmfabric", "render"]
    if args.config:
        words += ["-c", str(Path(args.config).resolve())]
    for item in args.sets:
        words += ["--set", item]
    if args.site_defaults is not None:
        words += ["--site-defaults", args.site_defaults]
    command = shlex.join(words)
    if any(name.startswith("SLURMFABRIC_") and "__" in name for name in os.environ):
        command += "  (plus the SLURMFABRIC_* environment)"
    return command


def config_from_args(args: argparse.Namespace) -> Any:
    """Load the config the options describe (raises ConfigError, exit 2), and warn once per
    value that looks like shell syntax but will stay data (job/expansion.py)."""
    from slurmfabric.job.expansion import lookalikes

    if args.from_script:
        if args.config or args.sets:
            raise UsageError("--from-script cannot be combined with -c or --set")
        from slurmfabric.job.render import config_from_script

        config = config_from_script(_script_text(args.from_script))
    else:
        from slurmfabric.config import load_config

        # the CLI reads SLURMFABRIC_* variables; a library caller opts in
        config = load_config(args.config, args.sets, args.site_defaults, environment=True)
    from slurmfabric.job.render import nccl_warnings
    from slurmfabric.job.usercode import check_code

    for line in [*lookalikes(config), *check_code(config), *nccl_warnings(config)]:
        print(f"slurmfabric: warning: {line}", file=sys.stderr)
    return config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmfabric render",
        description="Render the sbatch script for a job config. Sources, highest first: "
        "--set, SLURMFABRIC_* environment (SLURMFABRIC_JOB__NODES=2), -c FILE, site "
        "defaults, built-in defaults.",
    )
    add_config_arguments(parser)
    parser.add_argument("--part", choices=PARTS, default="script",
                        help="the whole script (default), or only the env block or launch line")
    parser.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    parser.add_argument("--target", choices=("sbatch", "pytorchjob", "trainjob", "jobset",
                                             "mpijob"), default="sbatch",
                        help="sbatch (default), or a Kubernetes manifest for the Kubeflow "
                        "PyTorchJob / TrainJob, JobSet or MPI Operator from the same config "
                        "(plus its [kubernetes] table)")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from slurmfabric.job import render

    config = config_from_args(args)
    if args.target != "sbatch":
        from slurmfabric.job import k8s as k8smanifest

        if args.part != "script":
            raise UsageError("--part is for sbatch scripts; a manifest is one document")
        text = k8smanifest.to_yaml(k8smanifest.build(config, args.target))
        for line in k8smanifest.warnings(config):
            print(f"slurmfabric: warning: {line}", file=sys.stderr)
        if args.output:
            Path(args.output).write_text(text)
            print(f"wrote {args.output}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return 0
    sf = chosen_bin(args, config)
    if args.part == "env":
        text = render.render_env_block(config, slurmfabric_bin=sf)
    elif args.part == "launch":
        text = render.render_launch(config, slurmfabric_bin=sf)
    else:
        text = render.render_sbatch(config, slurmfabric_bin=sf,
                                    rerender=rerender_command(args))
    if args.output:
        out = Path(args.output)
        out.write_text(text)
        out.chmod(0o755)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
