"""Job configs: the model (``JobConfig``), its sources and ``load_config``."""

from __future__ import annotations

from slurmfabric.config.loader import SITE_DEFAULTS, load_config, site_defaults_path
from slurmfabric.config.models import LAUNCHERS, JobConfig

__all__ = ["LAUNCHERS", "SITE_DEFAULTS", "JobConfig", "load_config", "site_defaults_path"]
