"""The rendered pods run slurmfabric from a stock image that lacks it (issue 42, part 4).

``render --target pytorchjob`` of examples/smoke-cpu.toml with a stock image reference, then
each pod's container command, exactly as the manifest's YAML gives it, run in a container
without slurmfabric. What stands in for what:
- the container runtime: bubblewrap (bwrap(1), Debian's ``bubblewrap``) over a root made of
  the host's Debian ``/usr`` (its ``/usr/bin/python3``), with an empty ``/usr/local``;
- the stock image's software (NGC PyTorch installs torch with pip into
  ``/usr/local/lib/python3.X/dist-packages`` and has ``torchrun`` in ``/usr/local/bin``):
  the test venv's site-packages bound read-only there, and a ``torchrun`` written as pip
  writes the console script (entry point ``torch.distributed.run:main``). The venv's
  editable slurmfabric points into the checkout, which the container does not see: the test
  checks that slurmfabric is neither importable nor on PATH inside;
- the ConfigMap volume: the key of ``slurmfabric zipapp --configmap``'s output, decoded into
  a directory bound read-only at the volume's mountPath (the kubelet writes each key of a
  ConfigMap volume as a file there);
- the Kubeflow Training Operator: the variables it sets in a PyTorchJob's pods
  (tests/fixtures/k8s/env_pytorchjob_v1_master.txt and _worker1.txt, from
  kubeflow/training-operator v1.9.0, setPodEnv), with the master's address and port
  pointing at this machine, as the master Service would;
- two pods on two nodes: two sandboxes sharing this machine's network.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from slurmfabric.config import load_config
from slurmfabric.job import k8s as k8smanifest
from slurmfabric.job.zipapp import CONTAINER_PATH

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "k8s"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # Debian's
SETS = ["kubernetes.image=nvcr.io#nvidia/pytorch:25.08-py3", "program.workdir=/workspace",
        'program.command=["python3", "examples/allreduce.py"]', "kubernetes.namespace=ml"]
PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"


def _operator_env(fixture: str) -> dict[str, str]:
    out = {}
    for line in (FIXTURES / fixture).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value.strip()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pieces of the stand-in image and the ConfigMap volume."""
    bwrap = shutil.which("bwrap")
    assert bwrap, "bwrap is not installed (Debian: bubblewrap; scripts/test.sh installs it)"
    system = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert system == str(tuple(sys.version_info[:2])), \
        f"the image's /usr/bin/python3 is {system}, the test venv's torch is for {PYVER}"
    tmp = tmp_path_factory.mktemp("image")
    (tmp / "bin").mkdir()
    torchrun = tmp / "bin" / "torchrun"
    torchrun.write_text("#!/usr/bin/python3\nimport sys\nfrom torch.distributed.run import "
                        "main\nif __name__ == '__main__':\n    sys.exit(main())\n")
    torchrun.chmod(0o755)
    volume = tmp / "configmap"
    volume.mkdir()
    made = subprocess.run([sys.executable, "-m", "slurmfabric", "zipapp", "--configmap",
                           "--namespace", "ml"], capture_output=True, text=True, check=True)
    configmap = yaml.safe_load(made.stdout)
    assert configmap["metadata"]["name"] == k8smanifest.configmap_name()
    for key, value in configmap["binaryData"].items():
        (volume / key).write_bytes(base64.b64decode(value))
    return {"bwrap": Path(bwrap), "torchrun": torchrun, "volume": volume,
            "site": Path(sysconfig.get_paths()["purelib"])}


