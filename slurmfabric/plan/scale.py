"""NCCL settings for scale: what each does, when it helps, the value for this fabric and node
count, and where that comes from. The plan and the user set NCCL variables; this module only
explains them and warns about values that contradict NCCL's own rules. User values always win.

Sources (NCCL's environment variables page, docs.nvidia.com/deeplearning/nccl/user-guide/
docs/env.html, "ENV" below, and NCCL's source, src/transport/net_ib*.cc, "SRC"):
- NCCL_IB_TIMEOUT: the QP's local ACK timeout, 4.096 us x 2^N (InfiniBand Architecture
  Specification vol. 1, 9.7.6.1.3; ibv_modify_qp(3) ``timeout``, a 5-bit field, so 0-31).
  NCCL's default is 20 (SRC: ``NCCL_PARAM(IbTimeout, "IB_TIMEOUT", 20)``; 18 and 14 in
  older releases). ENV: increasing it can help on very large networks, e.g. when NCCL fails
  on ``ibv_poll_cq`` with error 12 (transport retry counter exceeded).
- NCCL_IB_RETRY_CNT: retries before that error, default 7 (SRC), a 3-bit field (0-7).
- NCCL_IB_QPS_PER_CONNECTION: queue pairs per connection, default 1. ENV: "useful on
  multi-level fabrics which need multiple queue pairs to have good routing entropy": an
  Ethernet fabric's ECMP hashes each QP onto one path (RoCE v2's UDP source port), so one
  QP per connection uses one spine however many there are.
- NCCL_BUFFSIZE: the buffer per channel and peer for the Simple protocol, default 4 MiB (ENV);
  larger costs GPU memory per channel and peer.
- NCCL_ALGO / NCCL_PROTO: ENV lists them among the settings that should not stay in scripts:
  NCCL's tuner picks per size (src/graph/tuning.cc), and a forced choice slows the sizes it
  does not suit.
- NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD (sockets): default 1 each; ENV: "for generic
  100G networks" 4 and 4; NTHREADS at most 16, and their product at most 64.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
SRC = "NCCL src/transport/net_ib (NCCL_PARAM defaults)"
IB_TIMEOUT_DEFAULT = 20
RETRY_DEFAULT = 7
RDMA = ("ib", "roce")


@dataclass(frozen=True)
class Advice:
    name: str
    now: str | None  # the value the job will run with, None: NCCL's default
    what: str
    when: str
    value: str  # for this fabric and node count
    source: str

    def line(self) -> str:
        """One line, safe inside a shell comment: a value's control bytes are escaped."""
        from slurmfabric._common.textcheck import one_line

        now = "NCCL's default" if self.now is None else one_line(self.now, 80)
        return (f"{self.name} ({now}): {self.what}; {self.when}; here: {self.value} "
                f"[{self.source}]")


def _timeout_s(n: int) -> float:
    return 4.096e-6 * 2 ** n


