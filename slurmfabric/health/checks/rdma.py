"""RDMA checks: ports up at the expected rate and link layer, error counters, link flaps,
GPUDirect.

By default the port checks judge the rail set: the ports ``slurmfabric topo`` counts as
rails (``plan.rails.choose_rails``, the one owner of that rule), also while a rail is down
or slow. Frontend, storage and other non-rail ports are reported as information only; an
explicit ``rdma_devices`` list in the site config still wins.

Facts come from the topology package's sysfs readers (``/sys/class/infiniband``), read under
the node's configured root so tests use fake trees. Error counters are judged as deltas
between this job's prolog and epilog (a snapshot per job in the state dir); without a
snapshot, absolute limits apply, as most counters only ever grow until a reboot.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

from slurmfabric.health.family import Fact, Family, Gathering, Key
from slurmfabric.health.model import FAIL, OK, WARN, CheckResult, Metric

# Counters that mean link trouble (IBTA PortCounters, kernel sysfs-class-infiniband names).
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
# Allowed increase during one job, unless the site config says otherwise. A downed link or
# integrity error during a job is never normal; a few symbol errors can be.
DEFAULT_DELTA_MAX = {"link_downed": 0, "local_link_integrity_errors": 0, "symbol_error": 10}
DELTA_MAX_OTHER = 100
# Absolute totals without a snapshot (the critical level of Meta's GCM health checks,
# github.com/facebookresearch/gcm).
ABS_MAX_DEFAULT = 100
# Link flaps: this many link_downed increases within the window fail the port. Vendor
# bring-up guides treat two link-downs within 24 h as a flapping link to pull.
FLAP_THRESHOLD_DEFAULT = 2
FLAP_WINDOW_H_DEFAULT = 24.0


@dataclass(frozen=True)
class PortFacts:
    name: str  # "mlx5_0:1"
    state: str
    phys_state: str
    rate_gbps: float | None
    link_layer: str
    counters: dict[str, int | None]
    # RoCE: times the port's netdev lost its carrier (None: not Ethernet, or unreadable).
    # The flap history counts these instead of link_downed, which a RoCE port's PMA
    # need not count for an Ethernet link going down.
    carrier_downs: int | None = None


@dataclass(frozen=True)
class RdmaFacts:
    ports: list[PortFacts]
    gdr_mode: str  # "peermem", "dmabuf", "none"
    gdr_evidence: str
    # The rail positions (plan.rails: rails, down rails, slow rails by a GPU; the EFA
    # devices on an EFA node), None when the rail rule found none (no uverbs device, no
    # GID visible): then only what the site config names is judged (``_selected``).
    rails: tuple[str, ...] | None = None
    not_rails: dict[str, str] = field(default_factory=dict)  # port -> why it is no rail
    # link_downed increases per port within the flap window (None: no earlier sample yet)
    flaps: dict[str, int | None] = field(default_factory=dict)
    flap_window_s: float = FLAP_WINDOW_H_DEFAULT * 3600
    rails_unknown: str = ""  # why no rail is known (the rail rule's most common reason)


def collect(root: str, history: str | None = None,
            window_s: float = FLAP_WINDOW_H_DEFAULT * 3600) -> RdmaFacts:
    """Read ports, their rail roles and GPUDirect support under ``root`` (the node's sysfs
    root). ``history``: the state file of link_downed samples the flap check counts in."""
    from slurmfabric._common.sysfs import Root
    from slurmfabric.plan.rails import choose_rails
    from slurmfabric.topology import discover_with_reader
    from slurmfabric.topology._io import Reader
    from slurmfabric.topology.numa import discover_gdr
    from slurmfabric.topology.rdma import discover_rdma

    reader = Reader(Root(root))
    slots: tuple[str, ...] = ()
    not_rails: dict[str, str] = {}
    unknown = ""
    try:  # sysfs GPUs are enough for the PCIe distances the rail rule needs
        topo = discover_with_reader(reader, nvml=False)
        found, gdr = topo.ports, topo.gdr
        choice = choose_rails(topo)
        slots = tuple(p.name for p in choice.slots)
        not_rails = {name: why for name, why in choice.excluded.items() if name not in slots}
        reasons = list(choice.excluded.values())
        if reasons:
            unknown = max(reasons, key=reasons.count)
    except Exception as exc:  # an odd tree must not stop the port checks
        found = tuple(p for dev in discover_rdma(reader) for p in dev.ports)
        gdr = discover_gdr(reader)
        unknown = f"the rail rule failed: {type(exc).__name__}"
    ports = [
        PortFacts(p.name, p.state, p.phys_state, p.rate_gbps, p.link_layer,
                  {k: v for k, v in p.counters.items() if k in ERROR_COUNTERS},
                  carrier_downs(reader, p.netdev) if p.link_layer == "Ethernet" else None)
        for p in found
    ]
    flaps = record_link_downed(history, ports, window_s) if history else {}
    return RdmaFacts(ports, gdr.mode, gdr.evidence, slots or None, not_rails, flaps,
                     window_s, "" if slots else (unknown or "no RDMA port"))


def carrier_downs(reader, netdev: str | None) -> int | None:
    """``carrier_down_count`` of the netdev (Linux >= 4.19), else half of
    ``carrier_changes`` (each flap is a down and an up), Documentation/ABI/testing/
    sysfs-class-net. A VF representor or a netdev in another namespace reads as None."""
    if not netdev or "/" in netdev:
        return None
    base = f"/sys/class/net/{netdev}"
    downs = reader.int(f"{base}/carrier_down_count")
    if downs is not None:
        return downs
    changes = reader.int(f"{base}/carrier_changes")
    return None if changes is None else changes // 2


def record_link_downed(path: str, ports: list[PortFacts], window_s: float,
                       now: float | None = None) -> dict[str, int | None]:
    """Add this run's link_downed values (a RoCE port's carrier downs) to the history in
    ``path`` and count, per port, the increases within the last ``window_s`` seconds.

    The history keeps only changes (time, value), plus the last one before the window as the
    baseline, so a node checked every minute stores a few lines. A counter that went down
    (a reboot or driver reload resets it) starts over from its new value. A port seen for
    the first time has no baseline: None, like the first run of gpu.xid's cursor."""
    from slurmfabric._common import files

    now = time.time() if now is None else now
    start = now - window_s
    saved = files.read_json_or_none(path)
    known = saved.get("ports", {}) if isinstance(saved, dict) else {}
    history: dict[str, list[list[float]]] = {}
    counts: dict[str, int | None] = {}
    for port in ports:
        value = (port.carrier_downs if port.carrier_downs is not None
                 else port.counters.get("link_downed"))
        raw = known.get(port.name)
        samples = [s for s in raw if _sample(s)] if isinstance(raw, list) else []
        if value is not None and (not samples or samples[-1][1] != value):
            samples.append([now, value])
        if not samples:
            continue
        before = [s for s in samples if s[0] < start]
        inside = [s for s in samples if s[0] >= start]
        kept = before[-1:] + inside
        history[port.name] = kept
        if len(samples) == 1 and raw is None:
            counts[port.name] = None
            continue
        total = 0
        for old, new in zip(kept, kept[1:]):
            total += new[1] - old[1] if new[1] >= old[1] else new[1]
        counts[port.name] = int(total)
    # An unwritable state dir must not fail the port checks that share these facts.
    with contextlib.suppress(OSError):
        files.write_json(path, {"window_s": window_s, "ports": history})
    return counts


