"""slurmfabric: multi-node GPU training on Slurm that starts right and fails loudly.

The top-level package stays import-light: the per-rank and prolog paths import it, so
nothing heavy (pydantic, jinja2, psutil) may be imported here. Heavy public functions are
re-exported lazily through ``__getattr__``.
"""

from __future__ import annotations

__version__ = "0.1.0"

# name -> "module:attribute", imported on first access (PEP 562).
_LAZY = {
    "render_sbatch": "slurmfabric.render:render_sbatch",
    "render_env_block": "slurmfabric.render:render_env_block",
    "render_launch": "slurmfabric.render:render_launch",
    "load_config": "slurmfabric.config:load_config",
    "JobConfig": "slurmfabric.config:JobConfig",
    "submit_job": "slurmfabric.jobs:submit_job",
    "Job": "slurmfabric.jobs:Job",
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'slurmfabric' has no attribute {name!r}")
    import importlib

    module_name, attr = target.split(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


__all__ = ["__version__", *_LAZY]
