"""What the links carry: NVLink inside a node and the NICs between nodes, per fabric.

Shared by the step model (``model``) and the algorithm-aware collective model
(``collectives``), which both need these rates; neither imports the other for them.
"""

from __future__ import annotations

from typing import Any

# A whatif.model.Job: typed Any, so that model (which imports this) stays the only owner
# of Job without an import circle.
Job = Any

# Measured all_reduce bus bandwidth inside one 8-GPU node, GB/s (REFERENCES.md T4-T6):
# H100/H200 ring 368-370 (NVIDIA, nccl-tests#212: "effective NVLink bandwidth of 370GB/s"),
# with NVLink SHARP ~480 ("peak busBw of ~480GB/s"); A100 ~230 (nccl-tests#149).
# B200 (NVLink 5) ring 698, NVLS 844 (Together's B200 scaling report, 2026-05-12).
NVLINK_BUSBW = {"h100": {"ring": 370.0, "nvls": 480.0}, "h200": {"ring": 370.0, "nvls": 480.0},
                "a100": {"ring": 230.0, "nvls": 230.0}, "b200": {"ring": 698.0, "nvls": 844.0}}
# NCCL's effective bandwidth per NIC over InfiniBand: 46-49 GB/s on 400 Gb/s ConnectX-7,
# 24 on 200G HDR, 12 on 100G (NVIDIA, nccl-tests#290/#319, nccl-tests#119, nccl#412):
# 0.96 of the line rate.
IB_EFFICIENCY = 0.96
# A tuned lossless RoCE fabric against InfiniBand on the same nodes: the one measured pair
# found (Tolly 225107, 64 H20, 8 x 400G: RoCE 231.8 vs IB 230.7 GB/s) says equal; the
# often-quoted 92-96 % has no public measurement behind it we could find. 0.95 sits between.
ROCE_FACTOR = 0.95
# NCCL over TCP sockets: 4-6 GB/s busbw on 100 GbE (NVIDIA/nccl#450): 0.4 of line rate.
TCP_EFFICIENCY = 0.4
# AWS EFA (SRD, through the aws-ofi-nccl plugin): NOT calibrated, no public nccl-tests figure
# with its setup is in the fixtures; assumed to behave like tuned RoCE.
EFA_FACTOR = 0.95
# One RoCE hop whose switch port has no PFC: drops under incast turn into go-back-N
# retransmits; the one public figure (NVIDIA/nccl#2409, 2 x 8 H100 RoCEv2 mis-tuned: 231 GB/s
# against ~470 expected) says about half. A judgement from one report, not a fit.
NO_PFC_RATE = 0.5
# Without GPUDirect RDMA the NIC reads from host memory: both GPUs behind a PCIe switch
# push their share up one PCIe 5.0 x16 uplink (63 GB/s raw per direction, PCI-SIG; ~52
# usable at NCCL's ~83 % PCIe efficiency, an assumption): ~26 GB/s per NIC on HGX H100.
PCIE_UPLINK_GBS = 52.0
GPUS_PER_SWITCH = 2


def nic_rate_gbs(job: Job, rate_gbps: float) -> float:
    """One NIC's effective GB/s for NCCL on this fabric."""
    if job.fabric == "tcp":
        return rate_gbps / 8 * TCP_EFFICIENCY
    effective = rate_gbps / 8 * IB_EFFICIENCY * {"roce": ROCE_FACTOR, "efa": EFA_FACTOR}.get(
        job.fabric, 1.0)
    if not job.gdr:
        effective = min(effective, gdr_off_rate())
    return effective


def gdr_off_rate() -> float:
    return PCIE_UPLINK_GBS / GPUS_PER_SWITCH


def rails_busbw(job: Job) -> tuple[float, str]:
    """(GB/s, why) the node's rails carry for a ring across nodes: NCCL runs one ring per
    rail and the ring goes as fast as its slowest hop, so rails x the slowest rail's rate."""
    if job.fabric == "tcp":
        return nic_rate_gbs(job, job.frontend_rate), \
            f"TCP sockets over one {job.frontend_rate:g} Gb/s NIC"
    fraction = min(job.slow_link[1] if job.slow_link else 1.0,
                   NO_PFC_RATE if job.no_pfc and job.fabric == "roce" else 1.0)
    rate = job.port_rate * fraction
    why = (f"{job.nic_count} NICs x the slowest ({rate:g} Gb/s"
           + (", no PFC on one hop" if job.no_pfc and job.fabric == "roce" else "")
           + (", no GPUDirect RDMA" if not job.gdr else "") + ")")
    return job.nic_count * nic_rate_gbs(job, rate), why