def _sample(item: object) -> bool:
    """A (time, value) pair; JSON also reads NaN, Infinity and 1e999, which no counter is."""
    return (isinstance(item, list) and len(item) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                    and math.isfinite(x) for x in item))


def _selected(facts: RdmaFacts, expect: dict) -> list[PortFacts]:
    """Ports named in ``rdma_devices`` (``mlx5_0`` = all its ports, ``mlx5_0:1`` one port),
    else the rail set; with no rail known, the ports in the site's ``rdma_link_layer``, else
    every port (then only counted, see ``check_ports``). In discovery order."""
    wanted = list(expect.get("rdma_devices") or [])
    if wanted:
        return [p for p in facts.ports if p.name in wanted or p.name.split(":")[0] in wanted]
    if facts.rails is not None:
        return [p for p in facts.ports if p.name in facts.rails]
    layer = expect.get("rdma_link_layer")
    return [p for p in facts.ports if not layer or p.link_layer == layer]


def _not_judged(facts: RdmaFacts, expect: dict, ports: list[PortFacts]) -> str:
    """The ports left out, with why (information only, never a failure)."""
    judged = {p.name for p in ports}
    if expect.get("rdma_devices"):
        why = "not in rdma_devices"
    elif facts.rails is None:
        why = f"rail set unknown, not in the site's rdma_link_layer {expect.get('rdma_link_layer')}"
    else:
        why = "not a rail"
    return "; ".join(f"{p.name} ({facts.not_rails.get(p.name) or why})"
                     for p in facts.ports if p.name not in judged)


