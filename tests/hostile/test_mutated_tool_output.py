"""Real tool output, mutated: every parser of text a user hands us must either read it or
raise slurmfabric's own error, and must stay linear on long hostile lines.

The inputs are the recorded real outputs under tests/fixtures/ (sources in each folder's
SOURCES.md): NCCL logs, nccl-tests output, iblinkinfo, ibstat, perfquery, ibnetdiscover, and
what the health hooks read as root: nvidia-smi nvlink -s/-e and -q, dcgmi diag -j and
kernel-log records with Xids (each parsed and then judged by its check, which may only
refuse with a ProbeError: a crash would turn a check into a checker error).
Each mutation replaces the k-th word of every line with one hostile value (an overlong
number, a Unicode digit, NaN, a word where a number goes, ...), so every field of every
format meets every value. The long-line cases repeat the literal pieces of each format's
patterns 65,000 characters long behind prefixes that reach each branch: a backtracking
regex there takes tens of seconds (a 64 KiB line once took 30 s in nccl-log), a linear
one milliseconds; the deadline is a hang guard, not a speed goal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmfabric._common.probe import ProbeError
from slurmfabric.errors import SlurmfabricError
from slurmfabric.health.checks import clocks, dcgm, nvlink, rdma, xid
from slurmfabric.health.checks import versions as versions_check
from slurmfabric.health.model import Context
from slurmfabric.ibaudit import parse as ib_parse
from slurmfabric.nccl import log as nccl_log
from slurmfabric.nccl import tests as nccl_tests
from slurmfabric.pairsweep import perftest
from slurmfabric.roce import parse as roce_parse

pytestmark = pytest.mark.hostile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WORDS = ["9" * 5000, "²", "٣", "x", "-1", "nan", "inf", "1e999", "0x", "", "[", "'", '"', ":",
         "\x00", "\u202e"]
LONG = 65_000  # under the 64 KiB line cap of slurmfabric._common.inputfile.iter_log_lines
PIECES = ["x", "9", " ", "\t", ":", "[0]", "[0] ", "a:1:", "h:1:2 ", " via ", ";", "0x1", "'",
          "(", ")", "Gbps", ".", "NCCL INFO ", "# ", "=", '"', "[", "]", "CA: ", "X", "==(",
          ")==>", "#", "/", " -> 2", "<stdout>:", "[1,0]<stdout>:", "0000:01:00.0", "NVRM: "]
PREFIXES = ["", "NCCL INFO ", "h:1:2 [0] NCCL INFO ", "h:1:2 [0] NCCL INFO NET/IB : Using ",
            "h:1:2 [0] NCCL INFO Channel 00 : ", "h:1:2 [0] NCCL INFO Channel 00/02 :",
            "h:1:2 [0] NCCL INFO GPU Direct RDMA Enabled for HCA 0 '",
            "h:1:2 [0] NCCL INFO NCCL_X set by environment to ",
            "h:1:2 [0] NCCL INFO Bootstrap : Using ", "h:1:2 [0] NCCL WARN ",
            "# nThread ", "#  Out of bounds values : ", "[1,0]<stdout>:", "0: ", "#  Rank  0 ",
            "CA: ", "Switch: 0x1 ", "   0x1  1  1[  ] ==( ", "# Port counters: Lid 1 port 1 ",
            "CA '", "Port 1:", "switchguid=0x", 'Switch\t36 "', '[1]\t"', "     ",
            "GPU 0: ", "\t Link 0: ", "Link 0: Replay Errors: ", "NVRM: Xid (PCI:0000:01:00): ",
            "3,1,1,-;NVRM: Xid (", "GPU ", '{"DCGM Diagnostic": ',
            "h:1:2 [0] NCCL INFO init.cc:1 -> ", "h:1:2 [0] NCCL INFO a.cc:1 -> 2 [",
            "h:1:2 [0] p.cc:1 NCCL WARN Failed to execute operation Connect, retcode ",
            "        [1,0]<stdout>:", "gpu001: 0: ", "NVRM: The NVIDIA GPU ",
            "NVRM: GPU 0000:01:00.0: RmInitAdapter failed! ", "NVRM: fallen off the bus ",
            " #bytes     #iterations    BW peak[Gb/sec] ", " 65536      5000 ",
            "[h:1 :0:1] Caught signal ", "[h:1] Signal: ",
            "h:1:2 [0] a.cc:1 NCCL WARN Cuda failure ",
            "h:1:2 [0] NCCL INFO comm 0x1 rank 0 nRanks 1 nNodes ", "        Current Power Limit "]

EPILOG = Context("epilog", "n1", job_id="1", nvlink_before={"0": {"0": {"crc": "x"}}})
# /proc/net/vlan/config as net/8021q/vlanproc.c writes it (vlan_seq_show: two header lines,
# then "%-15s| %d  | %s"), with the VLAN of tensorflow#22077's eth2.10 (corpus/fabric/)
VLAN_CONFIG = ("VLAN Dev name\t | VLAN ID\nName-Type: VLAN_NAME_TYPE_RAW_PLUS_VID_NO_PAD\n"
               "eth2.10        | 10  | eth2\nbond0.200      | 200  | bond0\n")


def _judged(parse: Callable[[str], object], judge: Callable[[object], object]):
    """Parse, then judge what was parsed; ProbeError is the hooks' own refusal."""
    def run(text: str) -> None:
        try:
            judge(parse(text))
        except ProbeError:
            return
    return run