def advice(fabric: str, nodes: int, env: Mapping[str, str]) -> list[Advice]:
    """One entry per setting that matters for this fabric and scale, or that is set."""
    out: list[Advice] = []
    rdma = fabric in RDMA or (fabric == "auto" and "NCCL_IB_DISABLE" not in env)
    if rdma or "NCCL_IB_TIMEOUT" in env:
        out.append(Advice(
            "NCCL_IB_TIMEOUT", env.get("NCCL_IB_TIMEOUT"),
            f"each send waits 4.096 us x 2^N for its ACK before a retry ({IB_TIMEOUT_DEFAULT}:"
            f" {_timeout_s(IB_TIMEOUT_DEFAULT):.1f} s, x {RETRY_DEFAULT} retries)",
            "raise it (22: 17 s a try) only where collectives fail with ibv_poll_cq error 12 "
            "on a large or congested fabric",
            f"the default {IB_TIMEOUT_DEFAULT} at {nodes} node(s)", f"{ENV}; {SRC}"))
    if "NCCL_IB_RETRY_CNT" in env:
        out.append(Advice("NCCL_IB_RETRY_CNT", env["NCCL_IB_RETRY_CNT"],
                          "retries before error 12", "7 is the most the field holds",
                          f"the default {RETRY_DEFAULT}", SRC))
    if fabric == "roce" or "NCCL_IB_QPS_PER_CONNECTION" in env:
        spread = nodes > 1 and fabric == "roce"
        out.append(Advice(
            "NCCL_IB_QPS_PER_CONNECTION", env.get("NCCL_IB_QPS_PER_CONNECTION"),
            "queue pairs per connection; ECMP hashes each QP onto one path",
            "more than 1 spreads a connection over the spines of a multi-level Ethernet "
            "fabric; InfiniBand's adaptive routing spreads one QP already",
            "4 where the nodes span more than one leaf" if spread else "1 (the default)",
            ENV))
    if "NCCL_BUFFSIZE" in env:
        out.append(Advice("NCCL_BUFFSIZE", env["NCCL_BUFFSIZE"],
                          "buffer per channel and peer (Simple protocol)",
                          "larger costs GPU memory per channel and peer", "4194304 (4 MiB)",
                          ENV))
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        if name in env:
            out.append(Advice(name, env[name], "forces one algorithm/protocol for every size",
                              "a workaround or a benchmark, not a production setting",
                              "unset: NCCL's tuner picks per size", ENV))
    if fabric == "tcp" or {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"} & set(env):
        for name in ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"):
            out.append(Advice(name, env.get(name), "socket threads x sockets per thread per "
                              "connection", "more streams fill a fast Ethernet link",
                              "4 on 100 Gb/s and faster (4 x 4 = 16 sockets)"
                              if nodes > 1 else "1 (the default: one node sends nothing)",
                              ENV))
    return out


def _int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name]) if name in env else None
    except ValueError:
        return None


def warnings(fabric: str, nodes: int, env: Mapping[str, str], where: str = "") -> list[str]:
    """Values that contradict NCCL's rules or the fabric, one line each naming the variable."""
    out: list[str] = []
    timeout = _int(env, "NCCL_IB_TIMEOUT")
    if "NCCL_IB_TIMEOUT" in env and (timeout is None or not 0 <= timeout <= 31):
        out.append(f"{where}NCCL_IB_TIMEOUT={env['NCCL_IB_TIMEOUT']!r}: the field holds 0-31 "
                   f"(4.096 us x 2^N); NCCL's default is {IB_TIMEOUT_DEFAULT}")
    elif timeout is not None and timeout < IB_TIMEOUT_DEFAULT and nodes > 1:
        out.append(f"{where}NCCL_IB_TIMEOUT={timeout}: {_timeout_s(timeout):.2f} s a try, "
                   f"shorter than NCCL's default {IB_TIMEOUT_DEFAULT} "
                   f"({_timeout_s(IB_TIMEOUT_DEFAULT):.1f} s): a congested fabric then fails "
                   "with error 12")
    retry = _int(env, "NCCL_IB_RETRY_CNT")
    if "NCCL_IB_RETRY_CNT" in env and (retry is None or not 0 <= retry <= 7):
        out.append(f"{where}NCCL_IB_RETRY_CNT={env['NCCL_IB_RETRY_CNT']!r}: the field holds "
                   "0-7 (NCCL's default 7)")
    for name in ("NCCL_ALGO", "NCCL_PROTO"):
        if name in env:
            out.append(f"{where}{name}={env[name]!r}: forces one choice for every message "
                       "size; NCCL's documentation keeps it for debugging and workarounds")
    threads, socks = _int(env, "NCCL_SOCKET_NTHREADS"), _int(env, "NCCL_NSOCKS_PERTHREAD")
    if threads is not None and threads > 16:
        out.append(f"{where}NCCL_SOCKET_NTHREADS={threads}: NCCL takes at most 16")
    if threads is not None and socks is not None and threads * socks > 64:
        out.append(f"{where}NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = {threads * socks}: "
                   "NCCL takes at most 64")
    if fabric == "tcp":
        ib = sorted(k for k in env if k.startswith("NCCL_IB_") and k != "NCCL_IB_DISABLE")
        if ib:
            out.append(f"{where}{', '.join(ib)}: fabric.type is tcp, so NCCL never reads them")
    return out
