"""RoCE checks: each RoCE port against the site's lossless profile (``rdma.roce_qos``), and
its loss and pause-storm counters as deltas over a job (``rdma.roce_counters``).

The facts come from slurmfabric/roce/facts.py (sysfs under the node's root, ``ethtool -S``,
``mlnx_qos`` or iproute2 ``dcb``), the ports in parallel threads so that eight RoCE rails
cost one tool run's time. A setting that could not be read is never a failure: the check
says what it could not see (warn when the profile needs it).
"""

from __future__ import annotations

import os
import threading

from slurmfabric.health.family import Fact, Family, Key, table_problem
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult, Metric


def enabled(expect: dict) -> bool:
    """RoCE checks run where the node has an Ethernet-link-layer RDMA port (read from
    sysfs: one small file per port), or the site declared a profile."""
    if expect.get("rdma_ports") == 0:
        return False
    if expect.get("roce_profile") or expect.get("rdma_link_layer") == "Ethernet":
        return True
    root = str(expect.get("sysfs_root") or "/")
    base = os.path.join(root, "sys/class/infiniband")
    try:
        devices = os.listdir(base)
    except OSError:
        return False
    for dev in devices:
        try:
            ports = os.listdir(os.path.join(base, dev, "ports"))
        except OSError:
            continue
        for port in ports:
            try:
                with open(os.path.join(base, dev, "ports", port, "link_layer")) as handle:
                    if handle.read(32).strip() == "Ethernet":
                        return True
            except OSError:
                continue
    return False


def tools_for(expect: dict, timeout: float):
    """The tools a hook runs. mlnx_qos (a Python program, ~0.3 s a port) and dcb only
    where a profile asks for trust and PFC; the counters need ethtool alone."""
    from slurmfabric.roce.facts import Tools

    profiled = bool(expect.get("roce_profile"))
    return Tools(ethtool=expect.get("ethtool") or None,
                 mlnx_qos=(expect.get("mlnx_qos") or None) if profiled else None,
                 dcb=(expect.get("dcb") or None) if profiled else None, timeout=timeout)


def collect(expect: dict, timeout: float) -> list:
    """Every RoCE port's facts, one thread per port."""
    from slurmfabric.roce.facts import collect_port, roce_ports

    root = str(expect.get("sysfs_root") or "/")
    tools = tools_for(expect, timeout)
    ports = roce_ports(root)
    results: list = [None] * len(ports)

    def one(i: int, dev: str, port: int, netdev: str | None) -> None:
        results[i] = collect_port(root, dev, port, netdev, tools)

    threads = [threading.Thread(target=one, args=(i, *p), daemon=True)
               for i, p in enumerate(ports)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None]


def profile_from(expect: dict):
    from slurmfabric.roce.profile import Profile

    table = dict(expect.get("roce_profile") or {})
    return Profile(**table, delta_max=dict(expect.get("roce_delta_max") or {}))


def _selected(ports: list, expect: dict) -> list:
    wanted = list(expect.get("rdma_devices") or [])
    return [p for p in ports if not wanted or p.name in wanted or p.device in wanted]


def check_qos(ports: list, expect: dict, ctx) -> CheckResult:
    from slurmfabric.roce.profile import differences

    profile = profile_from(expect)
    declared = bool(expect.get("roce_profile"))
    bad, unseen, values, metrics = [], [], {}, []
    for port in _selected(ports, expect):
        labels = (("device", port.device), ("port", str(port.port)))
        values[port.name] = {k: v for k, v in port.to_dict().items()
                             if k in ("netdev", "mtu", "trust", "pfc", "ecn_np", "ecn_rp",
                                      "roce_tos", "cnp_dscp")}
        diffs = differences(port, profile)
        metrics.append(Metric("slurmfabric_roce_port_profile_ok", 0.0 if diffs else 1.0,
                              labels))
        if diffs:
            bad.append(f"{port.label()}: " + "; ".join(diffs))
        needed = _needed_unseen(port, profile) if declared else []
        if needed:
            unseen.append(f"{port.label()} could not see " + "; ".join(needed))
    if bad:
        return CheckResult("rdma.roce_qos", FAIL, "; ".join(bad + unseen), values,
                           tuple(metrics))
    if unseen:
        return CheckResult("rdma.roce_qos", WARN, "; ".join(unseen), values, tuple(metrics))
    return CheckResult("rdma.roce_qos", OK, "" if declared else "no roce_profile declared",
                       values, tuple(metrics))