def _kmsg(text: str) -> None:
    """Xids and GPUs lost without one (a message may continue the record before it)."""
    events, gone, before = [], [], None
    for line in text.splitlines():
        record = xid.parse_record(line) or (0, 0, line)
        found = xid.parse_xid(record[2])
        if found:
            events.append({**found, "seq": record[0], "us": record[1], "jobs": ["1"]})
        lost = xid.parse_lost(record[2], before) if found is None else None
        if lost:
            gone.append({**lost, "seq": record[0], "us": record[1], "gpu": lost["minor"]})
        before = xid.record_pci(record[2]) or before
    xid.check_xid({"events": events, "gone": gone}, {"xid_drain": [79]}, None)


def _clocks(text: str) -> None:
    """nvidia-smi -q's power and clock sections, judged by gpu.clocks (which may refuse a
    report with no GPU section, the hooks' ProbeError)."""
    try:
        facts = clocks.facts_from_text(text)
    except ProbeError:
        return
    clocks.check_clocks(facts, {"power_limit_tolerance": 0.05}, EPILOG)


def _amd(text: str) -> None:
    """amd-smi metric / topology (or rocm-smi --showtopo) text -> every AMD check."""
    from slurmfabric.health.checks import amd

    facts = amd.AmdFacts("amd-smi", amd.parse_metric(text), amd.parse_link_table(text), 8)
    for func, _, _ in amd.CHECKS.values():
        func(facts, dict(amd.FAMILY.defaults()), None)


def _inventory(peers: dict | None = None, **versions: object) -> versions_check.Inventory:
    return versions_check.Inventory("n1", dict(versions), {}, peers or {})


def _ofed(text: str) -> None:
    """ofed_info -s -> the version pinned, listed in the info metric and compared."""
    found = versions_check.parse_ofed_info(text)
    inv = _inventory(ofed=found, driver="550.127.05")
    versions_check.check_pins(inv, {"versions": {"ofed": "MLNX_OFED_LINUX-5.4-3.5.8.0"}}, None)
    peers = {"n2": {"ofed": "MLNX_OFED_LINUX-5.4-3.5.8.0"}, "n3": {"ofed": found or "x"}}
    versions_check.check_drift(_inventory(peers, ofed=found), {}, None)


def _firmware(text: str) -> None:
    """HCA firmware as ibstat prints it ("Firmware version:") or ibv_devinfo ("fw_ver:"),
    i.e. the string sysfs fw_ver holds: pinned per family and compared across nodes."""
    fw = {f"mlx5_{i}": line.split(":", 1)[1].strip() for i, line in enumerate(
        line for line in text.splitlines()
        if "Firmware version" in line or "fw_ver" in line)}
    versions_check.check_pins(_inventory(hca_fw=fw),
                              {"versions": {"hca_fw": ["28.39.1002", "22.31.1014"]}}, None)
    peers = {"n2": {"hca_fw": {"mlx5_0": "28.39.1002"}}, "n3": {"hca_fw": fw}}
    versions_check.check_drift(_inventory(peers, hca_fw=fw), {}, None)


def _vlans(text: str) -> None:
    """/proc/net/vlan/config read by the topology, then the rail plan's GID choice by VLAN."""
    import tempfile

    from slurmfabric._common.sysfs import Root
    from slurmfabric.topology._io import Reader
    from slurmfabric.topology.net import read_vlans

    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "proc/net/vlan"))
        with open(os.path.join(root, "proc/net/vlan/config"), "w", encoding="utf-8",
                  errors="surrogateescape") as handle:
            handle.write(text)
        found = read_vlans(Reader(Root(root)))
    for name, (vlan, parent) in found.items():
        assert 1 <= vlan <= 4094 and name and parent, (name, vlan, parent)


