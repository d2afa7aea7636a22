"""Job configs: the model (``JobConfig``), its sources and ``load_config``.

The names load on first use (PEP 562), so importing the pydantic-free modules of this
package (vocabulary.py) from restart/ or a command does not load the model."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from slurmfabric.config.loader import SITE_DEFAULTS, load_config, site_defaults_path
    from slurmfabric.config.models import JobConfig
    from slurmfabric.config.vocabulary import LAUNCHERS

__all__ = ["LAUNCHERS", "SITE_DEFAULTS", "JobConfig", "load_config", "site_defaults_path"]

_HOMES = {"LAUNCHERS": "vocabulary", "SITE_DEFAULTS": "loader", "JobConfig": "models",
          "load_config": "loader", "site_defaults_path": "loader"}


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'slurmfabric.config' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"slurmfabric.config.{_HOMES[name]}"), name)