def _pod(image: dict[str, Path], container: dict, operator: dict[str, str],
         mounts: list[dict]) -> tuple[list[str], dict[str, str]]:
    """bwrap argv and environment for one container of a pod."""
    args = [str(image["bwrap"]), "--ro-bind", "/usr", "/usr", "--tmpfs", "/usr/local",
            "--ro-bind", str(image["site"]), f"/usr/local/lib/{PYVER}/dist-packages",
            "--ro-bind", str(image["torchrun"]), "/usr/local/bin/torchrun",
            "--ro-bind", "/etc", "/etc", "--ro-bind", "/sys", "/sys",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/root"]
    for name in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            args += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
    for mount in mounts:
        assert mount["name"] == "slurmfabric" and mount["readOnly"] is True, mount
        args += ["--ro-bind", str(image["volume"]), mount["mountPath"]]
    args += ["--ro-bind", str(REPO / "examples"), "/workspace/examples",
             "--chdir", container.get("workingDir", "/"), "--"]
    env = {"PATH": IMAGE_PATH, "HOME": "/root", "LANG": "C.UTF-8", **operator,
           **{e["name"]: e["value"] for e in container.get("env", [])}}
    return args + container["command"], env


def _rendered() -> dict:
    config = load_config(str(REPO / "examples" / "smoke-cpu.toml"), SETS, "")
    return yaml.safe_load(k8smanifest.to_yaml(k8smanifest.build(config, "pytorchjob")))


def test_a_stock_image_runs_the_pods_slurmfabric_from_the_configmap(image) -> None:
    job = _rendered()
    replicas = job["spec"]["pytorchReplicaSpecs"]
    nproc = job["spec"]["nprocPerNode"]
    port = str(_free_port())
    procs = []
    for index, (role, fixture) in enumerate((("Master", "env_pytorchjob_v1_master.txt"),
                                             ("Worker", "env_pytorchjob_v1_worker1.txt"))):
        spec = replicas[role]["template"]["spec"]
        (container,) = spec["containers"]
        assert container["command"][:4] == ["torchrun", "--no-python", "python3",
                                            CONTAINER_PATH]
        operator = {**_operator_env(fixture), "MASTER_ADDR": "127.0.0.1",
                    "PET_MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                    "PET_MASTER_PORT": port, "WORLD_SIZE": "2", "PET_NNODES": "2",
                    "RANK": str(index), "PET_NODE_RANK": str(index), "PET_NPROC_PER_NODE": nproc}
        mounts = [m for m in container["volumeMounts"] if m["name"] == "slurmfabric"]
        volumes = [v for v in spec["volumes"] if v["name"] == "slurmfabric"]
        assert volumes == [{"name": "slurmfabric",
                            "configMap": {"name": k8smanifest.configmap_name()}}]
        if index == 0:
            # inside, slurmfabric is nowhere but the mounted file (the venv's data-only
            # slurmfabric/ directory, hooks and templates, imports as an empty namespace)
            argv, env = _pod(image, {**container, "command": [
                "/bin/sh", "-c", "command -v slurmfabric; python3 -c 'import slurmfabric.cli'"]},
                operator, mounts)
            probe = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            assert probe.stdout == "" and "No module named 'slurmfabric.cli'" in probe.stderr, \
                probe.stdout + probe.stderr
            # the health init container, as rendered
            (init,) = spec["initContainers"]
            argv, env = _pod(image, init, operator, init["volumeMounts"])
            health = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            assert health.returncode in (0, 1), health.stdout + health.stderr
            assert "CHECK" in health.stdout and "STATUS" in health.stdout, health.stdout
            assert "Traceback" not in health.stderr, health.stderr
        argv, env = _pod(image, container, operator, mounts)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
        outs.append((proc.returncode, out, err))
    for code, out, err in outs:
        assert code == 0, out + err
    ranks = [json.loads(line) for _, out, _ in outs for line in out.splitlines()
             if line.startswith("{")]
    world = 2 * int(nproc)
    assert sorted(r["rank"] for r in ranks) == list(range(world)), ranks
    assert {r["sum"] for r in ranks} == {world * (world + 1) / 2}, ranks
    assert not any("deprecated" in err for _, _, err in outs)


def test_the_same_pod_without_the_configmap_fails_the_way_the_issue_says(image) -> None:
    """The check can fail: the image-mode manifest (slurmfabric from the image's PATH) in the
    same container finds no slurmfabric; this is what every pod did before."""
    config = load_config(str(REPO / "examples" / "smoke-cpu.toml"),
                         [*SETS, "kubernetes.slurmfabric=image"], "")
    spec = k8smanifest.build(config, "pytorchjob")["spec"]["pytorchReplicaSpecs"]["Master"][
        "template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"][0] == "slurmfabric" and "volumeMounts" not in init
    argv, env = _pod(image, {**init, "command": ["/bin/sh", "-c",
                                                 'exec "$0" "$@"', *init["command"]]}, {}, [])
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 127 and "not found" in run.stderr, run.stderr
