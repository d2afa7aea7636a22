"""slurmfabric: multi-node GPU training on Slurm that starts right and fails loudly.

This module is the stable Python API: the names in ``_LAZY`` stay here when files move
(``import slurmfabric; slurmfabric.render_sbatch(...)``); module paths below it may change.
The top-level package stays import-light: the per-rank and prolog paths import it, so
nothing heavy (pydantic, jinja2, psutil) may be imported here. Each name is imported on
first access through ``__getattr__`` (PEP 562).

Where each concern lives: job/ (launch: options, render, submit, follow, Kubernetes),
rank/ (run: each rank's environment), topology/ and plan/ (the node and its NCCL plan),
health/ (prolog and epilog checks), nccl/, pairsweep/, ibaudit/, roce/, whatif/ (guard and
validation), restart/ (jobs that survive failures), progress/ (heartbeats, hang and
straggler detection, stack diagnosis of a running job), site/ (cluster-wide hooks), slurm/ (the
Slurm command layer), config/, testbed/, commands/ (the CLI: parse and print only).
"""

from __future__ import annotations

__version__ = "0.1.0"

# name -> "module:attribute", imported on first access (PEP 562).
_LAZY = {
    "render_sbatch": "slurmfabric.job.render:render_sbatch",
    "render_sbatch_header": "slurmfabric.job.render:render_sbatch_header",
    "render_env_block": "slurmfabric.job.render:render_env_block",
    "render_launch": "slurmfabric.job.render:render_launch",
    "load_config": "slurmfabric.config:load_config",
    "JobConfig": "slurmfabric.config:JobConfig",
    "submit_job": "slurmfabric.job.follow:submit_job",
    "Job": "slurmfabric.job.follow:Job",
    "sbatch": "slurmfabric.slurm.cmd:sbatch",
    "discover": "slurmfabric.topology:discover",
    "make_plan": "slurmfabric.plan:make_plan",
    "task_env": "slurmfabric.rank.task:build",
    "Checkpoints": "slurmfabric.restart:Checkpoints",
    "save_requested": "slurmfabric.restart:save_requested",
    "restart_count": "slurmfabric.restart:restart_count",
    "heartbeat": "slurmfabric.progress:step",
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
