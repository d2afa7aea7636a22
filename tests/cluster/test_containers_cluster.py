"""Container jobs on real pyxis 0.24.0 and enroot 4.1.2 (issue 42), built by
scripts/build-containers.sh from the upstream release sources and loaded by the testbed
through plugstack.conf (slurmfabric/testbed/containers.py). Each virtual node has its own
enroot data directory, as each real node has its own disk.

The image is the build's Debian minbase with python3 (debootstrap) and no slurmfabric; its
/etc/environment, where enroot keeps an image's ENV, sets NCCL_SOCKET_IFNAME, NCCL_IB_HCA and
UCX_TLS as a training image would. torchrun and the program run with the test venv's python,
whose directories are mounted read-only as data; the venv's editable install of slurmfabric
points into the checkout, which is not mounted, so the program checks it cannot import
slurmfabric. Every rank's ``slurmfabric launch`` runs from the zipapp with the image's
python3.

What pyxis does is read from its own log lines in each node's slurmd log ("pyxis: creating
container filesystem: NAME", "pyxis: starting container: NAME", pyxis_slurmstepd.c).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import fakesysfs
import nodes
import pytest
from cleanenv import python_with_prefix
from syslogsink import SyslogSink
from testbed_cluster import Cluster

from slurmfabric.testbed import containers

pytestmark = pytest.mark.cluster

VENV = Path(sys.prefix)
INTERPRETER = Path(os.path.realpath(sys.executable)).parents[1]  # the venv's base install
TIMEOUT = 300
PROGRAM = '''\
import json, os, subprocess, sys
from datetime import timedelta
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value, op=dist.ReduceOp.SUM)
try:  # the venv's site-packages holds only slurmfabric's data files (a namespace package)
    import slurmfabric.cli  # noqa: F401
    has_slurmfabric = True
except ImportError:
    has_slurmfabric = False
names = ("NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_TLS", "OMP_NUM_THREADS")
record = {"rank": dist.get_rank(), "node": os.environ.get("SLURMD_NODENAME"),
          "sum": int(value.item()), "env": {n: os.environ.get(n) for n in names},
          "slurmfabric_importable": has_slurmfabric,
          "python3": subprocess.run(["sh", "-c", "command -v python3"], capture_output=True,
                                    text=True).stdout.strip()}
if dist.get_rank() == 0:
    # launch --print as this worker started: the torchrun agent's environment (pyxis's
    # container environment) under the worker's own variables, launch's changes undone
    with open(f"/proc/{os.getppid()}/environ") as fh:
        agent = dict(i.split("=", 1) for i in fh.read().split("\\0") if "=" in i)
    record["print"] = subprocess.run(
        ["python3", "/opt/slurmfabric/slurmfabric.pyz", "launch", "--print", "--", "true"],
        capture_output=True, text=True, env={**os.environ, **agent}).stdout
sys.stdout.write(json.dumps(record) + "\\n")
sys.stdout.flush()
dist.destroy_process_group()
'''
# A [[steps]] entry in the job's image: where it ran (the image's UCX_TLS, its python3).
STEP = ("import os, sys; print('STEP', os.environ['SLURMD_NODENAME'], sys.executable, "
        "os.environ.get('UCX_TLS'), flush=True)")
# A rank that hangs outside any collective while the others wait in all_reduce.
HANG = '''\
import os, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist

def stall():
    time.sleep(3600)

dist.init_process_group("gloo", timeout=timedelta(seconds=600))
value = torch.ones(4)
dist.all_reduce(value)
print("READY", dist.get_rank(), os.getpid(), os.environ["SLURMD_NODENAME"], flush=True)
if dist.get_rank() == 1:
    stall()
dist.all_reduce(value)
'''


@pytest.fixture(scope="module")
def build(cluster: Cluster) -> containers.Build:
    """The pyxis build the testbed loaded; the tests fail (never skip) without it."""
    found = containers.load_build(Path(cluster.testbed.s.pyxis)) if cluster.testbed.s.pyxis \
        else None
    if found is None:
        pytest.fail("the testbed runs without pyxis: no build for its Slurm under "
                    f"{containers.cache_root()}; {containers.BUILD_HINT}, then "
                    "'slurmfabric testbed up' loads it", pytrace=False)
    return found


def image_env(image: Path) -> dict[str, str]:
    """The image's ENV as enroot reads it (/etc/environment inside the squashfs)."""
    text = subprocess.run(["unsquashfs", "-cat", str(image), "etc/environment"],
                          capture_output=True, text=True, check=True).stdout
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def pyxis_lines(cluster: Cluster, node: str, job_id: str, what: str) -> list[str]:
    """pyxis's own log lines about this job's steps on one node (slurmd's log)."""
    log = cluster.state_dir / "log" / f"slurmd.{node}.log"
    pattern = re.compile(rf"\[{job_id}\.(\d+|batch)\] pyxis: {re.escape(what)}")
    return [line for line in log.read_text(errors="replace").splitlines()
            if pattern.search(line)]