def _needed_unseen(port, profile) -> list[str]:
    """The profile's settings this port's facts could not show (the reasons are in
    ``port.unseen``)."""
    out = []
    if profile.trust and port.trust is None:
        out.append("trust")
    if profile.pfc_priorities is not None and port.pfc is None:
        out.append("PFC")
    if profile.ecn is not None and (port.ecn_np is None or port.ecn_rp is None):
        out.append("ECN")
    if profile.roce_tos is not None and port.roce_tos is None:
        out.append("RoCE ToS")
    if profile.mtu is not None and port.mtu is None:
        out.append("MTU")
    if out:
        why = "; ".join(port.unseen[:3])
        out[-1] += f" ({why})" if why else ""
    return out


def check_counters(ports: list, expect: dict, ctx) -> CheckResult:
    """Loss and pause-storm counters as deltas against this job's prolog; without a
    snapshot only the values are reported (their totals since boot say nothing of a job)."""
    from slurmfabric.roce.profile import CONGESTION, DEFAULT_DELTA_MAX, PAUSE

    before = ctx.roce_before
    limits = {**DEFAULT_DELTA_MAX, **(expect.get("roce_delta_max") or {})}
    bad, values, metrics = [], {}, []
    for port in _selected(ports, expect):
        old = (before or {}).get(port.name) or {}
        for counter, value in sorted(port.counters.items()):
            metrics.append(Metric("slurmfabric_roce_port_counter", float(value),
                                  (("device", port.device), ("port", str(port.port)),
                                   ("counter", counter))))
            start = old.get(counter)
            if before is None or start is None or value < start:
                continue  # no starting point (or the counter was reset): nothing to judge
            change = value - start
            if change and (counter in limits or counter in PAUSE or counter in CONGESTION):
                values[f"{port.name} {counter}"] = f"+{change}"
            if counter in limits and change > limits[counter]:
                bad.append(f"{port.label()} {counter} +{change} during the job "
                           f"(limit {limits[counter]})")
    values["mode"] = "delta" if before is not None else "no prolog snapshot"
    return CheckResult("rdma.roce_counters", FAIL if bad else OK, "; ".join(bad), values,
                       tuple(metrics))


def snapshot(ports) -> dict | None:
    """What the prolog stores for the epilog's deltas."""
    if not isinstance(ports, list):
        return None
    return {p.name: dict(p.counters) for p in ports}


CHECKS = {
    "rdma.roce_qos": (check_qos, "pass", ("prolog", "check", "periodic")),
    "rdma.roce_counters": (check_counters, "pass", ("epilog", "check")),
}


# roce_profile keys: (rule, what the value must be); the fields of roce/profile.py Profile,
# whose delta_max comes from roce_delta_max instead.
_PROFILE = {
    "trust": (lambda v: v in ("dscp", "pcp"), '"dscp" or "pcp"'),
    "pfc_priorities": (lambda v: isinstance(v, list) and all(
        isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= 7 for p in v)
        and len(set(v)) == len(v), "a list of priorities 0-7, e.g. [3]"),
    "ecn": (lambda v: isinstance(v, bool), "true or false"),
    "roce_tos": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255,
                 "a ToS byte 0-255, e.g. 106 (DSCP 26)"),
    "mtu": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 1280 <= v <= 9216,
            "the netdev MTU 1280-9216, e.g. 4200"),
    "cnp_dscp": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 63,
                 "a DSCP 0-63, e.g. 48"),
}


def profile_problem(value: object) -> str | None:
    from slurmfabric._common.textcheck import one_line

    def entry(name: str, item: object) -> str | None:
        rule = _PROFILE.get(name)
        if rule is None:
            return (f"roce_profile.{one_line(repr(name))} is not a profile key; use "
                    f"{', '.join(_PROFILE)}")
        if not rule[0](item):
            return f"roce_profile.{name} = {one_line(repr(item))[:60]} should be {rule[1]}"
        return None

    return table_problem(value, "roce_profile", '{ trust = "dscp", pfc_priorities = [3], '
                         "ecn = true, roce_tos = 106, mtu = 4200 }", entry)


FAMILY = Family("roce", keys={
    # the declared lossless profile, e.g. {trust = "dscp", pfc_priorities = [3], ecn = true,
    # roce_tos = 106, mtu = 4200}; only keys set are checked
    "roce_profile": Key({}, check=profile_problem),
    "roce_delta_max": Key({}, kind="numbers", integer=True),  # counter -> growth in one job
    "ethtool": Key("/usr/sbin/ethtool"),
    "mlnx_qos": Key("/usr/bin/mlnx_qos"),  # MLNX_OFED / mlnx-tools; "" to use dcb only
    "dcb": Key("/usr/sbin/dcb"),  # iproute2
}, facts=(Fact("roce", lambda run, t: collect(run.expect, t), CHECKS,
               gate=lambda run: enabled(run.expect),
               # the epilog's loss counters start from the prolog's
               baseline=lambda run: run.cfg.policy("rdma.roce_counters").enabled,
               events=frozenset({"rdma.roce_counters"})),))