def _flap_history(text: str) -> None:
    """rdma.link_flaps's own state file (written by record_link_downed, here with the
    link_downed values of Mellanox/ufm_sdk_3.0#189 in corpus/fabric/), damaged, then read
    by the next hook run and judged."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "link_downed.json")
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(text)
        port = rdma.PortFacts("mlx5_0:1", "ACTIVE", "LinkUp", 400.0, "InfiniBand",
                              {"link_downed": 3})
        flaps = rdma.record_link_downed(path, [port], 86400, now=1_712_232_385.0)
        facts = rdma.RdmaFacts([port], "", "", None, {}, flaps, 86400)
        rdma.check_link_flaps(facts, {}, None)


def _flap_state_text() -> str:
    """The state file as the library writes it after the UFM report's 1 -> 2 bounce."""
    import tempfile

    text = (FIXTURES / "corpus/fabric/ufm-sdk-189_link-downed-counter-after-bounce.txt")
    downs = [int(line.rsplit(",", 1)[1]) for line in text.read_text().splitlines()
             if line.startswith("17") and ",50," in line]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "link_downed.json")
        for step, value in enumerate(downs):
            port = rdma.PortFacts("mlx5_0:1", "ACTIVE", "LinkUp", 400.0, "InfiniBand",
                                  {"link_downed": value})
            rdma.record_link_downed(path, [port], 86400, now=1_712_228_785.0 + 120 * step)
        with open(path, encoding="utf-8") as handle:
            return handle.read()


PARSERS: dict[str, tuple[Callable[[str], object], list[str]]] = {
    "nvlink -s": (_judged(lambda t: nvlink.NvlinkFacts(*nvlink.parse_status(t)),
                          lambda f: nvlink.check_links(f, {}, EPILOG)),
                  ["health/nvlink/*nvlink-s*.txt"]),
    "nvlink -e": (_judged(lambda t: nvlink.NvlinkFacts({}, {}, nvlink.parse_errors(t)),
                          lambda f: nvlink.check_errors(f, {}, EPILOG)),
                  ["health/nvlink/*nvlink-e*.txt"]),
    "nvidia-smi -q fabric": (_judged(lambda t: nvlink.FabricFacts([], True,
                                                                  nvlink.parse_fabric(t), True),
                                     lambda f: nvlink.check_fabric(f, {}, None)),
                             ["health/nvlink/*-q*.txt"]),
    "dcgmi diag -j": (_judged(dcgm.parse, lambda f: dcgm.check_dcgm(f, {}, EPILOG)),
                      ["health/dcgm/*.json", "corpus/dcgm/*.json"]),
    # issue 34's parsers: clocks and power caps, versions, VLANs, the link-flap history
    "nvidia-smi -q clocks/power": (_clocks, ["corpus/gpu/*.txt"]),
    "ofed_info -s": (_ofed, ["corpus/versions/ofed_info-*.txt"]),
    "HCA firmware": (_firmware, ["corpus/versions/ibstat-*.txt",
                                 "corpus/versions/ibv_devinfo-*.txt"]),
    "/proc/net/vlan/config": (_vlans, ["<vlan>"]),
    "link_downed history": (_flap_history, ["<flaps>"]),
    "kmsg xid": (_kmsg, ["health/xid/kmsg_lines.txt", "corpus/kernel/*.txt",
                         "corpus/xid/*.txt"]),
    # issue 46: the AMD family's reports, each judged by every check
    "amd-smi": (_amd, ["corpus/amd/*.txt", "topology/real/amd/*showtopo*.txt"]),
    "perftest": (lambda t: perftest.parse(t).bandwidth_gbps, ["perftest/*.txt"]),
    # each report is judged too: the failure chain, its root line and the GDR verdict
    "nccl-log": (lambda text: nccl_log.parse_log(text, "log", expect_gdr=True).verdict(),
                 ["nccl/*.log", "nccl/versions/*.log", "corpus/nccl/*.log"]),
    "nccl-tests": (lambda text: [nccl_tests.judge(run) for run in nccl_tests.parse(text)],
                   ["nccl/nccl-tests-*.txt", "corpus/nccltests/*.txt"]),
    "iblinkinfo": (ib_parse.parse_iblinkinfo, ["ib/*iblinkinfo*.txt"]),
    "ibstat": (ib_parse.parse_ibstat, ["ib/*ibstat*.txt", "corpus/versions/ibstat-*.txt",
                                        "corpus/fabric/*ibstat*.txt"]),
    "perfquery": (ib_parse.parse_perfquery, ["ib/*perfquery*.txt"]),
    "ibnetdiscover": (ib_parse.parse_ibnetdiscover,
                      ["ib/*ibnetdiscover*.txt", "ib/*.net"]),
    # RoCE: each parsed value goes on to the profile comparison a drain reason comes from
    "ethtool -S": (lambda t: _roce_port(counters=roce_parse.ethtool_stats(t)),
                   ["roce/*.txt", "corpus/roce/*.txt"]),  # ethtool -S is the narrowest
    "mlnx_qos": (lambda t: _roce_port(view=roce_parse.mlnx_qos(t)),
                 ["roce/mlnx_qos_*.txt", "roce/spiderpool_*.txt"]),
    "dcb": (lambda t: _roce_port(pfc=roce_parse.dcb_pfc(t), app=roce_parse.dcb_app_dscp(t),
                                 tos=roce_parse.traffic_class(t)), ["roce/dcb_*.txt"]),
}


