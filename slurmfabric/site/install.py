"""``slurmfabric site install DIR``: the TaskProlog script and cli_filter.lua, and the
slurm.conf lines that turn them on (printed, never edited: slurm.conf is the admin's)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from slurmfabric._common.files import write_atomic
from slurmfabric.errors import UsageError

TASKPROLOG = "slurmfabric-taskprolog"
_PYTHON_LINE = "SLURMFABRIC_PYTHON=/usr/bin/python3"
_EXEC_LINE = "sys.exit(taskprolog_main(sys.argv[1:]))'"
# What the installed script imports, run once at install time with the same -I.
_IMPORT_CHECK = ("from slurmfabric.commands.site import taskprolog_main; "
                 "print('slurmfabric-ok')")


@dataclass
class Installed:
    files: list[Path] = field(default_factory=list)
    conf_lines: list[str] = field(default_factory=list)


def template() -> str:
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "taskprolog" / TASKPROLOG,  # source checkout
                      here.parents[1] / "hooks" / "taskprolog" / TASKPROLOG):  # wheel
        if candidate.exists():
            return candidate.read_text()
    raise FileNotFoundError(f"{TASKPROLOG} template not found next to the package")


def check_python(python: str) -> None:
    """Prove ``python`` imports slurmfabric's TaskProlog the way the script runs it (-I).

    The script fails open, so a wrong interpreter would not stop a job: it would silently
    give no job the plan. Refusing it here, once, is where the admin sees it.
    """
    from slurmfabric._common.executable import probe

    proc = probe("--python", python, ["-I", "-B", "-c", _IMPORT_CHECK],
                 "slurmstepd runs the TaskProlog with no PATH",
                 "give the interpreter slurmfabric is installed in on the nodes")
    if proc.returncode != 0 or proc.stdout.strip() != "slurmfabric-ok":
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise UsageError(f"--python {python}: cannot run slurmfabric's TaskProlog "
                         f"({why[:200]})",
                         hint="point --python at the interpreter slurmfabric is installed in")


def taskprolog_script(python: str, sysfs_root: str | None = None,
                      fabric_type: str | None = None) -> str:
    from slurmfabric._common.textcheck import shell_word

    if not os.path.isabs(python):
        raise UsageError(f"--python {python!r} must be an absolute path",
                         hint="slurmstepd runs the TaskProlog with no PATH")
    args = []
    if sysfs_root:
        args += ["--sysfs-root", sysfs_root]
    if fabric_type:
        from slurmfabric.plan.contract import check_type

        args += ["--fabric-type", check_type(fabric_type)]
    text = template()
    if _PYTHON_LINE not in text or _EXEC_LINE not in text:
        raise FileNotFoundError(f"{TASKPROLOG} template lacks its install lines")
    text = text.replace(_PYTHON_LINE, f"SLURMFABRIC_PYTHON={shell_word(python)}")
    return text.replace(_EXEC_LINE, " ".join([_EXEC_LINE, *map(shell_word, args)]))


def install(dest: str, python: str, config: str | None = None,
            sysfs_root: str | None = None, fabric_type: str | None = None) -> Installed:
    """Everything is checked before anything is written: a bad config writes nothing."""
    from slurmfabric.site import clifilter

    script = taskprolog_script(python, sysfs_root, fabric_type)
    check_python(python)
    lua = clifilter.render(clifilter.load(config)) if config else None
    out = Installed()
    directory = Path(dest)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / TASKPROLOG, script, 0o755)
    out.files.append(directory / TASKPROLOG)
    out.conf_lines.append(f"TaskProlog={(directory / TASKPROLOG).resolve()}")
    if lua is not None:
        write_atomic(directory / "cli_filter.lua", lua, 0o644)
        out.files.append(directory / "cli_filter.lua")
        out.conf_lines += [
            "CliFilterPlugins=cli_filter/lua",
            f"# and copy {(directory / 'cli_filter.lua').resolve()} into the directory of "
            "slurm.conf on every login and compute node (sbatch, salloc and srun read it "
            "from there)",
        ]
    return out