def drop_containers(cluster: Cluster, job_id: str) -> None:
    """Remove the job's named container from every node (pyxis's default scope keeps it;
    each is the image unpacked, about 260 MB)."""
    for path in cluster.state_dir.glob(f"enroot/*/data/pyxis_sf-{job_id}"):
        shutil.rmtree(path, ignore_errors=True)


def submit(cluster: Cluster, tmp_path: Path, sets: list[str], workdir: Path,
           extra: list[str] = (), env: dict[str, str] | None = None) -> str:
    proc = cluster.run(["slurmfabric", "submit", *[a for s in sets for a in ("--set", s)],
                        *extra, "--workdir", str(workdir)], check=False,
                       env={"SLURMFABRIC_ZIPAPP_DIR": str(tmp_path / "zipapp"), **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def venv_mounts() -> list[str]:
    """The test venv (torch) as read-only data; its base interpreter too, unless that is
    the image's own /usr (Debian's python3.11 is in both)."""
    mounts = [f"{VENV}:{VENV}:ro"]
    if INTERPRETER.as_posix() != "/usr":
        mounts.append(f"{INTERPRETER}:{INTERPRETER}:ro")
    return mounts


def test_torchrun_in_an_image_without_slurmfabric(cluster: Cluster, build: containers.Build,
                                                  tmp_path: Path, request) -> None:
    """Plan values beat the image's ENV, one import per node for the check, a [[steps]]
    entry and the launch, all in the job's named container."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(PROGRAM)
    ienv = image_env(build.image)
    assert ienv["NCCL_IB_HCA"] == "mlx5_9" and ienv["UCX_TLS"] == "rc,sm", ienv
    sysfs = fakesysfs.build(nodes.testbed_node(sorted(os.sched_getaffinity(0)), "InfiniBand"),
                            tmp_path / "sysfs")
    mounts = [f"{work}:{work}", f"{sysfs}:{sysfs}:ro", *venv_mounts()]
    steps = tmp_path / "steps.toml"
    steps.write_text(f'[[steps]]\nname = "probe"\ncontainer_image = "{build.image}"\n'
                     f'command = {json.dumps(["python3", "-c", STEP])}\n')
    sets = ["launcher.type=torchrun", "launcher.nproc_per_node=2", "job.nodes=2",
            "job.cpus_per_task=2", f"job.partition={cluster.partition}", "job.time=5",
            f"job.output={tmp_path}/job-%j.out", f"launcher.torchrun=[\"{VENV}/bin/torchrun\"]",
            f'program.command=["{VENV}/bin/python", "train.py"]',
            f"program.container_image={build.image}",
            f"program.container_mounts={json.dumps(mounts)}",
            f'launcher.srun_args=["--container-workdir={work}"]',
            "program.env.OMP_NUM_THREADS=1", f"program.env.SLURMFABRIC_SYSFS_ROOT={sysfs}",
            "fabric.type=ib", "fabric.nccl.NCCL_SOCKET_IFNAME=lo"]
    started = time.monotonic()
    job_id = submit(cluster, tmp_path, sets, work, extra=["-c", str(steps)])
    request.addfinalizer(lambda: drop_containers(cluster, job_id))
    state_name = cluster.wait(job_id, timeout=TIMEOUT)
    print(f"container torchrun job: {time.monotonic() - started:.1f} s submit to end")
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    assert state_name == "COMPLETED", f"job {job_id} ended {state_name}:\n{output}"

    records = [json.loads(m) for m in re.findall(r'^\{"rank": .*\}$', output, re.M)]
    assert sorted(r["rank"] for r in records) == [0, 1, 2, 3], output
    assert {r["sum"] for r in records} == {10}, output
    used = {r["node"] for r in records}
    assert len(used) == 2 and used <= set(cluster.nodes), output
    for r in records:
        assert not r["slurmfabric_importable"], r  # the image (and its venv) lack it
        assert r["python3"] == "/usr/bin/python3", r  # the image's PATH won over the host's
        # the plan's values, not the image's: fabric.nccl (passed with --container-env) and
        # the node plan's HCA list (the image's NCCL_* give way to it)
        assert r["env"]["NCCL_SOCKET_IFNAME"] == "lo", r
        assert r["env"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1", r
        assert r["env"]["OMP_NUM_THREADS"] == "1", r
        assert r["env"]["UCX_TLS"] == ienv["UCX_TLS"], r  # the image's; the plan has none
    printed = next(r["print"] for r in records if r["rank"] == 0)
    assert "# container: the image sets UCX_TLS=rc,sm and the plan does not (kept" in printed
    assert "# container: the image sets NCCL_IB_HCA=mlx5_9 and the plan does not " \
           "(replaced by this node's plan)" in printed
    assert "NCCL_SOCKET_IFNAME" not in "".join(line for line in printed.splitlines()
                                               if line.startswith("# container:"))
    # the [[steps]] entry ran in the image (its UCX_TLS, its python3) on both nodes
    probes = re.findall(r"^STEP (\S+) (\S+) (\S+)$", output, re.M)
    assert sorted(p[0] for p in probes) == sorted(used), output
    assert {p[1:] for p in probes} == {("/usr/bin/python3", "rc,sm")}, output

    # pyxis's own log: on each node one container filesystem for the whole job, which the
    # node check, the step and the launch (three steps) all started
    name = f"pyxis_sf-{job_id}"
    for node in used:
        created = pyxis_lines(cluster, node, job_id, "creating container filesystem: ")
        assert [line.rsplit(" ", 1)[-1] for line in created] == [name], created
        starts = pyxis_lines(cluster, node, job_id, f"starting container: {name}")
        assert len({re.search(r"\[\d+\.(\d+)\]", s).group(1) for s in starts}) >= 3, starts
    for node in set(cluster.nodes) - used:
        assert not pyxis_lines(cluster, node, job_id, "creating container filesystem"), node


def tiny_image(directory: Path) -> Path:
    """A squashfs image with a shell and no python3 (dash and the C library it needs)."""
    root = directory / "rootfs"
    for sub in ("bin", "etc", "lib64", "usr/lib/x86_64-linux-gnu", "proc", "dev", "sys",
                "tmp", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy2("/bin/dash", root / "bin" / "sh")
    out = subprocess.run(["ldd", "/bin/dash"], capture_output=True, text=True).stdout
    for lib in re.findall(r"(/\S+\.so[.\d]*)", out):
        target = root / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), target)
    (root / "etc" / "environment").write_text("PATH=/bin\n")
    image = directory / "nopython.sqsh"
    subprocess.run(["mksquashfs", str(root), str(image), "-noappend", "-quiet"], check=True,
                   capture_output=True)
    return image


def test_an_image_without_python3_stops_at_the_check(cluster: Cluster,
                                                     build: containers.Build,
                                                     tmp_path: Path) -> None:
    """An image with no python3 on its PATH: the job fails at the node check, with a line
    naming the image and the node, before any rank starts."""
    image = tiny_image(tmp_path)
    sets = ["launcher.type=srun", "job.nodes=2", "job.ntasks_per_node=1",
            f"job.partition={cluster.partition}", "job.time=2",
            f"job.output={tmp_path}/job-%j.out", 'program.command=["true"]',
            f"program.container_image={image}", 'launcher.srun_args=["--container-workdir=/"]']
    job_id = submit(cluster, tmp_path, sets, tmp_path)
    assert cluster.wait(job_id, timeout=120) == "FAILED"
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    errors = [line for line in output.splitlines() if "slurmfabric: error:" in line]
    # one line from each node that got there before --kill-on-bad-exit ended the step
    # (pyxis on the other node then reports "container exited too soon")
    assert 1 <= len(errors) <= 2, output
    for line in errors:
        node = re.search(rf"the image {re.escape(str(image))} has no python3 on (\S+);", line)
        assert node and node.group(1) in cluster.nodes, output
    # the batch shell stopped at the check ('|| exit 2'), before 'slurmfabric env'
    assert cluster.job(job_id).get("ExitCode", "").startswith("2:"), cluster.job(job_id)


def test_a_zipapp_the_nodes_cannot_see_stops_before_pyxis(cluster: Cluster,
                                                          build: containers.Build,
                                                          tmp_path: Path) -> None:
    """The zipapp's directory is not on the nodes: the host-side check names each node and
    the fix, and pyxis never creates a container. The testbed's nodes share one disk, so the
    batch shell's slurmfabric is a wrapper whose zipapp directory is gone once it has
    printed the path (as a node-local directory is absent on every other node)."""
    real = shutil.which("slurmfabric", path=cluster.env["PATH"])
    wrapper = tmp_path / "slurmfabric"
    wrapper.write_text(f"""#!/bin/sh
if [ "$1" = zipapp ]; then
  d="$(mktemp -d)"
  SLURMFABRIC_ZIPAPP_DIR="$d" '{real}' zipapp && rm -rf "$d"
  exit
fi
exec '{real}' "$@"
""")
    wrapper.chmod(0o755)
    sets = ["launcher.type=srun", "job.nodes=2", "job.ntasks_per_node=1",
            f"job.partition={cluster.partition}", "job.time=2",
            f"job.output={tmp_path}/job-%j.out", 'program.command=["true"]',
            f"program.container_image={build.image}", f"launcher.slurmfabric={wrapper}"]
    job_id = submit(cluster, tmp_path, sets, tmp_path)
    assert cluster.wait(job_id, timeout=120) == "FAILED"
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    errors = [line for line in output.splitlines() if "slurmfabric: error:" in line]
    assert len(errors) == 2, output
    used = set()
    for line in errors:
        m = re.search(r"the slurmfabric zipapp (/\S+\.pyz) is not visible on (\S+);", line)
        assert m and not Path(m.group(1)).exists(), line
        assert "set SLURMFABRIC_ZIPAPP_DIR to a directory that every node mounts" in line
        used.add(m.group(2))
    assert len(used) == 2 and used <= set(cluster.nodes), errors
    assert cluster.job(job_id).get("ExitCode", "").startswith("2:"), cluster.job(job_id)
    for node in cluster.nodes:
        assert not pyxis_lines(cluster, node, job_id, "creating container filesystem"), node


@pytest.fixture
def taskprolog(cluster: Cluster, tmp_path: Path, request) -> Path:
    """The site TaskProlog installed into the testbed's slurm.conf for this test; its syslog
    line goes to a socket beside it (tests/syslogsink.py). Taken out after."""
    hooks = tmp_path / "hooks"
    out = cluster.run([sys.executable, "-m", "slurmfabric", "site", "install", str(hooks),
                       "--python", str(python_with_prefix(tmp_path))]).stdout
    line = next(x for x in out.splitlines() if x.startswith("TaskProlog="))
    script = hooks / "slurmfabric-taskprolog"
    text = script.read_text()
    assert "SLURMFABRIC_SYSLOG_SOCKET=/dev/log\n" in text
    script.write_text(text.replace("SLURMFABRIC_SYSLOG_SOCKET=/dev/log\n",
                                   f"SLURMFABRIC_SYSLOG_SOCKET={hooks}/log.sock\n"))
    fstab = containers.enroot_config_dir(cluster.state_dir) / "mounts.d" / "sf-test.fstab"

    def restore() -> None:
        cluster.set_extra_conf("")
        fstab.unlink(missing_ok=True)

    request.addfinalizer(restore)
    cluster.set_extra_conf(line + "\n")
    return hooks


def test_the_site_taskprolog_runs_inside_the_container_and_fails_open_there(
        cluster: Cluster, build: containers.Build, taskprolog: Path, tmp_path: Path) -> None:
    """slurmstepd runs TaskProlog after the SPANK task hooks (Slurm task.c exec_task:
    spank_user_task, then TaskProlog), so under pyxis it runs in the container's mount
    namespace, with the image's /bin/sh. (1) A hook directory the image lacks: Slurm cannot
    execute it and ends every task ('TaskProlog failed status=1'); the script never runs,
    so no fail-open can help: a site mounts it into every container (enroot mounts.d).
    (2) Mounted, its interpreter (a host path, present on the host) is missing in the
    image: the TaskProlog fails open there, every task runs without the plan, and its one
    line reaches syslog."""
    sink = SyslogSink(taskprolog / "log.sock")
    a, b = cluster.nodes[:2]
    common = ["-N", "2", "-w", f"{a},{b}", "--ntasks-per-node=1",
              f"--container-image={build.image}"]
    probe = ["sh", "-c", 'echo "TASK $SLURMD_NODENAME rank=${RANK:-none}"']

    first = cluster.run(["srun", *common, *probe], check=False, timeout=120)
    assert first.returncode != 0, first.stdout
    assert "TASK" not in first.stdout
    assert "TaskProlog failed status=1" in first.stderr, first.stderr
    assert f"task_prolog can not be executed ({taskprolog.resolve()}/slurmfabric-taskprolog)" \
        in first.stderr, first.stderr

    fstab = containers.enroot_config_dir(cluster.state_dir) / "mounts.d" / "sf-test.fstab"
    fstab.write_text(f"{taskprolog} {taskprolog} none x-create=dir,bind,rw,nosuid,nodev 0 -1\n")
    second = cluster.run(["srun", *common, *probe], check=False, timeout=120)
    assert second.returncode == 0, second.stderr
    assert sorted(second.stdout.split()) == sorted(["TASK", a, "rank=none",
                                                    "TASK", b, "rank=none"]), second.stdout
    interpreter = tmp_path / "python-with-pycache-prefix"
    assert interpreter.exists()  # on the host; the line below came from inside the image
    deadline = time.monotonic() + 10
    while len(sink.seen) < 2 and time.monotonic() < deadline:
        sink.lines()
        time.sleep(0.2)
    said = [m for m in sink.seen if "slurmfabric-taskprolog" in m]
    assert len(said) == 2, sink.seen
    for node in (a, b):
        assert any(f"node={node} " in m and f"{interpreter} is missing or not executable"
                   in m and "(fail-open)" in m for m in said), said


def test_jobs_diagnose_names_a_hung_rank_inside_a_container(
        cluster: Cluster, build: containers.Build, tmp_path: Path) -> None:
    """py-spy on the hosts (the collector's srun step has no container options) finds the
    container's rank processes by their environment and reads their stacks through /proc."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "hang.py").write_text(HANG)
    sets = ["launcher.type=srun", "job.nodes=2", "job.ntasks_per_node=1",
            f"job.partition={cluster.partition}", "job.time=5",
            f"job.output={tmp_path}/job-%j.out",
            f'program.command=["{VENV}/bin/python", "hang.py"]',
            f"program.container_image={build.image}",
            f"program.container_mounts={json.dumps([f'{work}:{work}', *venv_mounts()])}",
            f'launcher.srun_args=["--container-workdir={work}"]',
            "program.env.OMP_NUM_THREADS=1", "fabric.nccl.NCCL_SOCKET_IFNAME=lo"]
    job_id = submit(cluster, tmp_path, sets, work)
    out_file = tmp_path / f"job-{job_id}.out"
    try:
        deadline = time.monotonic() + 240
        ready: list[tuple[str, str, str]] = []
        while time.monotonic() < deadline and len(ready) < 2:
            text = out_file.read_text(errors="replace") if out_file.exists() else ""
            ready = re.findall(r"^READY (\d+) (\d+) (\S+)$", text, re.M)
            assert cluster.job(job_id)["JobState"] in ("PENDING", "RUNNING"), text
            time.sleep(1)
        assert len(ready) == 2, out_file.read_text(errors="replace")
        rank1 = next(r for r in ready if r[0] == "1")
        proc = cluster.run([sys.executable, "-m", "slurmfabric", "jobs", "diagnose", job_id,
                            "--json"], check=False, timeout=120)
        assert proc.returncode == 0, proc.stderr
        found = json.loads(proc.stdout)
        assert sorted(r["rank"] for r in found["ranks"]) == [0, 1], found
        # the host sees the container's processes under their own PIDs (enroot does not
        # unshare the PID namespace)
        culprits = [(c["rank"], c["host"], c["pid"]) for c in found["culprits"]]
        assert culprits == [(1, rank1[2], int(rank1[1]))], found
        assert "stall" in (found["culprits"][0].get("frame") or ""), found
    finally:  # the next tests get idle nodes, not ones still completing this job
        cluster.run(["scancel", job_id], check=False)
        cluster.wait(job_id, timeout=120)
        cluster.testbed.wait_idle(60)
        drop_containers(cluster, job_id)
