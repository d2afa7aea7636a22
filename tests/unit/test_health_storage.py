"""The data-mount read check (health/checks/storage.py) on real reads from this machine's
disk, slowed by the kernel's own block throttle.

The slow mount stand-in: the prolog runs in a blkio cgroup (cgroup v1
``blkio.throttle.read_bps_device``, or v2 ``io.max rbps``; Documentation/admin-guide/
cgroup-v1/blkio-controller.rst and cgroup-v2.rst) that limits reads from the disk
under the probe file. The reads are real reads through the block layer, limited where a
slow NFS server or a congested storage link would limit them, and the page cache is
real: a file read just before is still in memory, so a reader that did not drop its
region (``POSIX_FADV_DONTNEED``) would pass at memory speed. Needs root (CI runs as root:
scripts/test.sh); no skip without it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import fake_slurm, slurm_nodes

from slurmfabric.health import siteconfig
from slurmfabric.health.checks import storage
from slurmfabric.health.hookscript import EXIT_NODE_BAD
from slurmfabric.health.model import ERROR, FAIL, OK

NODE = "gpu007"
MB = 1_000_000


def _block_device(path: Path) -> str:
    """MAJ:MIN of the whole disk under ``path`` (blk-throttle limits disks, not
    partitions: a partition's sysfs entry has a ``partition`` file, its parent the disk)."""
    dev = os.stat(path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not sysfs.exists():
        pytest.fail(f"{path} is on {os.major(dev)}:{os.minor(dev)}, not a block device: "
                    "the throttle needs a disk-backed directory")
    if (sysfs / "partition").exists():
        return (sysfs.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


class Throttle:
    """A cgroup whose reads from one disk are limited to ``rate`` bytes/s."""

    def __init__(self, device: str, name: str) -> None:
        v1 = Path("/sys/fs/cgroup/blkio")
        v2 = Path("/sys/fs/cgroup")
        if (v1 / "blkio.throttle.read_bps_device").exists():
            self.dir, self.key = v1 / name, "blkio.throttle.read_bps_device"
            self.line = device + " {rate}"
        elif (v2 / "cgroup.controllers").exists():
            (v2 / "cgroup.subtree_control").write_text("+io")
            self.dir, self.key, self.line = v2 / name, "io.max", device + " rbps={rate}"
        else:
            pytest.fail("no blkio (cgroup v1) or io (cgroup v2) controller: the slow-mount "
                        "stand-in needs one (run as root on Linux)")
        self.dir.mkdir(exist_ok=True)

    def set(self, rate: int) -> None:
        (self.dir / self.key).write_text(self.line.format(rate=rate) + "\n")

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cgroup (its children stay in it)."""
        return ["sh", "-c", f'echo $$ > {self.dir}/cgroup.procs && exec "$@"', "sh", *argv]

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.dir.rmdir()
                return
            except OSError:
                time.sleep(0.1)


@pytest.fixture
def probe_file(tmp_path: Path):
    """A root-owned 24 MB probe file of random bytes on a real disk, flushed to it."""
    for base in (tmp_path, Path("/var/tmp")):
        if Path(f"/sys/dev/block/{os.major(os.stat(base).st_dev)}:"
                f"{os.minor(os.stat(base).st_dev)}").exists():
            break
    here = Path(base) / f"sf-storage-{os.getpid()}-{time.monotonic_ns()}"
    here.mkdir()
    path = here / "probe.bin"
    with open(path, "wb") as handle:
        handle.write(os.urandom(24 * MB))
        handle.flush()
        os.fsync(handle.fileno())
    path.chmod(0o644)
    yield path
    path.unlink(missing_ok=True)
    for leftover in here.iterdir():
        leftover.unlink()
    here.rmdir()


@pytest.fixture
def throttle(probe_file: Path):
    t = Throttle(_block_device(probe_file), f"sf-storage-test-{os.getpid()}")
    yield t
    t.remove()


def mount_of(path: Path) -> str:
    while not os.path.ismount(path):
        path = path.parent
    return str(path)


def config(tmp_path: Path, mounts: list[dict], probe_timeout: float = 6.0) -> Path:
    state = tmp_path / "state"
    body = ",\n  ".join("{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in m.items()) + " }"
                        for m in mounts)
    text = (f'[runner]\nstate_dir = "{state}"\nlog_file = "{state}/health.log"\n'
            f"syslog = false\nprobe_timeout_s = {probe_timeout}\nbudget_s = 15\n"
            "drain_retry_s = 0.05\n\n"
            f"[[nodes]]\ngpus = 0\nrdma_ports = 0\ndata_mounts = [\n  {body}\n]\n")
    path = tmp_path / "health.toml"
    path.write_text(text)
    return path


def prolog(tmp_path: Path, cfg: Path, wrap=None, timeout: float = 60):
    env = fake_slurm(tmp_path, {NODE: ("IDLE", "")})
    env.update(SLURMFABRIC_HEALTH_CONFIG=str(cfg), SLURMD_NODENAME=NODE, SLURM_JOB_ID="77")
    argv = [sys.executable, "-m", "slurmfabric", "health", "prolog"]
    start = time.monotonic()
    proc = subprocess.run(wrap(argv) if wrap else argv, env=env, capture_output=True,
                          text=True, timeout=timeout)
    report = json.loads((tmp_path / "state" / "reports" / f"last-{NODE}.json").read_text())
    result = next(c for c in report["checks"] if c["check"] == "storage.read")
    return proc, result, slurm_nodes(env)[NODE], time.monotonic() - start


def test_a_slow_mount_drains_with_its_rate_and_a_fast_one_passes(tmp_path, probe_file,
                                                                 throttle) -> None:
    mount = {"path": mount_of(probe_file), "file": str(probe_file), "read_mb": 8,
             "min_mb_s": 50, "timeout_s": 5}
    cfg = config(tmp_path, [mount])
    proc, result, node, _ = prolog(tmp_path, cfg)
    assert proc.returncode == 0, proc.stderr
    assert result["status"] == OK and result["values"][mount["path"]] > 50, result
    throttle.set(4 * MB)  # 4 MB/s: 8 MB take about 2 s
    proc, result, node, _ = prolog(tmp_path, cfg, throttle.argv)
    assert proc.returncode == EXIT_NODE_BAD, proc.stderr
    rate = result["values"][mount["path"]]
    assert 1 < rate < 6, result  # the throttle's rate, not the disk's
    assert node["state"] == "IDLE+DRAIN"
    assert node["reason"].startswith(f"slurmfabric: storage.read: {mount['path']}: {rate} MB/s, "
                                     f"8 MB of {probe_file} in ")
    assert node["reason"].endswith("(expected at least 50 MB/s)")


def test_the_page_cache_does_not_hide_a_slow_mount(tmp_path, probe_file, throttle) -> None:
    """The whole file is in memory (just read); the check still sees the throttled disk:
    it drops its region before reading (POSIX_FADV_DONTNEED), and picks it at random."""
    probe_file.read_bytes()
    throttle.set(4 * MB)
    warm = subprocess.run(throttle.argv([sys.executable, "-c", (
        "import os,sys,time; fd=os.open(sys.argv[1],os.O_RDONLY); t=time.monotonic(); "
        "n=len(os.pread(fd,8000000,0)); print(n/(time.monotonic()-t)/1e6)"),
        str(probe_file)]), capture_output=True, text=True, timeout=60)
    assert float(warm.stdout) > 100, warm  # a plain read comes from the cache
    mount = {"path": mount_of(probe_file), "file": str(probe_file), "read_mb": 8,
             "max_seconds": 1, "timeout_s": 5}
    proc, result, node, _ = prolog(tmp_path, config(tmp_path, [mount]), throttle.argv)
    assert result["status"] == FAIL and result["values"][mount["path"]] < 6, result
    assert "(expected at most 1 s)" in node["reason"]


def test_a_hung_mount_fails_at_its_deadline_and_the_hook_ends_on_time(tmp_path, probe_file,
                                                                      throttle) -> None:
    """100 kB/s: 8 MB would take 80 s; the reader is killed at its 2 s deadline. The
    whole hook runs in the throttled cgroup, so it runs once unthrottled first: its own
    modules come from the page cache, not from the disk at 100 kB/s (a cold start took
    24 s in a full suite run)."""
    mount = {"path": mount_of(probe_file), "file": str(probe_file), "read_mb": 8,
             "min_mb_s": 50, "timeout_s": 2}
    cfg = config(tmp_path, [mount])
    assert prolog(tmp_path, cfg)[1]["status"] == OK
    throttle.set(100_000)
    proc, result, node, took = prolog(tmp_path, cfg, throttle.argv)
    assert proc.returncode == EXIT_NODE_BAD
    assert node["reason"] == (f"slurmfabric: storage.read: {mount['path']}: reading "
                              f"{probe_file} gave no answer within 2 s: mount hung or too slow")
    # the 2 s deadline plus the hook's start and drain on a loaded 2-core machine
    assert took < 2 + 10, took


def _check(mount: dict) -> tuple[str, str]:
    facts = storage.collect({"data_mounts": [mount]}, 5.0)
    result = storage.check_read(facts, {"data_mounts": [mount]}, None)
    return result.status, result.reason


def test_what_a_job_could_plant_never_passes_nor_drains(tmp_path, probe_file) -> None:
    """A probe file a job could write, a symlink or a FIFO in its place: the checker errs
    (fail-open by default), naming the fix; nothing blocks."""
    where = mount_of(probe_file)
    mount = {"path": where, "file": str(probe_file), "read_mb": 8, "min_mb_s": 1}
    assert _check(mount)[0] == OK
    probe_file.chmod(0o666)
    status, reason = _check(mount)
    assert status == ERROR and reason.endswith("chown root and chmod 644 it")
    probe_file.chmod(0o644)
    os.chown(probe_file, 65534, 65534)
    assert _check(mount)[0] == ERROR
    link = probe_file.with_name("link.bin")
    link.symlink_to("/dev/zero")
    assert _check({**mount, "file": str(link)}) == (
        ERROR, f"{where}: {link}: Too many levels of symbolic links")
    fifo = probe_file.with_name("fifo")
    os.mkfifo(fifo)
    start = time.monotonic()
    status, reason = _check({**mount, "file": str(fifo)})
    assert status == ERROR and "not a regular file" in reason
    assert time.monotonic() - start < 4  # the open did not wait for a writer
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_an_unmounted_data_mount_fails(tmp_path) -> None:
    """A mount point that is an empty directory (the NFS mount is gone) fails."""
    empty = tmp_path / "datasets"
    empty.mkdir()
    status, reason = _check({"path": str(empty), "file": f"{empty}/probe", "min_mb_s": 1})
    assert (status, reason) == (FAIL, f"{empty}: not mounted")


@pytest.mark.parametrize(("mount", "says"), [
    ({"path": "datasets", "file": "/d/f", "min_mb_s": 1}, "path = 'datasets' should be an "
     "absolute path"),
    ({"path": "/d", "file": "/e/f", "min_mb_s": 1}, "file '/e/f' should lie under path '/d'"),
    ({"path": "/d", "file": "/d/f"}, "set min_mb_s (MB/s) or max_seconds"),
    ({"path": "/d", "file": "/d/f", "min_mb_s": -1}, "min_mb_s = -1 should be a number in"),
    ({"path": "/d", "file": "/d/f", "min_mb_s": 1, "speed": 2}, "unknown key 'speed'"),
])
def test_bad_data_mounts_are_refused_at_load(tmp_path, mount: dict, says: str) -> None:
    cfg = config(tmp_path, [mount])
    with pytest.raises(Exception, match="data_mounts #1") as caught:
        siteconfig.load(NODE, str(cfg))
    assert says in str(caught.value)
    proc = subprocess.run([sys.executable, "-m", "slurmfabric", "health", "check", "--config",
                           str(cfg)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert says in proc.stderr


def test_the_docs_block_is_a_valid_site_config(tmp_path) -> None:
    """docs/health.md's data_mounts block, loaded as the site config of a node it matches."""
    import readme_examples

    path = tmp_path / "health.toml"
    path.write_text(readme_examples.block_with("data_mounts = [", "docs/health.md", "toml"))
    cfg = siteconfig.load("gpu007", str(path))
    first, second = cfg.expect["data_mounts"]
    assert (first["path"], first["read_mb"], first["min_mb_s"]) == ("/datasets", 64, 200)
    assert second["max_seconds"] == 1 and cfg.runner["probe_timeout_s"] == 10
    assert storage.enabled(cfg.expect) and not storage.enabled(siteconfig.load(
        "cpu001", str(path)).expect)
