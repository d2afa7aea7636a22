"""Real pyxis and enroot on the testbed: finding what ``scripts/build-containers.sh`` built,
and the files that load it (``plugstack.conf``, each virtual node's own enroot).

The build script installs pyxis (compiled against this machine's ``spank.h``), enroot and a
small Debian image with python3 under one directory per (pyxis, enroot, Slurm) version and
writes ``manifest.json`` there last. The testbed loads pyxis only when a manifest for the
installed Slurm is found, so ``testbed up`` works on a machine where nothing was built.
Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "SLURMFABRIC_CONTAINERS_CACHE"
DEFAULT_CACHE = Path("/var/cache/slurmfabric-testbed/containers")
MANIFEST = "manifest.json"
BUILD_HINT = "as root run: bash scripts/build-containers.sh"


@dataclass(frozen=True)
class Build:
    """One finished build: where its pieces are (the manifest's paths, relative to root)."""

    root: Path
    slurm: str
    pyxis: str
    enroot: str
    plugin: Path
    enroot_bin: Path
    image: Path

    def describe(self) -> str:
        return f"pyxis {self.pyxis} + enroot {self.enroot} from {self.root}"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def load_build(root: Path) -> Build | None:
    """The build whose manifest is in ``root``, or None when it is missing or unfinished."""
    try:
        data = json.loads((root / MANIFEST).read_text())
        build = Build(root=root, slurm=str(data["slurm"]), pyxis=str(data["pyxis"]),
                      enroot=str(data["enroot"]), plugin=root / data["plugin"],
                      enroot_bin=root / data["enroot_bin"], image=root / data["image"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (build.plugin.is_file() and (build.enroot_bin / "enroot").is_file()):
        return None
    return build


def find_build(slurm_version: str, root: Path | None = None) -> Build | None:
    """The finished build made against ``slurm_version`` (a plugin built for another Slurm is
    refused by slurmd: pyxis README), or None."""
    try:
        candidates = sorted(p.parent for p in (root or cache_root()).glob(f"*/{MANIFEST}"))
    except OSError:
        return None
    for candidate in candidates:
        build = load_build(candidate)
        if build is not None and build.slurm == slurm_version:
            return build
    return None


def node_enroot_dir(state_dir: Path, node: str) -> Path:
    return state_dir / "enroot" / node


def enroot_config_dir(state_dir: Path) -> Path:
    return state_dir / "enroot" / "config"


def render_plugstack(state_dir: Path, build: Build) -> str:
    """plugstack.conf (spank(8)): pyxis, its runtime directory in the state directory. Its
    default ``container_scope=global`` stays: with ``job``, pyxis's job epilog runs
    ``enroot list`` in the SPANK epilog process, whose PATH is /usr/local/bin:/usr/bin:/bin
    (pyxis_slurmd.c), not a node's own enroot, and the failed epilog drains the node. The
    named containers a job leaves are removed when the testbed starts afresh
    (``clear_containers``)."""
    return "\n".join([
        f"# Written by 'slurmfabric testbed up': {build.describe()} (scripts/build-containers.sh)",
        f"required {build.plugin} runtime_path={state_dir / 'pyxis'}",
    ]) + "\n"


def render_node_enroot(state_dir: Path, node: str, build: Build) -> str:
    """The ``enroot`` that node's slurmstepd finds first on its PATH. pyxis runs ``enroot``
    from PATH with the job's environment, ENROOT_*_PATH removed (pyxis_slurmstepd.c), and
    enroot lets a variable already set win over enroot.conf. The virtual nodes share one
    disk, so each gets its own containers, as real nodes have their own local disk."""
    d = node_enroot_dir(state_dir, node)
    # ENROOT_CONFIG_PATH: one for all nodes, as a site's config management gives every node
    # the same /etc/enroot; tests add mounts.d/*.fstab there (enroot doc/configuration.md).
    values = {"ENROOT_DATA_PATH": d / "data", "ENROOT_RUNTIME_PATH": d / "run",
              "ENROOT_CACHE_PATH": d / "cache", "ENROOT_TEMP_PATH": state_dir / "tmp" / node,
              "ENROOT_CONFIG_PATH": enroot_config_dir(state_dir)}
    return "\n".join([
        "#!/bin/sh",
        f"# Written by 'slurmfabric testbed up': node {node}'s own enroot directories.",
        *(f"export {name}='{path}'" for name, path in values.items()),
        f"exec '{build.enroot_bin / 'enroot'}' \"$@\"",
    ]) + "\n"


def clear_containers(state_dir: Path, nodes: list[str]) -> None:
    """Remove every node's enroot containers: slurmctld -c numbers jobs from 1 again, and
    a job-named container left by an earlier run (sf-<job id>) would be reused by pyxis."""
    for node in nodes:
        shutil.rmtree(node_enroot_dir(state_dir, node) / "data", ignore_errors=True)


def write_node_files(state_dir: Path, nodes: list[str], build: Build) -> dict[str, str]:
    """Write every node's enroot wrapper; return each node's PATH prefix for its slurmd."""
    prefixes = {}
    for node in nodes:
        d = node_enroot_dir(state_dir, node)
        (d / "bin").mkdir(parents=True, exist_ok=True)
        wrapper = d / "bin" / "enroot"
        wrapper.write_text(render_node_enroot(state_dir, node, build))
        wrapper.chmod(0o755)
        prefixes[node] = os.pathsep.join([str(d / "bin"), str(build.enroot_bin)])
    (state_dir / "pyxis").mkdir(exist_ok=True)
    (enroot_config_dir(state_dir) / "mounts.d").mkdir(parents=True, exist_ok=True)
    return prefixes
