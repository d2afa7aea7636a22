"""What the container image set in this rank's environment, and the plan did not.

pyxis sets the job's exported variables in the container, "but their existing values in the
image take precedence", except for the names given with ``--container-env``
(https://github.com/NVIDIA/pyxis/wiki/Usage). The rendered script passes every name the
plan exports that way and lists them in ``SLURMFABRIC_CONTAINER_ENV``; enroot writes the
image's ENV into the container's ``/etc/environment`` (enroot src/docker.sh
``docker::configure``; doc/image-format.md). So a name in that file and not in the list has
the image's value here. Runs on every rank: standard library only.
"""

from __future__ import annotations

PASSED = "SLURMFABRIC_CONTAINER_ENV"  # the names the script passed with --container-env
ENVIRON_FILE = "/etc/environment"
# Names that steer communication or ranks: the ones worth a line in 'launch --print'.
REPORTED = ("NCCL_", "UCX_", "FI_", "OMPI_", "PMIX_", "GLOO_", "TORCH_", "NVSHMEM_",
            "HCOLL_", "SHARP_", "OMP_", "MASTER_", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def image_values(path: str = ENVIRON_FILE) -> dict[str, str]:
    """The image's ENV: the ``NAME=VALUE`` lines of /etc/environment."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read(1 << 20).splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        line = line.strip()
        if line.startswith("export "):
            line = line[7:].lstrip()
        name, eq, value = line.partition("=")
        if eq and name and not line.startswith("#"):
            out[name] = value
    return out


def image_env(environ: dict[str, str], path: str = ENVIRON_FILE) -> dict[str, str]:
    """The image's variables in effect (same value here) that the plan did not pass
    (reported prefixes only); empty outside a container job (no SLURMFABRIC_CONTAINER_ENV)."""
    passed = environ.get(PASSED)
    if passed is None:
        return {}
    ours = set(passed.split(","))
    return {name: value for name, value in image_values(path).items()
            if environ.get(name) == value and name not in ours and name.startswith(REPORTED)}


def plan_view(environ: dict[str, str], path: str = ENVIRON_FILE) -> dict[str, str]:
    """``environ`` as the node's NCCL plan should see it: without the image's own NCCL_*
    values, which the plan then sets for this node instead (the image cannot know the
    cluster's NICs); the user's, passed with --container-env, stay."""
    image = [name for name in image_env(environ, path) if name.startswith("NCCL_")]
    return {k: v for k, v in environ.items() if k not in image} if image else environ
