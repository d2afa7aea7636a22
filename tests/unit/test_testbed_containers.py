"""The testbed's pyxis files (slurmfabric/testbed/containers.py): which build it loads, the
plugstack.conf line, and each virtual node's own enroot directories. The real plugin and
enroot run in tests/cluster/test_containers_cluster.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from slurmfabric.testbed import Settings, containers, render_slurm_conf


def fake_build(root: Path, slurm: str, manifest: bool = True) -> Path:
    """A build directory laid out as scripts/build-containers.sh leaves it; its enroot prints
    the enroot variables it got and its arguments (a stand-in binary, not the real enroot)."""
    (root / "pyxis").mkdir(parents=True)
    (root / "pyxis" / "spank_pyxis.so").write_bytes(b"\x7fELF")
    (root / "enroot" / "bin").mkdir(parents=True)
    enroot = root / "enroot" / "bin" / "enroot"
    enroot.write_text('#!/bin/sh\nenv | grep ^ENROOT_ | sort\necho "args: $*"\n')
    enroot.chmod(0o755)
    if manifest:
        (root / containers.MANIFEST).write_text(json.dumps({
            "slurm": slurm, "pyxis": "0.24.0", "enroot": "4.1.2",
            "plugin": "pyxis/spank_pyxis.so", "enroot_bin": "enroot/bin",
            "image": "images/debian-python3.sqsh"}))
    return root


def test_the_build_for_the_running_slurm_is_found_and_no_other(tmp_path: Path) -> None:
    fake_build(tmp_path / "a-24", "24.11.5")
    fake_build(tmp_path / "b-22", "22.5.8")
    fake_build(tmp_path / "c-22-unfinished", "22.5.8", manifest=False)
    found = containers.find_build("22.5.8", tmp_path)
    assert found is not None and found.root == tmp_path / "b-22"
    assert found.plugin == tmp_path / "b-22" / "pyxis" / "spank_pyxis.so"
    assert containers.find_build("23.2.1", tmp_path) is None  # slurmd refuses other releases
    assert containers.find_build("22.5.8", tmp_path / "absent") is None
    (tmp_path / "b-22" / "pyxis" / "spank_pyxis.so").unlink()  # a manifest without its plugin
    assert containers.find_build("22.5.8", tmp_path) is None


def test_slurm_conf_names_plugstack_only_with_pyxis(tmp_path: Path) -> None:
    assert "PlugStackConfig" not in render_slurm_conf(Settings(state_dir=tmp_path))
    conf = render_slurm_conf(Settings(state_dir=tmp_path, pyxis="/cache/build"))
    assert f"PlugStackConfig={tmp_path}/etc/plugstack.conf" in conf.splitlines()


def test_plugstack_loads_pyxis_with_its_runtime_in_the_state_dir(tmp_path: Path) -> None:
    build = containers.load_build(fake_build(tmp_path / "build", "22.5.8"))
    assert build is not None
    lines = containers.render_plugstack(tmp_path / "state", build).splitlines()
    assert lines[0].startswith("#")
    # spank(8): 'required' fails the step when the plugin cannot load; pyxis options follow
    assert lines[1] == f"required {build.plugin} runtime_path={tmp_path}/state/pyxis"


def test_each_node_runs_enroot_on_its_own_directories(tmp_path: Path) -> None:
    """pyxis runs 'enroot' from PATH with ENROOT_*_PATH taken out of the job's environment:
    the node's wrapper sets them, so two virtual nodes never share a container."""
    build = containers.load_build(fake_build(tmp_path / "build", "22.5.8"))
    assert build is not None
    state = tmp_path / "state"
    state.mkdir()
    paths = containers.write_node_files(state, ["n1", "n2"], build)
    outputs = {}
    for node in ("n1", "n2"):
        first = paths[node].split(":")[0]
        assert paths[node].split(":")[1] == str(build.enroot_bin)  # enroot's helpers
        out = subprocess.run([f"{first}/enroot", "start", "pyxis_7_sf-7", "it's"],
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        outputs[node] = out.stdout
    assert f"ENROOT_DATA_PATH={state}/enroot/n1/data" in outputs["n1"]
    assert f"ENROOT_DATA_PATH={state}/enroot/n2/data" in outputs["n2"]
    assert f"ENROOT_RUNTIME_PATH={state}/enroot/n2/run" in outputs["n2"]
    assert f"ENROOT_TEMP_PATH={state}/tmp/n2" in outputs["n2"]
    # one site configuration (mounts.d) for every node
    assert f"ENROOT_CONFIG_PATH={state}/enroot/config" in outputs["n1"]
    assert f"ENROOT_CONFIG_PATH={state}/enroot/config" in outputs["n2"]
    assert outputs["n1"].splitlines()[-1] == "args: start pyxis_7_sf-7 it's"  # argv untouched


def test_a_fresh_start_clears_every_nodes_containers(tmp_path: Path) -> None:
    """Job ids start from 1 again after slurmctld -c: a container named for an earlier run's
    job would be reused by pyxis, so a fresh testbed starts with none."""
    for node in ("n1", "n2"):
        (containers.node_enroot_dir(tmp_path, node) / "data" / "pyxis_sf-3" / "etc").mkdir(
            parents=True)
    (containers.node_enroot_dir(tmp_path, "n1") / "bin").mkdir()
    containers.clear_containers(tmp_path, ["n1", "n2"])
    assert not list(tmp_path.glob("enroot/*/data"))
    assert (containers.node_enroot_dir(tmp_path, "n1") / "bin").is_dir()  # the rest stays
