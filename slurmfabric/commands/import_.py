"""``slurmfabric import SCRIPT``: write a config for an existing sbatch script.

The library (job/importer) reads the script without running it; this command writes the
TOML and prints, with line numbers, everything that is not a plain mapping: values
slurmfabric derives, lines kept as code, run-time values taken at their defaults, and what
could not be mapped. ``--check`` renders the config and compares both scripts' behaviour
among recording stand-ins (job/importer/check.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from slurmfabric.errors import ConfigError, UsageError

_HEADINGS = {
    "unmapped": "not mapped (review these)",
    "fixed": "run-time values taken at their defaults",
    "verbatim": "kept as code",
    "derived": "derived by slurmfabric (dropped)",
    "dropped": "dropped (no effect in the config)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmfabric import",
        description="Write a slurmfabric config (TOML) for an existing sbatch script. The "
        "script is read, never run. What could not be mapped is printed with line numbers "
        "on stderr. Exit 0: the config loads, renders and carries every line; 1: written, "
        "with the lines still to fix listed at its top; 2: refused.",
    )
    parser.add_argument("script", metavar="SCRIPT", help="the sbatch script to import")
    parser.add_argument("-o", "--output", metavar="CONFIG.toml",
                        help="write the config here instead of stdout")
    parser.add_argument("--check", action="store_true",
                        help="render the config and run both scripts as batch jobs on the "
                        "local testbed (slurmfabric testbed up), programs replaced by "
                        "recording stand-ins; exit 1 when their request, steps, programs, "
                        "environment or exit code differ. Without a running testbed both "
                        "run with bash among stand-ins (weaker, said so)")
    parser.add_argument("--stand-ins", action="store_true",
                        help="with --check: run both scripts with bash among stand-ins, "
                        "even when a testbed runs (no srun, sbatch or slurmstepd)")
    parser.add_argument("--quiet", action="store_true",
                        help="print only what was not mapped (not kept code, derived values)")
    return parser


def _validated(config: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from slurmfabric.config.loader import format_errors
    from slurmfabric.config.models import JobConfig

    try:
        return JobConfig.model_validate(config)
    except ValidationError as exc:
        problems = format_errors(exc)
    except ConfigError as exc:  # JobConfig formats its own errors in newer models
        problems = exc.problems
    raise ConfigError(["the imported config does not load: " + line for line in problems],
                      hint="edit the written config (or use a slurmfabric that has these "
                      "fields), then: slurmfabric render -c CONFIG.toml")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from slurmfabric._common.inputfile import read_text
    from slurmfabric._common.tomlwrite import dumps
    from slurmfabric.job.importer import Refused, import_script
    from slurmfabric.job.importer.shellwords import ShellSyntaxError

    text = read_text(args.script, "script", 4 << 20)
    try:
        result = import_script(text)
    except ShellSyntaxError as exc:
        raise UsageError(f"{args.script}: {exc}", hint="check the script with bash -n") from None
    except Refused as exc:
        raise UsageError(f"{args.script}: {exc}") from None
    from slurmfabric.job.importer.verdict import settle

    verdict = settle(result, args.script)
    toml = verdict.header(Path(args.script).name) + dumps(verdict.config)
    if args.output:
        Path(args.output).write_text(toml, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(toml)
    _print_notes(args.script, result.leftovers(), args.quiet)
    if verdict.todo:
        print(f"still to fix ({len(verdict.todo)}; listed at the top of the config, exit 1):",
              file=sys.stderr)
        for line in verdict.todo:
            print(f"  {line}", file=sys.stderr)
    if not args.check:
        return verdict.code
    report = _check(text, _validated(verdict.config), args.stand_ins)
    for line in report.added:
        print(f"check: note: {line}", file=sys.stderr)
    for line in report.differences:
        print(f"check: differs: {line}", file=sys.stderr)
    if report.same:
        print("check: the rendered script requests, launches and exports what the original "
              "does", file=sys.stderr)
        return verdict.code
    return 1


def _check(text: str, config: Any, stand_ins: bool) -> Any:
    """On the testbed when one runs (realcheck.py), else among stand-ins (check.py)."""
    from slurmfabric.job.importer import realcheck

    env = None if stand_ins else realcheck.testbed_env()
    if env is not None:
        print("check: running both scripts as batch jobs on the local testbed "
              f"({env['SLURM_CONF']}); programs are recording stand-ins", file=sys.stderr)
        return realcheck.check(text, config, env)
    from slurmfabric.job.importer.check import check

    why = "--stand-ins given" if stand_ins else "no testbed runs (slurmfabric testbed up)"
    print(f"check: {why}: both scripts run with bash among stand-ins, a weaker check: no "
          "real sbatch, srun or slurmstepd, one task per launcher, and what each task "
          "runs is not compared step by step", file=sys.stderr)
    return check(text, config)


def _print_notes(script: str, notes: list[Any], quiet: bool) -> None:
    for kind, heading in _HEADINGS.items():
        chosen = [n for n in notes if n.kind == kind]
        if not chosen or quiet and kind not in ("unmapped", "fixed"):
            continue
        print(f"{heading}:", file=sys.stderr)
        for note in chosen:
            where = f"{script}:{note.line}" if note.line else script
            print(f"  {where}: {note.text} -- {note.message}", file=sys.stderr)