def check_ports(facts: RdmaFacts, expect: dict, ctx) -> CheckResult:
    """The rails (or the site's ``rdma_devices``) up, at ``rdma_rate_gbps``, in
    ``rdma_link_layer``. With no rail known (``facts.rails`` None) a port is judged only
    where the site config names its ports (devices or link layer), else only the number of
    healthy ports against ``rdma_ports``: a frontend or BlueField port at its own speed or
    state never drains a node on a guess."""
    ports = _selected(facts, expect)
    want_n, want_rate = expect.get("rdma_ports"), expect.get("rdma_rate_gbps")
    want_layer = expect.get("rdma_link_layer")
    named = bool(expect.get("rdma_devices") or want_layer)
    unknown = facts.rails is None and not expect.get("rdma_devices")
    # rail set unknown and no port named: no single port can fail the node, only too few
    # healthy ports (rdma_ports) can
    per_port = not unknown or named
    judge_rate = bool(want_rate) and per_port
    bad, values, metrics = [], {}, []
    for name in expect.get("rdma_devices") or []:
        if not any(p.name == name or p.name.split(":")[0] == name for p in facts.ports):
            bad.append(f"{name} missing")
    healthy = 0
    for port in ports:
        dev, _, num = port.name.partition(":")
        labels = (("device", dev), ("port", num))
        values[port.name] = (f"{port.state}/{port.phys_state} {port.rate_gbps} Gb/s "
                             f"{port.link_layer}")
        metrics.append(Metric("slurmfabric_rdma_port_active", 1.0 if port.state == "ACTIVE"
                              and port.phys_state == "LinkUp" else 0.0, labels))
        if port.rate_gbps is not None:
            metrics.append(Metric("slurmfabric_rdma_port_rate_gbps", port.rate_gbps, labels))
        problems = []
        if port.state != "ACTIVE" or port.phys_state != "LinkUp":
            problems.append(f"{port.state}/{port.phys_state}")
        if judge_rate and (port.rate_gbps or 0) < float(want_rate):
            problems.append(f"at {port.rate_gbps:g} Gb/s, expected {want_rate}"
                            if port.rate_gbps is not None else "rate unreadable")
        if want_layer and port.link_layer != want_layer:
            problems.append(f"link layer {port.link_layer}, expected {want_layer}")
        if not problems:
            healthy += 1
        elif per_port:
            bad.append(f"{port.name} {' '.join(problems)}")
    if want_n is not None and len(ports) < int(want_n):
        bad.insert(0, f"{len(ports)} RDMA ports found, expected {want_n}")
    elif want_n is not None and not per_port and healthy < int(want_n):
        bad.insert(0, f"{healthy} RDMA ports up, expected {want_n} (rail set unknown: "
                      f"{facts.rails_unknown})")
    values["healthy_ports"] = healthy
    skipped = _not_judged(facts, expect, ports)
    info = []
    if unknown:
        values["rail_set"] = f"unknown ({facts.rails_unknown})"
        judged = (f"judged the {want_layer} ports" if want_layer
                  else "no port judged alone, only how many are up")
        info.append(f"rail set unknown ({facts.rails_unknown}): {judged}")
    if skipped:
        values["not_judged"] = skipped
        others = [p.name for p in facts.ports if p not in ports]
        if not expect.get("rdma_devices"):  # said where health check shows it, never drains
            info.append(("not judged: " if unknown else "not rails, not judged: ")
                        + ", ".join(others))
    status = FAIL if bad else OK
    return CheckResult("rdma.ports", status, "; ".join(bad) or "; ".join(info), values,
                       tuple(metrics))


