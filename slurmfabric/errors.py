"""One small error hierarchy; every message names the input and, where known, the fix.

The CLI prints ``str(error)`` as one line (plus a ``HINT:`` line when there is a hint) and
exits with ``error.exit_code``; it never shows a traceback for these.
"""

from __future__ import annotations


class SlurmfabricError(Exception):
    """Base class: an expected failure with a message meant for the user."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(SlurmfabricError):
    """Bad command line or bad input value: exit code 2, like argparse."""

    exit_code = 2


class ConfigError(UsageError):
    """An invalid job or site config. ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str], hint: str | None = None) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems), hint)


class SlurmCommandError(SlurmfabricError):
    """A Slurm command failed; the message quotes its own error text verbatim."""


class SubmitError(SlurmCommandError):
    """sbatch (or pyslurm) refused the job."""


class TopologyError(SlurmfabricError):
    """Discovery could not make sense of the node."""


class SnapshotError(UsageError, TopologyError):
    """A topology snapshot file the user named is missing or is not one: bad input (exit 2),
    still a TopologyError for callers that catch discovery failures."""


class RankEnvError(SlurmfabricError):
    """A Slurm variable needed for the rank environment is missing or inconsistent."""


class HealthError(SlurmfabricError):
    """The health checker itself failed (not a failing node)."""
