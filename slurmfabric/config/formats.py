"""The formats a config field accepts (Slurm's, the launchers'), shared by the sections.

Each check returns the reason a value is refused, or raises ``ValueError`` with it, in one
line that says what is accepted; the sections attach them to their fields.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

NCCL_TESTS_OPS = (
    "all_reduce", "all_gather", "alltoall", "broadcast", "gather", "hypercube",
    "reduce", "reduce_scatter", "scatter", "sendrecv",
)

# Signals worth sending before the time limit (sbatch --signal); names without "SIG".
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "URG")

# sbatch --time forms (sbatch(1)): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, plus unlimited.
TIME = re.compile(r"^(\d+|\d+:\d+|\d+:\d+:\d+|\d+-\d+|\d+-\d+:\d+|\d+-\d+:\d+:\d+)\Z")
TIME_FORMS = "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, " \
    "DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS or UNLIMITED"
# Conservative job names: safe in every #SBATCH parser, squeue column and file name.
JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+\-=@:]{0,127}\Z")
# nccl-tests' own size arguments (-b/-e): a number with K, M or G.
SIZE = re.compile(r"^\d+[KMGT]?\Z")
# Slurm's memory sizes (sbatch(1) --mem, --mem-per-cpu, --mem-per-gpu): digits, then an
# optional K, M, G or T in either case, which may itself be followed by b or B; no suffix
# means megabytes (str_to_mbytes() in src/common/proc_args.c, SchedMD/slurm@016994e).
SLURM_MEM = re.compile(r"^\d+(?:[KMGTkmgt][bB]?)?\Z")
_MEM_FACTOR = {"": 1, "k": 1, "m": 1, "g": 1024, "t": 1024 * 1024}
# GPU type names as gres.conf writes them (Type=a100, Type=h100_80gb); no ':' or ','.
GPU_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}\Z")
GPU_REQUESTS = ("gpus-per-node", "gres", "gpus-per-task", "none")
HINTS = ("compute_bound", "memory_bound", "multithread", "nomultithread")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# #SBATCH values: sbatch and pyslurm split these lines on whitespace and cut at '#', so a
# value must be one plain word.
SBATCH_WORD = re.compile(r"^[^\s'\"#\\`$]+\Z")


def sbatch_word(value: Optional[str], what: str) -> Optional[str]:
    if value is not None and not SBATCH_WORD.match(value):
        raise ValueError(
            f"{what} {value!r} goes into an #SBATCH line and must be one word without "
            "spaces, quotes, '#', '\\', '`' or '$'"
        )
    return value


def slurm_mbytes(value: str) -> int:
    """A Slurm memory size in megabytes, as str_to_mbytes() reads it (K rounds up)."""
    match = re.match(r"^(\d+)([KMGTkmgt]?)", value)
    if not SLURM_MEM.match(value) or match is None:
        raise ValueError(f"{value!r} is not a Slurm memory size")
    number, unit = int(match.group(1)), match.group(2).lower()
    return (number + 1023) // 1024 if unit == "k" else number * _MEM_FACTOR[unit]


def distribution_problem(value: str) -> Optional[str]:
    """Why Slurm's verify_dist_type() would refuse ``value`` (sbatch(1) --distribution), or
    None. Its words compare case-insensitively; plane=N stands alone."""
    if value[:5].lower() == "plane":
        size = value[6:] if value[5:6] == "=" else ""
        return None if size.isdigit() and 0 < int(size) <= 2**31 - 1 else \
            "plane needs its size: plane=N with N >= 1"
    base, _, flag = value.partition(",")
    words = base.lower().split(":")
    if flag and flag.lower() not in ("pack", "nopack"):
        return f"{flag!r} after ',' is not Pack or NoPack"
    if len(words) == 1 and words[0] in ("arbitrary", "hostfile", "pack", "nopack"):
        return None if not flag or words[0] not in ("pack", "nopack") else "one flag only"
    if len(words) > 3 or words[0] not in ("*", "block", "cyclic") or not all(
            word in ("*", "block", "cyclic", "fcyclic") for word in words[1:]):
        return "not a node[:socket[:core]] distribution"
    return None


def program_problem(value: str, field: str) -> Optional[str]:
    """Why ``value`` cannot be a helper program (launcher.slurmfabric, torchrun, mpirun)."""
    if not value or value.startswith("-") or "\n" in value or "\x00" in value:
        return (f"{field} {value!r} is not a command: give a path or a command name "
                "(not empty, not starting with '-', one line)")
    return None


class Section(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def refuse(problem: Optional[str]) -> None:
    """Raise a check's reason (None: the value passes) as the field's error."""
    if problem:
        raise ValueError(problem)


def matching(pattern: re.Pattern[str], message: str) -> Callable[[Optional[str]], Optional[str]]:
    """A field check that refuses a set value ``pattern`` does not match, with ``message``
    (``{value!r}`` in it stands for the value)."""
    def check(value: Optional[str]) -> Optional[str]:
        if value is not None and not pattern.match(value):
            raise ValueError(message.format(value=value))
        return value
    return check


def signal_name(value: str) -> str:
    """A signal as the config stores it (``SIGUSR2`` and ``usr2`` -> ``USR2``), or the reason
    it is refused."""
    name = value.upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise ValueError(f"signal {value!r} is not accepted: choose from {', '.join(SIGNALS)}")
    return name


def image_word(value: Optional[str]) -> Optional[str]:
    """A container image reference: one non-empty word (pyxis, apptainer and pods alike)."""
    if value is not None and (not value or any(c.isspace() for c in value)):
        raise ValueError(f"container image {value!r} must be one non-empty word")
    return value


def texts(value: Any, booleans: bool = True) -> Any:
    """A TOML table's numbers (and booleans, as ``true``/``false``) as the text they stand
    for: ``OMP_NUM_THREADS = 4`` means the string "4"."""
    if not isinstance(value, dict):
        return value
    return {k: (str(v).lower() if isinstance(v, bool) and booleans else str(v))
            if isinstance(v, (int, float)) else v for k, v in value.items()}


def time_limit_seconds(value: Optional[str]) -> Optional[int]:
    """A Slurm time limit (sbatch(1) --time forms) in seconds; None when unset/unlimited."""
    if value is None or value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = value.rpartition("-") if "-" in value else ("", "", value)
    parts = [int(part) for part in rest.split(":")]
    if days:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:
        return parts[0] * 60  # M
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]  # M:S
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]  # H:M:S