def check_counters(facts: RdmaFacts, expect: dict, ctx) -> CheckResult:
    """Deltas against the prolog's snapshot of this job; absolute limits otherwise."""
    before = ctx.counters_before  # {port: {counter: value}} or None
    delta_max = {**DEFAULT_DELTA_MAX, **(expect.get("counter_delta_max") or {})}
    abs_max = expect.get("counter_abs_max") or {}
    bad, values, metrics = [], {}, []
    mode = "delta" if before is not None else "absolute"
    for port in _selected(facts, expect):
        dev, _, num = port.name.partition(":")
        for counter, value in sorted(port.counters.items()):
            if value is None:  # "N/A (no PMA)"
                continue
            metrics.append(Metric("slurmfabric_rdma_port_counter", value,
                                  (("device", dev), ("port", num), ("counter", counter))))
            old = (before or {}).get(port.name, {}).get(counter)
            if before is not None and old is not None and value >= old:
                change, limit = value - old, delta_max.get(counter, DELTA_MAX_OTHER)
                if change:
                    values[f"{port.name} {counter}"] = f"+{change}"
                if change > limit:
                    bad.append(f"{port.name} {counter} +{change} during the job (limit {limit})")
            else:  # no snapshot, or the counter went down (port reset, driver reload)
                limit = abs_max.get(counter, ABS_MAX_DEFAULT)
                if value:
                    values[f"{port.name} {counter}"] = value
                if value > limit:
                    bad.append(f"{port.name} {counter}={value} (limit {limit})")
    values["mode"] = mode
    return CheckResult("rdma.counters", FAIL if bad else OK, "; ".join(bad), values,
                       tuple(metrics))


def check_gdr(facts: RdmaFacts, expect: dict, ctx) -> CheckResult:
    """GPUDirect RDMA possible through a peer-memory module or DMA-BUF (either is fine)."""
    want = expect.get("gdr")
    values = {"mode": facts.gdr_mode, "evidence": facts.gdr_evidence}
    metric = (Metric("slurmfabric_rdma_gdr_available", 0.0 if facts.gdr_mode == "none" else 1.0),)
    if facts.gdr_mode != "none":
        return CheckResult("rdma.gdr", OK, "", values, metric)
    if want is False:
        return CheckResult("rdma.gdr", OK, "not required", values, metric)
    # Required explicitly, or implied when both GPUs and RDMA ports are expected.
    implied = want is None and bool(expect.get("gpus")) and bool(facts.ports)
    if want or implied:
        return CheckResult("rdma.gdr", FAIL, f"no GPUDirect RDMA: {facts.gdr_evidence}",
                           values, metric)
    return CheckResult("rdma.gdr", WARN if facts.ports else OK, facts.gdr_evidence, values,
                       metric)


