"""What one NCCL WARN (or a crash line beside it) means, and its usual remedy.

``nccl/log.py`` reads the lines; this module names the problem each warning is. Sources of
each text are cited beside it (NCCL's src/, rdma-core verbs.h, public NVIDIA/nccl issues).
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

# A process killed by a signal prints no NCCL line at all; its signal handler does: UCX's
# (HPC-X images) "[host:pid:thread:tid] Caught signal 11 (Segmentation fault: ...)"
# (NVIDIA/nccl#947, #1538), Open MPI's "[host:pid] Signal: Segmentation fault (11)".
_CRASH = (re.compile(r"Caught signal (?P<sig>[0-9]{1,3}) \((?P<what>[^():]{1,80})"),
          re.compile(r"\] Signal: (?P<what>[A-Za-z][A-Za-z ]{0,60}) \((?P<sig>[0-9]{1,3})\)"))

# WARN texts of a failed TCP connection (misc/socket.cc, all releases: "Connect to X
# failed : Connection refused", "Call to recv from X failed : Connection reset by peer").
_CONNECTION_ERRORS = ("connection reset by peer", "connection refused", "no route to host",
                      "broken pipe", "connection timed out", "connection abort")

_COMPLETION = re.compile(
    r"Got completion (?:from peer \S+ )?with (?:error |status=)(?P<st>[0-9]{1,9})"
)

# ibv_wc_status values (rdma-core verbs.h) that show up in NCCL's completion warnings.
WC_STATUS = {
    4: "IBV_WC_LOC_PROT_ERR (local protection error: memory registration, often GPUDirect"
    " RDMA with PCIe ACS or IOMMU in the way)",
    5: "IBV_WC_WR_FLUSH_ERR (queue pair already in error: look for the first failure)",
    10: "IBV_WC_REM_ACCESS_ERR (remote access error)",
    12: "IBV_WC_RETRY_EXC_ERR (transport retry counter exceeded: a timeout on the wire)",
    13: "IBV_WC_RNR_RETRY_EXC_ERR (receiver not ready, retries exceeded)",
}


@dataclass
class Problem:
    severity: str  # "error", "warning", or "unknown" (the log cannot answer what was asked)
    kind: str
    message: str
    remedy: str
    where: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def timeout_problem(where: str) -> Problem:
    return Problem(
        "error", "timeout", "a collective timed out",
        "one rank stopped progressing: find the first NCCL WARN or the node that died; "
        "run a pair sweep (slurmfabric pairs) to find a slow or broken link",
        where,
    )


def crash(line: str) -> Problem | None:
    """A process that a signal killed: the job failed whatever NCCL printed before."""
    for pattern in _CRASH:
        found = pattern.search(line)
        if found:
            where = line[:found.start() + line.startswith("]", found.start())].strip()[:120]
            return Problem(
                "error", "crash",
                f"a process crashed: signal {found.group('sig')} ({found.group('what').strip()})",
                "the rank died without an NCCL error: read the backtrace under this line "
                "(frames in libnccl point at NCCL or a setting it was given, e.g. NCCL_IB_*); "
                "a core dump or `dmesg` on that node shows the faulting library",
                where,
            )
    return None


def classify_warning(msg: str, where: str = "") -> Problem:
    """Map one ``NCCL WARN`` message to a problem with its usual remedy."""
    if "ibv_modify_qp" in msg:
        return Problem(
            "error", "ibv_modify_qp", msg,
            "the RDMA queue pair could not be connected: on RoCE check the GID index "
            "(NCCL_IB_GID_INDEX; NCCL >= 2.21 picks it itself) and that both ports are ACTIVE "
            "with a route between their IPs; on IB check the subnet manager and port state",
            where,
        )
    if msg.startswith("Cuda failure"):
        # CUDACHECK / CUCHECK (src/include/checks.h, cudawrap.h) WARN and return
        # ncclUnhandledCudaError; the variants that carry on print INFO, not WARN.
        return Problem(
            "error", "cuda", msg,
            "a CUDA call failed in this rank: 'initialization error' or 'no CUDA-capable "
            "device' means the GPU or driver is unusable here (nvidia-smi, Xid lines in "
            "dmesg, the container's GPU access, CUDA_VISIBLE_DEVICES); 'out of memory' "
            "means the GPU is full",
            where,
        )
    completion = _COMPLETION.search(msg)
    if completion:
        status = int(completion.group("st"))
        meaning = WC_STATUS.get(status, f"ibv_wc_status {status}")
        remedy = (
            "check the link: port counters (symbol_error, link_downed), cable and switch "
            "port, and RoCE settings (GID index, traffic class, lossless config)"
            if status in (12, 13)
            else "check GPUDirect RDMA (nvidia_peermem or DMA-BUF), PCIe ACS off on bare "
            "metal, and IOMMU settings; retry with NCCL_NET_GDR_LEVEL=LOC to confirm"
            if status == 4
            else "look for the first error before this one; check the port and its peer"
        )
        return Problem("error", "ib_completion", f"{msg} -> {meaning}", remedy, where)
    lowered = msg.lower()
    if "timeout" in lowered or "timed out" in lowered:
        return timeout_problem(where or msg)
    if "connection closed by remote peer" in lowered or "socket recv failed" in lowered:
        return Problem(
            "error", "peer_lost", msg,
            "another rank died or aborted first: read that rank's log for the first error",
            where,
        )
    if "has already checked in" in msg:
        # bootstrap.cc's root: a second process claimed a rank, so the ring never forms
        return Problem(
            "error", "bootstrap", msg,
            "two processes joined the communicator with the same rank: the launcher started "
            "more processes than the world size or gave two the same RANK (torchrun "
            "--nnodes/--node_rank, srun --ntasks, a stale job on the same MASTER_PORT)",
            where,
        )
    if any(text in lowered for text in _CONNECTION_ERRORS):
        # NCCL retries a refused or timed-out connect with INFO lines and WARNs only when it
        # gives up (misc/socket.cc): a WARN is a failed connection, not noise.
        return Problem(
            "error", "connection", msg,
            "a TCP connection between ranks failed (bootstrap or proxy): check that every "
            "node reaches the others on NCCL_SOCKET_IFNAME's interface (routes, firewall, "
            "MTU), that MASTER_ADDR resolves to that network, and whether the peer it names "
            "died first (its own log)",
            where,
        )
    if msg.startswith("NET/OFI"):
        return Problem(
            "error", "ofi", msg,
            "the libfabric plugin failed: check that the EFA/verbs devices are visible "
            "(/dev/infiniband in the container) and that `fi_info -p efa` lists them",
            where,
        )
    if "libibverbs" in msg:
        return Problem(
            "warning", "no_verbs", msg,
            "libibverbs is missing here, so NCCL cannot use RDMA: install rdma-core "
            "(or use an image that has it) on nodes that have RDMA NICs",
            where,
        )
    return Problem(
        "warning", "nccl_warn", msg, "read the message; it names the failing call", where
    )