def _roce_port(counters=None, view=None, pfc=None, app=None, tos=None) -> object:
    from slurmfabric.roce.facts import RocePort
    from slurmfabric.roce.profile import Profile, differences, traffic_warning

    port = RocePort("mlx5_0", 1, "ens1np0", mtu=4200, roce_tos=tos if tos is not None else 0,
                    counters=dict(counters or {}), dscp2prio=dict(app or {}))
    if view is not None:
        port.trust, port.pfc, port.dscp2prio = view.trust, view.pfc, view.dscp2prio
    if pfc is not None:
        port.pfc = pfc
    profile = Profile(trust="dscp", pfc_priorities=[3], ecn=True, roce_tos=106, mtu=4200)
    RocePort.from_dict(port.to_dict())
    return differences(port, profile), traffic_warning(port, profile)


# inputs that are not files: the format as the kernel writes it, a state file the library
# writes from a real report
GENERATED = {"<vlan>": lambda: VLAN_CONFIG, "<flaps>": _flap_state_text}
# formats whose real outputs are a few short lines: fewer fields, fewer mutations
SMALL = {"ofed_info -s": 40, "/proc/net/vlan/config": 25, "link_downed history": 25}


def _texts(globs: list[str]) -> list[tuple[str, str]]:
    found = sorted({p for pattern in globs if pattern not in GENERATED
                    for p in FIXTURES.glob(pattern)})
    texts = [(p.name, p.read_text(errors="replace")) for p in found]
    texts += [(pattern, GENERATED[pattern]()) for pattern in globs if pattern in GENERATED]
    assert texts, f"no fixtures for {globs}"
    return texts


def _mutations(text: str) -> list[str]:
    lines = text.splitlines()
    widest = max(len(line.split()) for line in lines)
    out = []
    for k in range(widest):
        for word in WORDS:
            mutated = []
            for line in lines:
                words = line.split(" ")
                if k < len(words):
                    words[k] = word
                mutated.append(" ".join(words))
            out.append("\n".join(mutated) + "\n")
    return out


def _outcome(parser: Callable[[str], object], text: str) -> str | None:
    """None when the parser read the text or refused it with our error; else the problem."""
    try:
        parser(text)
    except SlurmfabricError:
        return None
    except Exception as error:  # noqa: BLE001 - what the test looks for
        return f"{type(error).__name__}: {str(error)[:120]}"
    return None


@pytest.mark.parametrize("name", PARSERS)
def test_every_field_of_real_output_takes_every_hostile_value(name, hostile_report):
    parser, globs = PARSERS[name]
    problems, runs = [], 0
    for name_of, original in _texts(globs):
        for text in _mutations(original):
            runs += 1
            problem = _outcome(parser, text)
            if problem:
                problems.append(f"{name_of}: {problem}")
    hostile_report(f"mutated {name} output: {runs} parses, {len(problems)} problems")
    assert runs > SMALL.get(name, 100)
    assert not problems, "\n".join(sorted(set(problems))[:20])


@pytest.mark.parametrize("name", PARSERS)
def test_long_hostile_lines_are_read_in_linear_time(name, hostile_report):
    parser, _ = PARSERS[name]
    slow, problems, runs = [], [], 0
    for prefix in PREFIXES:
        for piece in PIECES:
            for tail in ("", "x", " x", ":"):
                line = prefix + piece * (LONG // len(piece)) + tail + "\n"
                runs += 1
                start = time.perf_counter()
                problem = _outcome(parser, line)
                took = time.perf_counter() - start
                if took > 2.0:
                    slow.append(f"{took:.1f} s: {prefix!r} + {piece!r} x {LONG // len(piece)}")
                if problem:
                    problems.append(f"{prefix!r} + {piece!r}: {problem}")
    hostile_report(f"long {name} lines: {runs} parses of {LONG} characters, "
                   f"{len(slow)} slow, {len(problems)} problems")
    assert not slow, "\n".join(slow[:10])
    assert not problems, "\n".join(problems[:10])
