"""``[fabric]`` (the network and explicit NCCL settings) and ``[kubernetes]`` (what the
Kubernetes targets add to the same job)."""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import Field, field_validator

from slurmfabric.config.formats import ENV_NAME, Section, matching, texts


class FabricSection(Section):
    """The network; explicit NCCL settings are exported before launch and always win."""

    type: Literal["auto", "ib", "roce", "efa", "tcp"] = "auto"
    nccl: dict[str, str] = Field(default_factory=dict)

    @field_validator("nccl", mode="before")
    @classmethod
    def _nccl_values(cls, value: Any) -> Any:
        return texts(value, booleans=False)

    @field_validator("nccl")
    @classmethod
    def _nccl_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not (k.startswith("NCCL_") and ENV_NAME.match(k))]
        if bad:
            raise ValueError(f"NCCL overrides {bad!r} are not accepted: names start with NCCL_")
        return value


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1123 label
# RFC 1123 subdomain (a PersistentVolumeClaim name)
_K8S_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                            r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_K8S_RESOURCE = re.compile(r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
                           r"[A-Za-z0-9])?$")  # a qualified name, as resource names are



class KubernetesSection(Section):
    """What ``render --target pytorchjob|trainjob|jobset|mpijob`` adds for a Kubernetes
    cluster; the rest (nodes, GPUs, command, NCCL settings) comes from the same config."""

    namespace: Optional[str] = None
    image: Optional[str] = None  # default: program.container_image
    rdma_resource: Optional[str] = None  # e.g. "rdma/rdma_shared_device_a", "nvidia.com/hostdev"
    rdma_per_pod: int = Field(1, ge=1, le=64)
    networks: Optional[str] = None  # Multus: k8s.v1.cni.cncf.io/networks, e.g. "rdma-net"
    runtime: str = "torch-distributed"  # TrainJob's runtimeRef (a ClusterTrainingRuntime)
    health_check: bool = True  # an init container runs 'slurmfabric health check'
    health_config: Optional[str] = None  # path of the health config inside the image
    # where the pods find slurmfabric: "configmap" (the default, unless launcher.slurmfabric
    # names a path) mounts the one-file zipapp from the ConfigMap that 'slurmfabric zipapp
    # --configmap' writes and runs it with the image's python3, so a stock image works;
    # "image": the image has slurmfabric (launcher.slurmfabric, else on its PATH)
    slurmfabric: Optional[Literal["configmap", "image"]] = None
    # program.container_mounts become pod volumes: a mount whose source (SRC of
    # SRC[:DST[:FLAGS]]) is a key here mounts that PersistentVolumeClaim ("CLAIM", or
    # "CLAIM/sub/dir" for a subPath); any other mount is a hostPath volume, unless
    # host_path_mounts is false, which refuses it (clusters whose policy forbids hostPath).
    mount_claims: dict[str, str] = Field(default_factory=dict)
    host_path_mounts: bool = True

    @field_validator("mount_claims")
    @classmethod
    def _claims(cls, value: dict[str, str]) -> dict[str, str]:
        for source, target in value.items():
            claim, _, sub = target.partition("/")
            if not source.startswith("/") or not _K8S_SUBDOMAIN.match(claim) or (
                    sub and (sub.startswith("/") or ".." in sub.split("/"))):
                raise ValueError(
                    f"mount claim {source!r} = {target!r} is not accepted: the key is a "
                    "mount source (an absolute path of program.container_mounts), the value "
                    "a PersistentVolumeClaim name, optionally with a relative sub-directory, "
                    "e.g. '/lustre' = 'lustre-pvc' or '/lustre/ckpt' = 'lustre-pvc/ckpt'")
        return value

    _name = field_validator("namespace", "runtime")(matching(
        _K8S_NAME, "{value!r} is not a Kubernetes name (lower-case letters, digits and '-', "
        "at most 63)"))
    _resource = field_validator("rdma_resource")(matching(
        _K8S_RESOURCE, "{value!r} is not a resource name like rdma/hca_shared_devices_a"))
