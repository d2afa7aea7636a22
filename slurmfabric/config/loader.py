"""``load_config``: merge the sources in one fixed order and turn pydantic's errors into
one line per problem that names the field and what is accepted."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional, Union

from pydantic import ValidationError

from slurmfabric.config.models import JobConfig
from slurmfabric.config.report import CONFIG_HINT
from slurmfabric.config.report import format_errors as _format_errors
from slurmfabric.config.sources import file_sources, parse_set
from slurmfabric.errors import ConfigError

SITE_DEFAULTS = Path("/etc/slurmfabric/defaults.toml")
SITE_DEFAULTS_ENV = "SLURMFABRIC_SITE_DEFAULTS"

PathLike = Union[str, "os.PathLike[str]"]


def site_defaults_path(explicit: Optional[PathLike] = None,
                       environment: bool = True) -> Optional[Path]:
    """The site defaults file: ``--site-defaults``, else $SLURMFABRIC_SITE_DEFAULTS (when the
    environment is a source), else /etc/slurmfabric/defaults.toml when it exists. A file
    named explicitly must exist; an empty value switches site defaults off."""
    if explicit is not None:
        return Path(explicit) if str(explicit) else None
    from_env = os.environ.get(SITE_DEFAULTS_ENV) if environment else None
    if from_env is not None:
        return Path(from_env) if from_env else None
    return SITE_DEFAULTS if SITE_DEFAULTS.is_file() else None


def load_config(
    path: Optional[PathLike] = None,
    sets: Sequence[str] = (),
    site_defaults: Optional[PathLike] = None,
    *,
    data: Optional[dict[str, Any]] = None,
    environment: bool = False,
) -> JobConfig:
    """Build a JobConfig. Highest first: ``sets`` (``key=value``), the SLURMFABRIC_*
    environment (``SLURMFABRIC_JOB__NODES=2``; only with ``environment=True``, as the CLI
    does), the TOML file ``path`` or the in-memory table ``data`` (shaped like the file),
    the site defaults, defaults.

    Raises ConfigError with one line per problem (the CLI exits 2 with them), for a table
    exactly as for a file.
    """
    if path is not None and data is not None:
        raise ConfigError(["load_config: give the config as a file (path) or as a table "
                           "(data), not both"])
    overrides = parse_set(sets)
    sources: list[Any] = [Path(path)] if path is not None else []
    sources += [data] if data is not None else []
    site = site_defaults_path(site_defaults, environment)
    sources += [site] if site is not None else []
    try:
        with file_sources(sources, environment):
            return JobConfig(**overrides)
    except ValidationError as exc:  # raised outside JobConfig.__init__ (a source's own)
        raise ConfigError(format_errors(exc), hint=CONFIG_HINT) from None


def format_errors(exc: ValidationError) -> list[str]:
    """A JobConfig's validation errors, one line per problem (config/report.py)."""
    return _format_errors(exc, JobConfig)
