"""A container job on the testbed (issue 32): a 2-node torchrun job (gloo on CPU) whose image
has python3 and no slurmfabric, run through the pyxis stand-in tests/fakepyxis.py (an srun
wrapper over bubblewrap that applies pyxis's documented container semantics).

The image is the host's Debian /usr read-only (Debian's /usr/bin/python3, which lacks both
slurmfabric and torch) plus an /etc/environment that sets NCCL_SOCKET_IFNAME, NCCL_IB_HCA,
UCX_TLS and PATH, as enroot writes an image's ENV. What the image's python must reach:

* slurmfabric: nothing. Every rank's ``slurmfabric launch`` runs from the zipapp the script
  mounts at /opt/slurmfabric/slurmfabric.pyz, with the image's python3 (found on the image's
  PATH, which wins over the host's as pyxis documents).
* torch: torchrun and the program run with the test venv's python, whose directories are
  mounted read-only as data (program.container_mounts: the venv and the interpreter it links
  to). The venv's editable install of slurmfabric points into the checkout, which is not
  mounted, so the program checks that it cannot import slurmfabric.

The job uses the IB fixture sysfs tree (also mounted), so each node's NCCL plan sets
NCCL_IB_HCA for that node; fabric.nccl sets NCCL_SOCKET_IFNAME. Every rank must see the
plan's values, not the image's; the image's UCX_TLS, which the plan does not set, stays and
is reported by ``launch --print``; the job completes; each node imports the image once,
although the node check and the launch are two steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import fakepyxis
import fakesysfs
import nodes
import pytest
from testbed_cluster import Cluster

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
INTERPRETER = Path(os.path.realpath(sys.executable)).parents[1]  # the venv's base install
TIMEOUT = 300
IMAGE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "NCCL_SOCKET_IFNAME": "eth9", "NCCL_IB_HCA": "mlx5_9", "UCX_TLS": "rc,sm"}
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


def test_torchrun_in_an_image_without_slurmfabric(cluster: Cluster, tmp_path: Path) -> None:
    if not shutil.which("bwrap"):
        pytest.fail("bwrap (Debian package bubblewrap) is missing; scripts/test.sh installs it")
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(PROGRAM)
    image = fakepyxis.build_image(tmp_path / "image", IMAGE_ENV)
    sysfs = fakesysfs.build(nodes.testbed_node(sorted(os.sched_getaffinity(0)), "InfiniBand"),
                            tmp_path / "sysfs")
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "srun").symlink_to(HERE / "fakepyxis.py")
    state = tmp_path / "pyxis-state"
    mounts = [f"{work}:{work}", f"{sysfs}:{sysfs}:ro", f"{VENV}:{VENV}:ro",
              f"{INTERPRETER}:{INTERPRETER}:ro"]
    sets = ["launcher.type=torchrun", "launcher.nproc_per_node=2", "job.nodes=2",
            "job.cpus_per_task=2", f"job.partition={cluster.partition}", "job.time=5",
            f"job.output={tmp_path}/job-%j.out", f"launcher.torchrun=[\"{VENV}/bin/torchrun\"]",
            f'program.command=["{VENV}/bin/python", "train.py"]',
            f"program.container_image={image}", f"program.container_mounts={json.dumps(mounts)}",
            f'launcher.srun_args=["--container-workdir={work}"]',
            "program.env.OMP_NUM_THREADS=1", f"program.env.SLURMFABRIC_SYSFS_ROOT={sysfs}",
            "fabric.type=ib", "fabric.nccl.NCCL_SOCKET_IFNAME=lo"]
    env = {"PATH": f"{wrapper}:{cluster.env.get('PATH', os.environ['PATH'])}",
           "FAKEPYXIS_STATE": str(state), "SLURMFABRIC_ZIPAPP_DIR": str(tmp_path / "zipapp")}
    proc = cluster.run(["slurmfabric", "submit", *[a for s in sets for a in ("--set", s)],
                        "--workdir", str(work)], check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    state_name = cluster.wait(job_id, timeout=TIMEOUT)
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
        assert r["env"]["UCX_TLS"] == "rc,sm", r  # the image's; the plan does not set it
    printed = next(r["print"] for r in records if r["rank"] == 0)
    assert "# container: the image sets UCX_TLS=rc,sm and the plan does not (kept" in printed
    assert "# container: the image sets NCCL_IB_HCA=mlx5_9 and the plan does not " \
           "(replaced by this node's plan)" in printed
    assert "NCCL_SOCKET_IFNAME" not in "".join(line for line in printed.splitlines()
                                               if line.startswith("# container:"))

    # one import per node for the whole job: the node check imported, the launch reused
    imports = (state / "imports.log").read_text().splitlines()
    assert sorted(line.split()[0] for line in imports) == sorted(used), imports
    assert {line.split()[2] for line in imports} == {f"sf-{job_id}"}, imports


def test_an_image_without_python3_stops_at_the_check(cluster: Cluster, tmp_path: Path) -> None:
    """An image with no python3 on its PATH: the job fails at the node check, with one line
    per node naming the image, before any rank starts."""
    if not shutil.which("bwrap"):
        pytest.fail("bwrap (Debian package bubblewrap) is missing; scripts/test.sh installs it")
    # its PATH holds a shell and no python3 (the host's /usr/bin is off it)
    image = fakepyxis.build_image(tmp_path / "image-nopy", {"PATH": "/opt/tools"})
    (image / "opt" / "tools").mkdir()
    (image / "opt" / "tools" / "sh").symlink_to("/usr/bin/sh")
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "srun").symlink_to(HERE / "fakepyxis.py")
    sets = ["launcher.type=srun", "job.nodes=2", "job.ntasks_per_node=1",
            f"job.partition={cluster.partition}", "job.time=2",
            f"job.output={tmp_path}/job-%j.out", 'program.command=["true"]',
            f"program.container_image={image}",
            'launcher.srun_args=["--container-workdir=/"]']
    env = {"PATH": f"{wrapper}:{cluster.env.get('PATH', os.environ['PATH'])}",
           "FAKEPYXIS_STATE": str(tmp_path / "state"),
           "SLURMFABRIC_ZIPAPP_DIR": str(tmp_path / "zipapp")}
    proc = cluster.run(["slurmfabric", "submit", *[a for s in sets for a in ("--set", s)],
                        "--workdir", str(tmp_path)], check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    assert cluster.wait(job_id, timeout=120) == "FAILED"
    output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
    errors = [line for line in output.splitlines() if "slurmfabric: error:" in line]
    assert errors, output
    assert all(f"the image {image} has no python3 on " in line for line in errors), output
    # the batch shell stopped at the check ('|| exit 2'), before 'slurmfabric env'
    assert cluster.job(job_id).get("ExitCode", "").startswith("2:"), cluster.job(job_id)
