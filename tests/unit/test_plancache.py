"""The per-boot plan cache (slurmfabric/rank/plancache.py) shared by env, launch and the
TaskProlog: a cached plan is the plan discovery would make, every change the fingerprint
covers makes the next rank discover again, and a damaged or untrusted entry is never used.
Fixture nodes: tests/fixtures/topology/real_nodes.py (real public dumps) and nodes.py."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import fakesysfs
import nodes
import pytest
import real_nodes
from cleanenv import clean_env

from slurmfabric._common import gids
from slurmfabric._common.sysfs import format_cpulist
from slurmfabric.rank import plancache
from slurmfabric.rank import task as taskenv

CPUS = sorted(os.sched_getaffinity(0))
STEP = {"SLURM_JOB_ID": "41", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_NODELIST": "gpu[1-2]",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[1-2]",
        "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16",
        "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu2", "SLURMFABRIC_ALLOW_LOOPBACK": "1"}
REAL = [name for name in dir(real_nodes)
        if not name.startswith("_") and callable(getattr(real_nodes, name))
        and getattr(getattr(real_nodes, name), "__module__", "") == "real_nodes"
        and name not in ("Path",)]


def env_for(root: Path, cache: Path, **extra: str) -> dict[str, str]:
    return {**STEP, "SLURMFABRIC_SYSFS_ROOT": str(root), "SLURMFABRIC_PLAN_CACHE": str(cache),
            **extra}


def build(env: dict[str, str], **options: object) -> taskenv.TaskEnv:
    return taskenv.build(env, strict=False, **options)


def printed(env: dict[str, str]) -> tuple[str, str]:
    """What 'slurmfabric launch --print' shows: (everything but its '# plan:' line, that)."""
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "launch", "--print", "--",
                           "true"], capture_output=True, text=True,
                          env=clean_env(**env, PYTHONPATH=os.pathsep.join(sys.path)))
    lines = proc.stdout.splitlines()
    return ("\n".join(line for line in lines if not line.startswith("# plan:")),
            "".join(line for line in lines if line.startswith("# plan:")))


def test_the_real_layout_fixtures_are_all_here() -> None:
    # a wrong filter would compare nothing below
    assert {"azure_ndv5", "oci_h100", "aws_p5", "gb200_tray", "dell_mi300x"} <= set(REAL)


@pytest.mark.parametrize("name", REAL)
def test_a_cached_plan_is_byte_identical_to_a_fresh_one(tmp_path: Path, name: str) -> None:
    root = fakesysfs.build(getattr(real_nodes, name)(), tmp_path / "root")
    env = env_for(root, tmp_path / "cache")
    fresh = build({**env, "SLURMFABRIC_PLAN_CACHE": "off"})
    first = build(env)
    cached = build(env)
    assert fresh.plan is not None, name
    assert (first.plan_origin, cached.plan_origin) == ("discovered", "cache")
    assert isinstance(cached.plan, plancache.CachedPlan)
    # repr, not marshal.dumps: marshal's bytes also carry reference flags (refcounts)
    view = repr(plancache.plan_view(fresh.plan)).encode()
    assert repr(plancache.plan_view(cached.plan)).encode() == view
    assert repr(plancache.plan_view(first.plan)).encode() == view
    assert cached.variables == fresh.variables and cached.kept == fresh.kept
    # every local rank's binding variables, SLURMFABRIC_CPUS from the cached cpulist text
    assert len(cached.plan.bindings) == len(fresh.plan.bindings)
    for mine, theirs in zip(cached.plan.bindings, fresh.plan.bindings):
        assert mine.cpulist == format_cpulist(list(theirs.cpus))
        assert taskenv.binding_env(mine, bound=True) == taskenv.binding_env(theirs, bound=True)
    for fmt in ("export", "json", "dotenv"):
        assert taskenv.render(cached.variables, cached.kept, fmt, cached.plan) == \
            taskenv.render(fresh.variables, fresh.kept, fmt, fresh.plan)
    shown, origin = printed(env)
    assert origin == "# plan: cache"
    assert shown == printed({**env, "SLURMFABRIC_PLAN_CACHE": "off"})[0]
    # a new step on the node: planned from the cached topology (snapshot round trip)
    other = {**env, "SLURM_STEP_NODELIST": "gpu[7-8]", "SLURM_JOB_NODELIST": "gpu[7-8]"}
    task = build(other)
    assert task.plan_origin == "planned from the cached topology"
    assert repr(plancache.plan_view(task.plan)) == repr(plancache.plan_view(
        build({**other, "SLURMFABRIC_PLAN_CACHE": "off"}).plan))


def test_launch_print_says_where_the_plan_came_from(tmp_path: Path) -> None:
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "root")
    env = env_for(root, tmp_path / "cache")
    assert [printed(env)[1] for _ in range(2)] == ["# plan: discovered", "# plan: cache"]
    assert printed({**env, "SLURMFABRIC_PLAN_CACHE": "off"})[1] == \
        "# plan: discovered; cache: off (SLURMFABRIC_PLAN_CACHE=off)"


@pytest.mark.parametrize("mode", ["srun", "mpi"])
def test_the_cached_path_imports_neither_discovery_nor_the_planner(tmp_path: Path,
                                                                   mode: str) -> None:
    """Nor re/json/hashlib/contextlib: an Open MPI rank (whose node rank comes from
    hostlist.index) as much as an srun task."""
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "root")
    env = clean_env(**env_for(root, tmp_path / "cache"), PYTHONPATH=os.pathsep.join(sys.path))
    if mode == "mpi":
        env.update(OMPI_COMM_WORLD_RANK="9", OMPI_COMM_WORLD_SIZE="16",
                   OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="8")
    probe = ("import sys\nfrom slurmfabric import cli\n"
             f"cli.main(['launch', '--mode', '{mode}', '--print', '--', 'true'])\n"
             "print(sorted(m for m in sys.modules if m.startswith(('slurmfabric.plan', "
             "'slurmfabric.topology', 'json', 're', 'hashlib', 'contextlib'))))\n")
    for expected in ("discovered", "cache"):
        proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                              text=True)
        assert f"# plan: {expected}\n" in proc.stdout, proc.stderr
    assert "export NODE_RANK=1\n" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "[]"  # the warm run


# --- every change the fingerprint covers: the next rank discovers again ------------------


@pytest.fixture
def ib(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "root")
    env = env_for(root, tmp_path / "cache")
    assert build(env).plan_origin == "discovered"
    assert build(env).plan_origin == "cache"
    return root, env


def again(env: dict[str, str]) -> taskenv.TaskEnv:
    """The next rank after a change: it must discover, and the one after it reads the new
    entry back."""
    task = build(env)
    assert task.plan_origin == "discovered"
    assert build(env).plan_origin == "cache"
    fresh = build({**env, "SLURMFABRIC_PLAN_CACHE": "off"})
    assert plancache.plan_view(task.plan) == plancache.plan_view(fresh.plan)
    return task


def port(root: Path, device: str, name: str) -> Path:
    return root / "sys" / "class" / "infiniband" / device / "ports" / "1" / name


def test_a_port_going_down(ib) -> None:
    root, env = ib
    port(root, "mlx5_1", "state").write_text("1: DOWN\n")
    port(root, "mlx5_1", "phys_state").write_text("3: Disabled\n")
    assert "mlx5_1:1" not in again(env).variables["NCCL_IB_HCA"]


def test_a_port_rate_change(ib) -> None:
    root, env = ib
    port(root, "mlx5_1", "rate").write_text("200 Gb/sec (4X HDR)\n")
    again(env)


def test_a_device_removed_and_added(ib) -> None:
    root, env = ib
    link = root / "sys" / "class" / "infiniband" / "mlx5_1"
    target = os.readlink(link)
    link.unlink()
    assert "mlx5_1:1" not in again(env).variables["NCCL_IB_HCA"]
    link.symlink_to(target)
    assert "mlx5_1:1" in again(env).variables["NCCL_IB_HCA"]


def test_a_gpu_unbound_from_its_driver(ib) -> None:
    root, env = ib
    (root / "sys" / "bus" / "pci" / "drivers" / "nvidia" / "0000:29:00.0").unlink()
    again(env)


def test_cpus_going_offline_and_an_address_change(ib) -> None:
    root, env = ib
    online = root / "sys" / "devices" / "system" / "cpu" / "online"
    online.write_text("0-55\n")
    again(env)
    trie = root / "proc" / "net" / "fib_trie"
    trie.write_text(trie.read_text() + "\n  |-- 10.9.9.9\n     /32 host LOCAL\n")
    again(env)


def test_a_plugin_or_peer_memory_module_appearing(ib) -> None:
    root, env = ib
    marker = root / "opt" / "hpcx" / "nccl_rdma_sharp_plugin" / "lib" / "libnccl-net.so"
    marker.parent.mkdir(parents=True)
    marker.write_text("")
    assert any("SHARP plugin" in note for note in again(env).plan.notes)


def test_the_fabric_type_and_the_users_overrides_are_part_of_the_key(ib) -> None:
    _, env = ib
    # a new key: planned again (from the node's cached topology: sysfs did not change)
    assert build(env, fabric_type="tcp").plan_origin == "planned from the cached topology"
    assert build(env, fabric_type="tcp").plan_origin == "cache"
    assert build(env, fabric_type="tcp").plan.fabric_type == "tcp"
    assert build(env).plan.fabric_type == "auto"  # each its own entry
    for name, value in (("NCCL_IB_HCA", "mlx5_0"), ("NCCL_IB_ADDR_RANGE", "10.0.0.0/8"),
                        ("SLURMFABRIC_ROCE_VLAN", "7"), ("CUDA_VISIBLE_DEVICES", "1,0"),
                        ("FI_PROVIDER", "efa")):
        assert build({**env, name: value}).plan_origin != "cache", name
    # per-rank values are not: every rank of the step shares the node's entry
    assert build({**env, "SLURM_PROCID": "10", "SLURM_LOCALID": "2"}).plan_origin == "cache"
    other = {**env, "SLURM_STEP_NODELIST": "gpu[7-8]", "SLURM_JOB_NODELIST": "gpu[7-8]"}
    assert build(other).plan_origin != "cache"  # another master address


def test_a_gid_change_on_a_roce_port(tmp_path: Path) -> None:
    root = fakesysfs.build(nodes.testbed_node(CPUS, "Ethernet"), tmp_path / "root")
    env = env_for(root, tmp_path / "cache", SLURM_STEP_TASKS_PER_NODE="2(x2)",
                  SLURM_STEP_NUM_TASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1")
    first = build(env)
    assert first.variables["NCCL_IB_GID_INDEX"] == "3"
    assert build(env).plan_origin == "cache"
    gid = port(root, "mlx5_0", "gids") / "3"
    gid.write_text("0000:0000:0000:0000:0000:ffff:0a0b:0c0d\n")
    again(env)
    (port(root, "mlx5_0", "gids") / "9").write_text(gid.read_text())  # a new address
    again(env)


def test_the_topology_entry_serves_a_new_step(ib) -> None:
    """A new job's first rank on the node (another master): the planner runs, discovery
    does not, and the plan is the one discovery would give."""
    _, env = ib
    other = {**env, "SLURM_STEP_NODELIST": "gpu[7-8]", "SLURM_JOB_NODELIST": "gpu[7-8]"}
    task = build(other)
    assert task.plan_origin == "planned from the cached topology"
    fresh = build({**other, "SLURMFABRIC_PLAN_CACHE": "off"})
    assert plancache.plan_view(task.plan) == plancache.plan_view(fresh.plan)
    assert build(other).plan_origin == "cache"


# --- faults: a damaged or untrusted entry is a miss, then rewritten ------------------------


def entries(env: dict[str, str]) -> list[Path]:
    return sorted(Path(env["SLURMFABRIC_PLAN_CACHE"]).glob("plan-*.marshal"))


def damaged_then_healed(env: dict[str, str]) -> None:
    task = build(env)
    assert task.plan_origin.startswith(("discovered", "planned"))
    fresh = build({**env, "SLURMFABRIC_PLAN_CACHE": "off"})
    assert task.variables == fresh.variables
    assert build(env).plan_origin == "cache"


@pytest.mark.parametrize("fault", ["corrupt", "truncated", "empty", "wrong types",
                                   "cpulist not text", "another key", "group-writable",
                                   "foreign owner", "symlink", "a directory"])
def test_a_damaged_or_untrusted_entry_falls_back_to_discovery(ib, tmp_path: Path,
                                                              fault: str) -> None:
    _, env = ib
    (entry,) = entries(env)
    data = entry.read_bytes()
    if fault == "corrupt":
        entry.write_bytes(bytes(b ^ 0x5A for b in data))
    elif fault == "truncated":
        entry.write_bytes(data[: len(data) // 2])
    elif fault == "empty":
        entry.write_bytes(b"")
    elif fault == "wrong types":
        value = marshal.loads(data)
        payload = dict(value[4], nccl_env={"NCCL_IB_HCA": 1})
        entry.write_bytes(marshal.dumps((*value[:4], payload)))
    elif fault == "cpulist not text":
        value = marshal.loads(data)
        bindings = [dict(b, cpulist=list(b["cpus"])) for b in value[4]["bindings"]]
        entry.write_bytes(marshal.dumps((*value[:4], dict(value[4], bindings=bindings))))
    elif fault == "another key":
        value = marshal.loads(data)
        entry.write_bytes(marshal.dumps((value[0], value[1] + "x", *value[2:])))
    elif fault == "group-writable":
        entry.chmod(0o664)
    elif fault == "foreign owner":
        if os.geteuid() != 0:
            pytest.skip("chown to another uid needs root")
        os.chown(entry, 4242, 4242)
    elif fault == "symlink":
        elsewhere = tmp_path / "elsewhere.marshal"
        elsewhere.write_bytes(data)
        entry.unlink()
        entry.symlink_to(elsewhere)
    elif fault == "a directory":
        entry.unlink()
        entry.mkdir()
    if fault == "a directory":
        # never loaded, never replaced by rename over a directory: discovery every time
        assert "; cache: not written: " in build(env).plan_origin
        return
    damaged_then_healed(env)
    (healed,) = entries(env)
    assert not healed.is_symlink() and healed.stat().st_uid == os.geteuid()
    assert healed.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("fault", ["symlinked directory", "world-writable directory",
                                   "foreign directory", "a file"])
def test_an_untrusted_cache_directory_is_not_used(tmp_path: Path, fault: str) -> None:
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "root")
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    cache = tmp_path / "cache"
    if fault == "symlinked directory":
        cache.symlink_to(real)
    elif fault == "world-writable directory":
        cache.mkdir()
        cache.chmod(0o777)
    elif fault == "foreign directory":
        if os.geteuid() != 0:
            pytest.skip("chown to another uid needs root")
        cache.mkdir(mode=0o700)
        os.chown(cache, 4242, 4242)
    else:
        cache.write_text("")
    env = env_for(root, cache)
    for _ in range(2):
        task = build(env)
        assert task.plan_origin.startswith("discovered; cache: "), task.plan_origin
        assert task.variables["NCCL_IB_HCA"].startswith("=mlx5_0:1")
    assert list(real.iterdir()) == []


def test_the_default_directory_is_private_and_per_user(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() == 0:
        assert plancache.default_dir({}) == "/run/slurmfabric"
        monkeypatch.setattr(os, "geteuid", lambda: 4242)
    uid = os.geteuid()
    assert plancache.default_dir({}) == f"/tmp/slurmfabric-{uid}"
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(runtime, uid, -1)
    assert plancache.default_dir({"XDG_RUNTIME_DIR": str(runtime)}) == f"{runtime}/slurmfabric"
    runtime.chmod(0o755)  # not the private runtime directory the XDG spec promises
    assert plancache.default_dir({"XDG_RUNTIME_DIR": str(runtime)}) == f"/tmp/slurmfabric-{uid}"


def test_a_cache_that_cannot_be_written_still_gives_the_plan(ib) -> None:
    _, env = ib
    cache = Path(env["SLURMFABRIC_PLAN_CACHE"])
    for entry in cache.iterdir():
        entry.unlink()
    cache.chmod(0o500)
    try:
        if os.geteuid() == 0:
            pytest.skip("root writes into a 0500 directory")
        task = build(env)
        assert task.plan_origin.startswith("discovered; cache: not written")
    finally:
        cache.chmod(0o700)


# --- the cache's copies of topology/ and plan/ names stay in step ------------------------


def test_the_copied_constants_match_their_owners() -> None:
    from slurmfabric import plan

    assert plancache.ROCE_VLAN_ENV == plan.ROCE_VLAN_ENV
    read = {c for const in plan.visible_gpus_from_env.__code__.co_consts
            if isinstance(const, tuple) for c in const
            if isinstance(c, str) and c.endswith(("_GPUS", "_DEVICES"))}
    assert read and read <= set(plancache.GPU_VISIBILITY)


def test_the_fingerprint_reads_every_gid_slot_discovery_reads(tmp_path: Path) -> None:
    """Pods see GIDs from slot 4 or 6 on (NVIDIA/nccl #1573): the walk must not stop early."""
    root = fakesysfs.build(nodes.pod_gids_from_6(), tmp_path / "root")
    before = plancache.fingerprint(str(root), ())
    ports = sorted((root / "sys" / "class" / "infiniband").glob("*/ports/*/gids"))
    assert ports
    slot = next(p / n for p in ports for n in sorted(os.listdir(p), key=int)
                if (p / n).read_text().strip() not in ("", gids.ZERO_GID))
    slot.write_text("fe80:0000:0000:0000:0000:0000:0000:0099\n")
    assert plancache.fingerprint(str(root), ()) != before


def test_discovery_and_the_fingerprint_walk_the_same_slots(tmp_path: Path) -> None:
    """One walk (_common/gids.py) serves both: a GID after 15 empty slots is read by both
    (a change there is a new key, and discovery sees it), one after 16 by neither."""
    from slurmfabric.topology import discover

    root = fakesysfs.build(nodes.pod_gids_from_6(), tmp_path / "root")
    port = sorted((root / "sys" / "class" / "infiniband").glob("*/ports/*"))[0]
    top = max(int(n) for n in os.listdir(port / "gids")
              if (port / "gids" / n).read_text().strip() not in ("", gids.ZERO_GID))
    for n in range(top + 1, top + 40):  # the rest of a real 255-slot table, empty
        (port / "gids" / str(n)).write_text(gids.ZERO_GID + "\n")
    seen = top + gids.EMPTY_RUN  # after 15 empty slots: still read
    unseen = seen + 1  # after 16 empty slots: the walk has stopped
    value = "0000:0000:0000:0000:0000:ffff:0a00:00%02x"

    def state() -> tuple[object, set[int]]:
        topo = discover(str(root))
        dev, num = port.parts[-3], int(port.name)
        found = {g.index for d in topo.rdma if d.name == dev for p in d.ports
                 if p.port == num for g in p.gids}
        return plancache.fingerprint(str(root), ()), found

    before, found = state()
    (port / "gids" / str(unseen)).write_text(value % 1 + "\n")
    after, found_after = state()
    assert after == before and found_after == found and unseen not in found_after
    (port / "gids" / str(seen)).write_text(value % 2 + "\n")
    after, found_after = state()
    assert after != before and seen in found_after


def test_edited_planner_code_is_another_key(tmp_path: Path) -> None:
    """An editable checkout changed at the same version never reads what the old code wrote."""
    for sub in ("plan", "topology", "_common"):
        (tmp_path / sub).mkdir()
    for path in ("plan/a.py", "topology/a.py", "_common/sysfs.py"):
        (tmp_path / path).write_text("")
        os.utime(tmp_path / path, ns=(1, 1))
    before = plancache._code_stamp(str(tmp_path))
    assert before == plancache._code_stamp(str(tmp_path))
    assert "unreadable" not in before
    # the cached plan carries format_cpulist's text: editing it is another key too
    for step, path in enumerate(("_common/sysfs.py", "topology/a.py"), start=2):
        os.utime(tmp_path / path, ns=(step * 10**18, step * 10**18))
        after = plancache._code_stamp(str(tmp_path))
        assert after != before, path
        before = after


def test_a_bond_losing_a_slave(tmp_path: Path) -> None:
    root = fakesysfs.build(real_nodes.lag_b300(), tmp_path / "root")
    env = env_for(root, tmp_path / "cache")
    assert build(env).plan_origin == "discovered" and build(env).plan_origin == "cache"
    slaves = sorted((root / "sys" / "class" / "net").glob("*/bonding/slaves"))
    assert slaves
    first = slaves[0].read_text().split()
    slaves[0].write_text(" ".join(first[:-1]) + "\n")
    again(env)
    masters = root / "sys" / "class" / "net" / "bonding_masters"  # as the bonding driver has it
    masters.write_text(" ".join(p.parent.parent.name for p in slaves) + "\n")
    assert build(env).plan_origin == "discovered" and build(env).plan_origin == "cache"
    slaves[0].write_text(" ".join(first) + "\n")
    again(env)


def test_a_library_caller_s_own_setting_places_the_cache(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """taskenv.build(environ) describes a task by a dict; where to cache is this process's
    business: SLURMFABRIC_PLAN_CACHE from os.environ when the dict has none."""
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "root")
    monkeypatch.setenv("SLURMFABRIC_PLAN_CACHE", str(tmp_path / "mine"))
    env = {**STEP, "SLURMFABRIC_SYSFS_ROOT": str(root)}
    assert build(env).plan_origin == "discovered" and build(env).plan_origin == "cache"
    assert len(list((tmp_path / "mine").glob("plan-*.marshal"))) == 1
    off = build({**env, "SLURMFABRIC_PLAN_CACHE": "off"})  # the task's own setting wins
    assert off.plan_origin == "discovered; cache: off (SLURMFABRIC_PLAN_CACHE=off)"


def test_ranks_starting_together_wait_for_the_first_ones_discovery(tmp_path: Path) -> None:
    """srun starts a node's ranks at once: while one holds the entry's lock (discovering),
    another waits for it and then reads the entry it wrote instead of discovering too."""
    from slurmfabric.topology import discover

    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "root")
    env = env_for(root, tmp_path / "cache")
    rank_env = taskenv.resolve({"mode": "auto"}, env)
    inputs = plancache.plan_inputs(env, 8, rank_env.master_addr, "auto", "gpu2")
    cache = plancache.open_cache(env)
    held = plancache.lock(cache, str(root), inputs)
    assert held is not None
    probe = ("from slurmfabric.rank import task\nimport os\n"
             "print(task.build(dict(os.environ), strict=False).plan_origin)\n")
    other = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True,
                             env=clean_env(**env, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            other.wait(timeout=1.0)  # waiting for the lock, not discovering
        before = plancache.prepare(str(root), env)
        fresh = build({**env, "SLURMFABRIC_PLAN_CACHE": "off"})
        assert plancache.store(cache, str(root), env, inputs, before,
                               discover(str(root), plan_only=True, environ=env),
                               fresh.plan) == ""
    finally:
        plancache.unlock(held)
        cache.close()
    out, _ = other.communicate(timeout=60)
    assert out.strip() == "cache"