def check_link_flaps(facts: RdmaFacts, expect: dict, ctx) -> CheckResult:
    """A port whose link went down ``link_flap_threshold`` times or more within
    ``link_flap_window_h`` hours: it passes every state check while it is up, and drops
    NCCL's connections each time it goes down. Counted across hook runs from link_downed
    (IBTA PortCounters LinkDownedCounter, /sys/class/infiniband/DEV/ports/N/counters/
    link_downed, Documentation/ABI/stable/sysfs-class-infiniband), on RoCE ports from the
    netdev's carrier downs (``carrier_downs``)."""
    limit = int(expect.get("link_flap_threshold") or FLAP_THRESHOLD_DEFAULT)
    hours = facts.flap_window_s / 3600
    bad, values, metrics = [], {}, []
    fresh = 0
    for port in _selected(facts, expect):
        if port.name not in facts.flaps:
            continue
        count = facts.flaps[port.name]
        if count is None:
            fresh += 1
            continue
        dev, _, num = port.name.partition(":")
        metrics.append(Metric("slurmfabric_rdma_port_link_downs_window", float(count),
                              (("device", dev), ("port", num))))
        if count:
            values[port.name] = count
        if count >= limit:
            bad.append(f"{port.name} link went down {count} times in {hours:g} h "
                       f"(limit {limit})")
    values["window_h"] = hours
    if fresh:
        values["first_sample"] = fresh  # no baseline yet: counted from the next run
    return CheckResult("rdma.link_flaps", FAIL if bad else OK, "; ".join(bad), values,
                       tuple(metrics))


def snapshot(facts: RdmaFacts) -> dict[str, dict[str, int | None]]:
    """What the prolog stores for the epilog's deltas."""
    return {p.name: dict(p.counters) for p in facts.ports}


def enabled(expect: dict) -> bool:
    want = expect.get("rdma_ports")
    if want is not None:
        return int(want) > 0
    from slurmfabric._common.sysfs import Root, list_dir

    return bool(list_dir(Root(str(expect.get("sysfs_root") or "/"))("/sys/class/infiniband")))


CHECKS = {
    "rdma.ports": (check_ports, "fail", ("prolog", "epilog", "check", "periodic")),
    "rdma.counters": (check_counters, "pass", ("epilog", "check")),
    "rdma.link_flaps": (check_link_flaps, "pass", ("prolog", "epilog", "check", "periodic")),
    "rdma.gdr": (check_gdr, "fail", ("prolog", "check")),
}


def _collect(run: Gathering, timeout: float) -> RdmaFacts:
    from slurmfabric._common.files import safe_name

    history = run.cfg.state_dir / f"link-downed.{safe_name(run.ctx.node)}.json"
    window_h = float(run.expect["link_flap_window_h"])
    return collect(str(run.expect.get("sysfs_root") or "/"), str(history), window_h * 3600)


FAMILY = Family("rdma", keys={
    "rdma_ports": Key(None, (0, 1024), integer=True),  # None: check the ports found; 0: none
    "rdma_rate_gbps": Key(None, (1, 10000)),
    "rdma_link_layer": Key(None, choices=("InfiniBand", "Ethernet")),
    "rdma_devices": Key([], kind="strings"),  # ["mlx5_0", "mlx5_1:1"]: only these
    "gdr": Key(None, kind="flag"),  # True: require GPUDirect RDMA; None: when GPUs+RDMA
    "counter_delta_max": Key({}, kind="numbers", integer=True),  # allowed growth in one job
    "counter_abs_max": Key({}, kind="numbers", integer=True),  # when no prolog snapshot
    "link_flap_threshold": Key(FLAP_THRESHOLD_DEFAULT, (1, 100000), integer=True),
    "link_flap_window_h": Key(FLAP_WINDOW_H_DEFAULT, (0.01, 8760)),
}, facts=(Fact("rdma", _collect, CHECKS, gate=lambda run: enabled(run.expect),
               # the epilog's counter deltas and the flap history start from the prolog's
               baseline=lambda run: True,
               events=frozenset({"rdma.counters", "rdma.link_flaps"})),))
