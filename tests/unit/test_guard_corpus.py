"""Issue 34, the guard on real outputs: each public output in tests/fixtures/corpus/ (sources
and the verdict each output itself supports in the SOURCES.md of its folder) goes through
the real parser and check, and must get that verdict.

Classes this corpus pins (each has real cases the code before issue 34 got wrong):
* a communicator NCCL gave up on (``file.cc:N -> code`` up to init/group, the proxy's
  failed Connect) is a failure naming the first failing rank and the root line;
* ``nccl-log --expect-gdr`` on a log with no network line is UNKNOWN (exit 3), not OK;
* a GPU the driver lost with no Xid line (fallen off the bus, RmInitAdapter failed) drains,
  its bus id in the reason;
* nccl-tests rows behind a launcher's tag that does not start the line are read;
* a bimodal pair sweep is one slow group with a shared cause (synthetic: no public pair
  sweep of a bimodal cluster was found).
"""

from __future__ import annotations

import json
import os
import re
from itertools import combinations
from pathlib import Path

import pytest

from slurmfabric.commands import nccl_log as nccl_log_cmd
from slurmfabric.commands import nccl_tests as nccl_tests_cmd
from slurmfabric.errors import UsageError
from slurmfabric.health.checks import dcgm, xid
from slurmfabric.health.checks import roce as roce_check
from slurmfabric.health.model import FAIL, OK, Context
from slurmfabric.nccl.log import parse_log
from slurmfabric.nccl.tests import judge, parse
from slurmfabric.pairsweep.report import analyze
from slurmfabric.roce.facts import RocePort
from slurmfabric.roce.parse import ethtool_stats

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"

# file -> (verdict with --expect-gdr, problem kinds that must be there, the first failing
# rank's key and a piece of its root line when the communicator failed)
NCCL = {
    "deepep-143-ibv-create-cq-enomem-init-failed.log": (
        "FAIL", {"comm_failed"}, ("msm-h200-2:4016[7]", "ibv_create_cq failed")),
    "nccl-562-2.8.3-ibv-create-qp-init-failed.log": (
        "FAIL", {"comm_failed"}, ("hai-a100-3:3778851[4]", "Call to ibv_create_qp failed")),
    "nccl-795-2.14.3-proxy-connect-remote-error.log": (
        "FAIL", {"comm_failed"}, ("a100-st-p4d24xlarge-22:183006[1]", "Broken pipe")),
    "nccl-tests-166-socket-recv-failed-internal-error.log": (
        "FAIL", {"comm_failed", "peer_lost"},
        ("gpu004:2200689[3]", "Connection closed by remote peer")),
    "nccl-952-socket-proxy-connect-failed.log": (
        "FAIL", {"comm_failed", "socket_fallback"}, ("<cluster_name>:922[3]", "socket.cc:567")),
    "nccl-tests-252-completion-error4-progress-thread.log": (
        "FAIL", {"comm_failed", "ib_completion"}, None),
    "nccl-1499-group-internal-error-then-socket.log": (
        "FAIL", {"comm_failed", "socket_fallback"}, ("testpc115159:2736632[0]", "group.cc:64")),
    "aws-ofi-nccl-715-ofi-cq-enomem-socket.log": ("FAIL", {"ofi", "socket_fallback"}, None),
    "aws-ofi-nccl-1020-2.27.7-fi-getinfo-failed.log": ("FAIL", {"ofi"}, None),
    "nccl-1713-2.27-tagged-no-network-line.log": ("UNKNOWN", {"gdr_unknown"}, None),
    # NCCL 2.17/2.18 with the HPC-X UCX plugin: the proxy's service thread gives up Connect
    "nccl-947-ucx-plugin-service-thread-connect.log": (
        "FAIL", {"comm_failed", "peer_lost"},
        ("aragab-ib32:87529[4]", "Connection closed by remote peer")),
    # the proxy thread's "[Proxy Thread]" tag of NCCL <= 2.18 ends the chain as
    # "[Progress Thread]" does later (before: ib_completion only, no failed communicator)
    "nccl-928-h100-ib-completion-error4-proxy-thread.log": (
        "FAIL", {"comm_failed", "ib_completion"}, ("H100-2:19989[1]", "transport/net.cc:1008")),
    "nccl-1405-ib-plugin-status12-ipv6-gids.log": (
        "FAIL", {"comm_failed", "ib_completion"},
        ("kp-ddp-worker-0:3468[4]", "ib_plugin.c:1615 NET/IB : Got completion")),
    # plugin logs that stop before any channel connects: GDR cannot be told
    "nccl-1737-2.21.5-ibext-v8-sharp-stops-before-connect.log": (
        "UNKNOWN", {"gdr_unknown"}, None),
    "nccl-1357-ibext-sharp-collnet-plugin-v6.log": ("UNKNOWN", {"gdr_unknown"}, None),
    # NCCL 2.22.3 killed by SIGSEGV: no NCCL line at all, UCX's handler prints the signal
    "nccl-1538-2.22.3-segfault-backtrace.log": ("FAIL", {"crash"}, None),
    # NCCL_IBEXT_DISABLE=1: the plugin's init returns 3 to net.cc:55 and NCCL carries on
    "nccl-676-ibext-disabled-chain-below-init.log": ("UNKNOWN", {"gdr_unknown"}, None),
    # CUDA could not initialise in three ranks (a launcher's "host: " prefix on every line):
    # before issue 34 only warnings, result OK
    "nccl-1029-host-prefixed-ibext-cuda-init-error.log": ("FAIL", {"cuda"}, None),
    # NCCL 2.28, one rank on a desktop without RDMA: nNodes 1, sockets carry nothing.
    # Before: FAIL (socket_fallback as an error)
    "deepspeed-8248-2.28-single-rank-socket-no-verbs.log": (
        "OK", {"socket_fallback", "gdr_not_used"}, None),
    # NCCL 2.27's RTR timeout wording (the poster hid the pid and the addresses)
    "nccl-2013-2.27-modify-qp-rtr-timeout-anonymised.log": ("FAIL", {"ibv_modify_qp"}, None),
    # HPC-X IBext_v8 over Intel irdma RoCE ports (2.21.5) and over 8 CX RoCE rails (2.22.3)
    "nccl-tests-227-2.21.5-ibext-v8-irdma-roce.log": ("UNKNOWN", {"gdr_unknown"}, None),
    "nccl-1538-2.22.3-ibext-v8-8-roce-rails.log": ("UNKNOWN", {"gdr_unknown"}, None),
}


def test_every_corpus_file_is_covered_and_cited() -> None:
    from test_guard_corpus_nccl import NCCL_46, NCCL_TESTS_46  # issue 46's cases

    for area, covered in (("nccl", {**NCCL, **NCCL_46}), ("kernel", KERNEL),
                          ("nccltests", {**NCCL_TESTS, **NCCL_TESTS_46}),
                          ("dcgm", {**DCGM, **DCGM_DIAG}), ("roce", ROCE), ("amd", AMD),
                          ("xid", XID)):
        files = {p.name for p in (CORPUS / area).iterdir() if p.name != "SOURCES.md"}
        assert files == set(covered), area
        sources = (CORPUS / area / "SOURCES.md").read_text()
        assert all(f"## {name}" in sources for name in files), area


# A line that names one capture: a long number (counter, serial, pid), a GUID or GID
# group, a long hex value. Layout lines ("transport: InfiniBand (0)") repeat across real
# captures of the same hardware and say nothing about copying.
_DISTINCT = re.compile(r"\d{5,}|[0-9a-fA-F]{4}:[0-9a-fA-F]{4}:[0-9a-fA-F]{4}|0x[0-9a-fA-F]{8,}")


def _distinct(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if _DISTINCT.search(line)]


def test_no_corpus_file_repeats_another_fixture() -> None:
    """The corpus must not repeat the project's fixtures: no file of it is contained in
    another fixture, and none shares most of its distinctive lines with one (a trimmed
    copy of the same capture)."""
    fixtures = CORPUS.parent
    others = [(p, set(_distinct(text)), text) for p in fixtures.rglob("*")
              if p.is_file() and "corpus" not in p.parts
              and p.suffix in (".txt", ".log", ".json", ".net", ".md")
              for text in [p.read_text(errors="replace")]]
    repeats = []
    for mine in CORPUS.rglob("*"):
        if not mine.is_file() or mine.name in ("SOURCES.md", "README.md"):
            continue
        text = mine.read_text(errors="replace")
        lines = _distinct(text)
        for path, theirs, whole in others:
            shared = sum(line in theirs for line in lines)
            if text.strip() in whole or (len(lines) > 1 and shared * 2 > len(lines)):
                repeats.append(f"{mine.relative_to(CORPUS)} ~ {path.relative_to(fixtures)}")
    assert not repeats, repeats


def test_the_corpus_holds_at_least_40_real_outputs() -> None:
    files = [p for p in CORPUS.rglob("*") if p.is_file() and p.name not in
             ("SOURCES.md", "README.md")]
    assert len(files) >= 40


@pytest.mark.parametrize("name", sorted(NCCL))
def test_nccl_logs(name: str) -> None:
    verdict, kinds, first = NCCL[name]
    report = parse_log((CORPUS / "nccl" / name).read_text(), source=name, expect_gdr=True)
    assert report.verdict() == verdict, [(p.kind, p.message) for p in report.problems]
    assert kinds <= {p.kind for p in report.problems}
    if first is not None:
        failure = next(p for p in report.problems if p.kind == "comm_failed")
        assert failure.severity == "error" and failure.where == first[0]
        assert first[1] in failure.message.split("root: ", 1)[1]


def test_plugin_networks_are_named_and_a_chain_below_init_is_not_a_failure() -> None:
    """The HPC-X plugin's network names (IBext, IBext_v8) are what the log says; a chain
    that stops in net.cc (the plugin refused, NCCL carried on) is handled."""
    for name, network, devices in (
            ("nccl-1737-2.21.5-ibext-v8-sharp-stops-before-connect.log", "IBext_v8", 5),
            ("nccl-1357-ibext-sharp-collnet-plugin-v6.log", "IBext", 4),
            ("nccl-tests-227-2.21.5-ibext-v8-irdma-roce.log", "IBext_v8", 2),
            ("nccl-1538-2.22.3-ibext-v8-8-roce-rails.log", "IBext_v8", 8)):
        report = parse_log((CORPUS / "nccl" / name).read_text())
        assert report.verdict() == "OK" and {r.network for r in report.ranks} >= {network}
        assert max(len(r.net_devices) for r in report.ranks) == devices, name
    chain = parse_log((CORPUS / "nccl" / "nccl-676-ibext-disabled-chain-below-init.log")
                      .read_text())
    (rank,) = chain.ranks
    assert rank.error_code == 3 and not rank.gave_up and chain.verdict() == "OK"


def test_one_node_communicators_do_not_need_the_network() -> None:
    """nNodes 1 (NCCL's own word): sockets and the lack of GPUDirect RDMA are said, not
    failed. Without that line (releases before 2.12) the rank numbering says the same:
    "rank 0 nranks 1", every rank seen, one host (issue 46); "nranks 2" with one rank seen
    is a cut log of a bigger job and still fails."""
    text = (CORPUS / "nccl" / "deepspeed-8248-2.28-single-rank-socket-no-verbs.log").read_text()
    report = parse_log(text, expect_gdr=True)
    socket = next(p for p in report.problems if p.kind == "socket_fallback")
    assert socket.severity == "warning" and "nNodes 1" in socket.message
    assert report.ranks[0].nodes == 1 and report.verdict() == "OK"
    cut = "\n".join(line for line in text.splitlines() if "nNodes" not in line)
    assert parse_log(cut).verdict() == "OK"
    assert parse_log(cut.replace("nranks 1 ", "nranks 2 ")).verdict() == "FAIL"
    two = text.replace("nNodes 1 ", "nNodes 2 ")
    assert parse_log(two).verdict() == "FAIL"


def test_a_cuda_failure_warn_is_an_error_naming_each_rank() -> None:
    text = (CORPUS / "nccl" / "nccl-1029-host-prefixed-ibext-cuda-init-error.log").read_text()
    report = parse_log(text)
    assert [p.where for p in report.problems if p.kind == "cuda"] == [
        "rdma-test-gpu-worker-1:2918[4] init.cc:263",
        "rdma-test-gpu-worker-1:2919[5] misc/cudawrap.cc:33",
        "rdma-test-gpu-worker-1:2914[0] misc/cudawrap.cc:33"]
    assert {r.network for r in report.ranks if r.network} == {"IBext"}
    # CUDACHECKIGNORE prints the same words as INFO: NCCL carried on, not a failure
    assert parse_log("h:1:2 [0] NCCL INFO Cuda failure 'invalid argument'\n").verdict() == "OK"


def test_a_crash_is_a_failure_in_either_handlers_words() -> None:
    report = parse_log((CORPUS / "nccl" / "nccl-1538-2.22.3-segfault-backtrace.log").read_text())
    (crash,) = [p for p in report.problems if p.kind == "crash"]
    assert crash.message == "a process crashed: signal 11 (Segmentation fault)"
    assert crash.where.endswith("worker-0:4682 :0:4682]")
    ompi = parse_log("[gpu001:12345] *** Process received signal ***\n"
                     "[gpu001:12345] Signal: Aborted (6)\n")
    assert [(p.kind, p.message, p.where) for p in ompi.problems] == [
        ("crash", "a process crashed: signal 6 (Aborted)", "[gpu001:12345]")]
    assert parse_log("NCCL INFO handled signal 11 in a test name\n").verdict() == "OK"


def test_nccl_log_command_exit_codes_on_real_logs(capsys) -> None:
    ok_before = CORPUS / "nccl" / "deepep-143-ibv-create-cq-enomem-init-failed.log"
    assert nccl_log_cmd.main([str(ok_before)]) == 1
    assert "result: FAIL" in capsys.readouterr().out
    unknown = CORPUS / "nccl" / "nccl-1713-2.27-tagged-no-network-line.log"
    assert nccl_log_cmd.main([str(unknown), "--expect-gdr"]) == 3
    assert "result: UNKNOWN" in capsys.readouterr().out
    assert nccl_log_cmd.main([str(unknown)]) == 0  # nothing was asked that it cannot tell


def test_a_chain_that_stops_below_init_is_handled_not_a_failure() -> None:
    # NCCL 2.4 with the OFI plugin (aws-ofi-nccl#24, tests/fixtures/nccl): "include/net.h:24
    # -> 2" after "No NIC info", and the rank went on to build its rings
    text = (CORPUS.parent / "nccl" / "nccl-ofi-efa-horovod-tagged.log").read_text()
    assert "comm_failed" not in {p.kind for p in parse_log(text).problems}


# dmesg / journal text as posted; the test turns it into /dev/kmsg records the way the
# kernel writes them (one printk with newlines is one record, its newlines as \x0a)
_STAMP = re.compile(r"^(?:\w{3} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: )?\[\s*\d+\.\d+\] (?P<m>.*)$")
# The other ways a kernel line is posted: dmesg -T / --ctime ("[Fri Aug 30 11:43:09 2024] "),
# dmesg -x --time-format iso ("syslog:err   : 2025-05-27T04:18:56,089671+00:00 "), journalctl
# -o short-iso ("2025-05-27T04:18:56+0000 host kernel: ") and a journal line cut to "kernel: "
_OTHER_STAMPS = re.compile(
    r"^(?:\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] "
    r"|\w+:\w+ *: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d+[+-]\d\d:\d\d "
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} \S+ kernel: "
    r"|\w{3} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: "
    r"|kernel: )(?P<m>.*)$")


def kmsg_records(text: str) -> list[str]:
    messages: list[str] = []
    for line in text.splitlines():
        stamped = _STAMP.match(line) or _OTHER_STAMPS.match(line)
        if stamped:
            messages.append(stamped.group("m"))
        elif line.startswith(" ") and messages:  # dmesg's continuation of one record
            messages[-1] += "\\x0a" + line.strip()
        elif line.strip():
            messages.append(line.strip())
    return messages


def judge_kernel_log(text: str, tmp_path: Path, split: bool = False):
    messages = kmsg_records(text)
    if split:  # the same lines as separate records (journalctl -k, one line each)
        messages = [part for m in messages for part in m.split("\\x0a")]
    log, cursor = tmp_path / "kmsg", tmp_path / "cursor"
    cursor.write_text("99\n")  # not a first run: every record here is new
    log.write_text("".join(f"3,{100 + i},{(100 + i) * 1000},-;{m}\n SUBSYSTEM=pci\n"
                           for i, m in enumerate(messages)))
    return xid.check_xid(xid.collect(str(log), str(cursor), root=str(tmp_path)), {}, None)


# file -> bus ids (and GPU minors) that must be in the drain reason
KERNEL = {
    "nvsentinel-155-fallen-off-bus-no-xid-570.txt": ["0000:b3:00"],
    "bumblebee-554-gpu-at-fallen-off-bus-old.txt": ["0000:01:00"],
    "ogkm-789-rminitadapter-gsp-550.txt": ["GPU0 0000:98:00"],
    "gpu-operator-1146-rminitadapter-syslog.txt": ["GPU5 0000:0a:00"],
    "gpu-operator-649-rminitadapter-two-gpus.txt": ["GPU0 0000:04:01", "GPU1 0000:04:02"],
    "cmpunlocker-4-rminitadapter-attach.txt": ["0000:01:00"],
    "bumblebee-722-rminitadapter-minor-only.txt": ["GPU0 bus id not in the message"],
    # journalctl's short format with no dmesg stamp after "kernel: " (issue 46)
    "ogkm-1151-journal-rminitadapter-5080.txt": ["GPU0 0000:09:00"],
}


@pytest.mark.parametrize("name", sorted(KERNEL))
def test_a_lost_gpu_without_an_xid_drains_with_its_bus_id(name: str, tmp_path: Path) -> None:
    result = judge_kernel_log((CORPUS / "kernel" / name).read_text(), tmp_path)
    assert result.status == FAIL, result.reason
    assert all(piece in result.reason for piece in KERNEL[name]), result.reason
    assert result.values["new_xids"] == 0 and result.values["lost_gpus"]


def test_the_fallen_off_bus_message_split_over_journal_records(tmp_path: Path) -> None:
    text = (CORPUS / "kernel" / "nvsentinel-155-fallen-off-bus-no-xid-570.txt").read_text()
    result = judge_kernel_log(text, tmp_path, split=True)
    assert result.status == FAIL and "0000:b3:00 lost" in result.reason
    assert len(result.values["lost_gpus"]) == 1  # the probe failure is the same incident


def test_an_xid_79_and_its_fallen_off_bus_line_are_one_incident(tmp_path: Path) -> None:
    lines = (CORPUS.parent / "health" / "xid" / "kmsg_lines.txt").read_text().splitlines()
    text = "\n".join([lines[0], "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus."])
    result = judge_kernel_log(text, tmp_path)
    assert result.status == FAIL and result.reason.count("0000:2b:00") == 1


def test_a_driver_load_banner_is_not_a_lost_gpu() -> None:
    banner = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release "
              "Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025")
    assert xid.parse_lost(banner) is None


# file -> (result rows, large-message busbw, verdict without an expectation)
NCCL_TESTS = {
    "bottlerocket-kernel-kit-313-indented-ompi-tag.txt": (9, 2.31, True),
    "nccl-tests-78-allreduce-4gbps-collapsed.txt": (2, 4.32, True),
    "nccl-tests-252-allreduce-ring-8g.txt": (5, 95.10, True),
    "nccl-tests-290-srun-label-2node-h100-low.txt": (11, 155.57, True),
    "skypilot-gke-h200-ray-prefix-before-ompi-tag.txt": (7, 332.58, True),
}


def test_srun_labelled_two_node_run_is_low_against_8_ndr_rails(capsys) -> None:
    out = CORPUS / "nccltests" / "nccl-tests-290-srun-label-2node-h100-low.txt"
    assert nccl_tests_cmd.main(["parse", str(out), "--ports", "8", "--port-rate", "400"]) == 1
    assert "LOW BANDWIDTH: 155.57 GB/s busbw at 8589934592 B" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(NCCL_TESTS))
def test_nccl_tests_outputs(name: str) -> None:
    rows, busbw, ok = NCCL_TESTS[name]
    (run,) = parse((CORPUS / "nccltests" / name).read_text())
    assert len(run.rows) == rows and run.large_message_busbw() == pytest.approx(busbw)
    verdict = judge(run)
    assert verdict.ok is ok
    assert any(f"{busbw:.2f}" in f or "not judged" in f for f in verdict.findings)


def test_launcher_tags_anywhere_in_the_line() -> None:
    row = "  1073741824     268435456     float     sum      -1   213.6    5.03    5.03      0" \
          "   212.9    5.04    5.04      0"
    for tagged in (f"        [1,0]<stdout>:{row}", f"2024-11-28T07:42:11Z | [1,3]<stdout>:{row}",
                   f" 0: {row}", f"12: {row}", f"[0] {row}", f"gpu001: {row}",
                   f"gpu001: [1,0]<stdout>:{row}"):
        (run,) = parse(tagged)
        assert run.large_message_busbw() == pytest.approx(5.04), tagged
        assert "busbw 5.04 GB/s" in judge(run).findings[0]  # said even with no expectation


def test_an_empty_rates_argument_is_a_usage_error() -> None:
    out = CORPUS / "nccltests" / "nccl-tests-252-allreduce-ring-8g.txt"
    with pytest.raises(UsageError, match="--rates ''") as err:
        nccl_tests_cmd.main(["parse", str(out), "--rates", ""])
    assert err.value.exit_code == 2 and err.value.hint is None


def _sweep(n: int, slow: int, rate: float = 0.42, fast: float = 357.2):
    """A full pair sweep where a pair runs at its slower node's rate, with +-1 % noise that
    repeats (synthetic: no public bimodal sweep exists to copy)."""
    nodes = [f"gpu{i:03d}" for i in range(1, n + 1)]
    speed = {node: fast * (rate if i < slow else 1.0) for i, node in enumerate(nodes)}
    values = {(a, b): round(min(speed[a], speed[b]) * (1 + ((i * 7) % 5 - 2) / 200), 1)
              for i, (a, b) in enumerate(combinations(nodes, 2))}
    return nodes, values


@pytest.mark.parametrize("n", [4, 8, 16])
def test_a_bimodal_sweep_is_one_slow_group(n: int) -> None:
    nodes, values = _sweep(n, n // 2)
    for kwargs in ({}, {"expected": 357.2}):  # the median rule, an absolute reference
        analysis = analyze(nodes, values, **kwargs)
        assert analysis.slow_group == nodes[:n // 2] and analysis.suspect_nodes == []
        assert analysis.messages[0].startswith(f"{n // 2} of {n} nodes form a slow group at 4")
        assert "shared cause" in analysis.messages[0]
        assert set(analysis.passing_nodes) == set(nodes[n // 2:])


def test_a_bad_node_inside_the_fast_group_is_still_named() -> None:
    nodes, values = _sweep(8, 4)
    values = {p: (v * 0.7 if "gpu008" in p and v > 300 else v) for p, v in values.items()}
    analysis = analyze(nodes, values)
    assert analysis.slow_group == nodes[:4] and analysis.suspect_nodes == ["gpu008"]


@pytest.mark.parametrize("slow", [1, 2, 3])
def test_a_few_slow_nodes_keep_the_per_node_verdict(slow: int) -> None:
    nodes, values = _sweep(16, slow)
    analysis = analyze(nodes, values)
    assert analysis.slow_group == [] and analysis.suspect_nodes == nodes[:slow]


def _driver(capture: str) -> str:
    text = (CORPUS / "gpu" / capture).read_text()
    return re.search(r"Driver Version\s*:\s*(\S+)", text).group(1)


def _firmware(capture: str) -> dict[str, str]:
    """ibstat's CA names and firmware, as the hooks read them from sysfs fw_ver."""
    text = (CORPUS / "versions" / capture).read_text()
    return dict(re.findall(r"CA '(\S+)'.*?Firmware version: (\S+)", text, re.S))


def test_a_sweep_names_the_version_its_slow_group_shares(tmp_path: Path, capsys) -> None:
    """Across a sweep (issue 34): the hooks' inventories of the swept nodes, drivers and HCA
    firmware taken from real captures: the slow half runs H200's 550.90.12, the fast half
    550.127.05 (gls' GH200 capture). No strict majority exists, so node.version_skew's rule
    says nothing; the slow group's shared driver is named."""
    import fakebw

    from slurmfabric.commands import pairs as pairs_cmd

    nodes = [f"n{i}" for i in range(8)]
    inv = tmp_path / "versions"
    inv.mkdir()
    fw = _firmware("ibstat-cx6dx-l2fwdnv6.txt")
    for i, node in enumerate(nodes):
        driver = _driver("h200-550-q.txt" if i < 4 else "gh200-550-q.txt")
        (inv / f"{node}.json").write_text(json.dumps(
            {"node": node, "versions": {"driver": driver, "hca_fw": fw}}))
    (inv / "n9.json").write_text(json.dumps({"node": "n9", "versions": {"driver": "x"}}))
    plan = fakebw.sweep_results(tmp_path / "res", nodes, {n: 151.2 for n in nodes[:4]})
    assert pairs_cmd.main(["report", str(plan.results), "--json", "--versions", str(inv)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["slow_group"] == nodes[:4]
    assert data["versions"] == ["the slow group (4 nodes) shares driver 550.90.12; the other "
                                "nodes have 550.127.05"]
    # one odd node in a healthy sweep: named against the majority, the exit code unchanged
    (inv / "n7.json").write_text(json.dumps(
        {"node": "n7", "versions": {"driver": "550.127.05", "hca_fw": {"mlx5_0": "22.31.1014"}}}))
    for node in nodes[:4]:
        (inv / f"{node}.json").write_text(json.dumps(
            {"node": node, "versions": {"driver": "550.127.05", "hca_fw": fw}}))
    good = fakebw.sweep_results(tmp_path / "ok", nodes, {})
    assert pairs_cmd.main(["report", str(good.results), "--versions", str(inv)]) == 0
    out = capsys.readouterr().out
    assert "versions: n7 hca_fw:22 22.31.1014 (7/8 swept nodes have 22.32.2004)" in out
    assert pairs_cmd.main(["report", str(good.results), "--versions", str(tmp_path)]) == 0
    assert "versions: no inventory of a swept node in" in capsys.readouterr().out


def test_an_ofed_info_that_prints_no_release_name_is_unread(tmp_path: Path) -> None:
    """ompi#9957's node has no OFED: its shell says so. A wrapper that prints that with
    exit 0 must leave OFED unread, not pin 'bash: ofed_info: command not found' as the
    version (before: the first line, whatever it was)."""
    from slurmfabric.health.checks import versions

    said = (CORPUS / "versions" / "ofed_info-missing-ompi9957.txt").read_text()
    assert versions.parse_ofed_info(said) is None
    assert versions.parse_ofed_info(
        (CORPUS / "versions" / "ofed_info-s-mlnx-ucxpy.txt").read_text()) == \
        "MLNX_OFED_LINUX-5.4-3.5.8.0"
    tool = tmp_path / "ofed_info"
    tool.write_text("#!/bin/sh\ncat <<'EOF'\n" + said + "EOF\n")
    tool.chmod(0o755)
    inv = versions.collect_local("n1", {"ofed_info": str(tool), "sysfs_root": str(tmp_path)},
                                 10, gpus=False)
    assert "ofed" not in inv.versions
    assert inv.unread["ofed"].startswith("ofed_info -s printed no release name: '-bash: ")


def test_one_file_per_rank_cannot_tell_only_when_no_file_can(tmp_path: Path, capsys) -> None:
    unknown = CORPUS / "nccl" / "nccl-1713-2.27-tagged-no-network-line.log"
    shown = tmp_path / "rank1.log"  # another rank's file that shows GDR (a made-up line)
    shown.write_text("h1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via "
                     "NET/IB/0/GDRDMA\n")
    assert nccl_log_cmd.main([str(unknown), str(shown), "--expect-gdr"]) == 0
    assert nccl_log_cmd.main([str(unknown), str(unknown), "--expect-gdr"]) == 3
    capsys.readouterr()


def test_gpu_is_lost_status_lines_join_the_xid_or_stand_alone(tmp_path: Path) -> None:
    lost = "NVRM: nvCheckOkFailedNoLog: GPU lost from the bus [NV_ERR_GPU_IS_LOST]"
    lines = (CORPUS.parent / "health" / "xid" / "kmsg_lines.txt").read_text().splitlines()
    after_xid = judge_kernel_log("\n".join([lines[0], lost, lost]), tmp_path)
    assert after_xid.status == FAIL and after_xid.reason.count("0000:2b:00") == 1
    (tmp_path / "alone").mkdir()
    alone = judge_kernel_log(lost, tmp_path / "alone")
    assert alone.status == FAIL and "NV_ERR_GPU_IS_LOST" in alone.reason


# dcgmi diag -j / nvvs -j: file -> (results, passed, version)
DCGM = {"nvvs-3.1.0-8gpu-pass-uppercase-nulls.json": (80, 80, "3.1.0")}
# level 2 as dcgmi -j prints it (DCGM 3.x layout), one GPU: issue 46
DCGM_DIAG = {"virtualclient-dcgm3-r2-1gpu-pass.json": (11, "PCIe", "GPU Memory")}


@pytest.mark.parametrize("name", sorted(DCGM_DIAG))
def test_dcgmi_diag_level_2_report(name: str) -> None:
    results, integration, hardware = DCGM_DIAG[name]
    text = (CORPUS / "dcgm" / name).read_text()
    facts = dcgm.parse(text)
    assert len(facts["results"]) == results
    assert {r["test"] for r in facts["results"] if r["gpu"] == 0} == {integration, hardware}
    result = dcgm.check_dcgm(facts, {}, None)
    assert result.status == OK and result.values["passed"] == results
    # the same report with its memory test failed on GPU 0 names both
    failed = text.replace('"info" : "GPU 0 Allocated 15206918958 bytes (97.3%)",\n'
                          '\t\t\t\t\t\t\t\t"status" : "Pass"',
                          '"info" : "GPU 0 Allocated 15206918958 bytes (97.3%)",\n'
                          '\t\t\t\t\t\t\t\t"status" : "Fail"')
    assert failed != text
    bad = dcgm.check_dcgm(dcgm.parse(failed), {}, None)
    assert bad.status == FAIL and bad.reason == "DCGM level None: GPU Memory on GPU0"


@pytest.mark.parametrize("name", sorted(DCGM))
def test_dcgm_json_as_nvvs_prints_it(name: str) -> None:
    """NVVS run directly prints PASS/FAIL and leaves null between tests: before issue 34
    the null was an AttributeError (a checker error) and PASS read as "no test ran"."""
    results, passed, version = DCGM[name]
    text = (CORPUS / "dcgm" / name).read_text()
    facts = dcgm.parse(text)
    assert len(facts["results"]) == results and facts["version"] == version
    result = dcgm.check_dcgm(facts, {}, None)
    assert result.status == OK and result.values["passed"] == passed
    # the same report with GPU 5's software test failed: the GPU and test are named
    failed = text.replace('"gpu_ids" : 5,\n\t\t\t\t\t\t\t\t"status" : "PASS"',
                          '"gpu_ids" : 5,\n\t\t\t\t\t\t\t\t"status" : "FAIL"')
    assert failed != text
    bad = dcgm.check_dcgm(dcgm.parse(failed), {}, None)
    assert bad.status == FAIL and bad.reason == "DCGM level None: software on GPU5"


# ethtool -S snapshots: file -> the recorded snapshot before it (another fixture, read in place)
ROCE = {"byteps-179_ethtool-S-prio_after-benchmark.txt":
        CORPUS.parent / "roce" / "ethtool_mlx5_grep_prio_no_pfc.txt"}


@pytest.mark.parametrize("name", sorted(ROCE))
def test_ethtool_deltas_over_a_job(name: str) -> None:
    """byteps#179: the same port before and after an RDMA benchmark. The job's traffic is
    the delta (priority 0 only, +136.6 GB received); no loss or pause counter moved, so
    rdma.roce_counters passes in delta mode, while the totals since boot (88 TB) say
    nothing about the job."""
    before, after = ethtool_stats(ROCE[name].read_text()), ethtool_stats(
        (CORPUS / "roce" / name).read_text())
    grown = {k: after[k] - before[k] for k in after if after[k] != before.get(k)}
    assert grown == {"rx_prio0_bytes": 136571931490, "rx_prio0_packets": 126736411,
                     "tx_prio0_bytes": 136566416532, "tx_prio0_packets": 126724196}
    port = RocePort("mlx5_0", 1, "enp178s0f0", counters=after)
    ctx = Context("epilog", "n1", job_id="1", roce_before={port.name: before})
    result = roce_check.check_counters([port], {}, ctx)
    assert result.status == OK and result.values == {"mode": "delta"}
    # a discard counter that grew during the job fails, named with its delta
    lossy = RocePort("mlx5_0", 1, "enp178s0f0", counters={**after, "rx_discards_phy": 7000})
    ctx = Context("epilog", "n1", job_id="1",
                  roce_before={port.name: {**before, "rx_discards_phy": 0}})
    assert roce_check.check_counters([lossy], {}, ctx).status == FAIL


# file -> the amd.* verdicts it supports, replayed by the fake amd-smi (corpus/amd/SOURCES.md)
AMD = {
    "amdsmi-changelog-6.3-metric-pcie-2gpu-x16-32gts.txt": {"amd.pcie": "ok", "amd.count": "ok"},
    "amdsmi-changelog-6.1.2-metric-power-2gpu-unthrottled.txt": {"amd.clocks": "ok"},
    "amdsmi-changelog-6.1.1-metric-clock-1gpu-gfx0-7.txt": {"amd.clocks": "ok"},
    "amdsmi-changelog-6.1.1-metric-ecc-ecc-blocks-zero.txt": {"amd.ecc": "ok"},
    "amdsmi-changelog-6.1-metric-P-x16-16gts.txt": {"amd.pcie": "ok"},
    "amdsmi-changelog-6.1-topology-8gpu-all-xgmi.txt": {"amd.xgmi": "ok"},
    # no PCIE section in this report: cannot tell, a warning, never OK
    "powerjoular-67-metric-radeon-unthrottled.txt": {"amd.clocks": "ok", "amd.ecc": "ok",
                                                     "amd.pcie": "warn", "amd.count": "ok"},
}


@pytest.mark.parametrize("name", sorted(AMD))
def test_amd_smi_reports(name: str, tmp_path: Path) -> None:
    from slurmfabric.health.checks import amd

    text = (CORPUS / "amd" / name).read_text()
    topology = "topology" in name
    gpus = len(amd.parse_link_table(text)) if topology else len(amd.parse_metric(text))
    assert gpus
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(CORPUS.parent / "health" / "amdsmi" / "fake-amd-smi", bin_dir / "amd-smi")
    (bin_dir / "metric.txt").write_text("" if topology else text)
    (bin_dir / "topology.txt").write_text(text if topology else "")
    for k in range(gpus):
        dev = tmp_path / f"root/sys/bus/pci/drivers/amdgpu/0000:{k + 1:02x}:00.0"
        dev.mkdir(parents=True)
        (dev / "class").write_text("0x120000\n")
    expect = {**amd.FAMILY.defaults(), "amd_smi": str(bin_dir / "amd-smi"),
              "sysfs_root": str(tmp_path / "root")}
    facts = amd.collect(expect, 10)
    for check, verdict in AMD[name].items():
        result = amd.CHECKS[check][0](facts, expect, None)
        assert result.status == verdict, (check, result.reason)


# file -> (gpu.xid verdict, pieces of its reason): Xid lines as dmesg, dmesg -T, dmesg -x
# --time-format iso and the journal print them (corpus/xid/SOURCES.md)
XID = {
    "gpud-46-dmesg-ctime-xid13-109.txt": (
        "fail", ["Xid 109 on GPU 0000:cb:00 (ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR, RESET_GPU)"]),
    "akash-support-244-dmesg-T-xid43-31-94.txt": (
        "warn", ["Xid 43 on GPU 0000:00:05 (ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR, IGNORE)"]),
    "bumblebee-677-dmesg-xid32-31.txt": (
        "warn", ["Xid 32 on GPU 0000:01:00 (ROBUST_CHANNEL_PBDMA_ERROR, RESTART_APP)"]),
    "gpud-870-dmesg-decode-iso-xid79.txt": (
        "fail", ["Xid 79 on GPU 0000:04:00 (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, "
                 "RESTART_BM)"]),
    "ogkm-1150-journal-kernel-xid45-after-149.txt": (
        "warn", ["Xid 45 on GPU 0000:dc:00 (ROBUST_CHANNEL_PREEMPTIVE_REMOVAL, "
                 "WORKFLOW_XID_45)"]),
    "gpud-1174-kmsg-gb200-xid149-145-94.txt": (
        "fail", ["Xid 149 on GPU 0019:01:00 (NVLINK_NETIR_ERROR, WORKFLOW_NVLINK5_ERR)",
                 "Xid 145 on GPU 0018:01:00 (NVLINK_RLW_ERROR, WORKFLOW_NVLINK5_ERR)"]),
}
XID_NUMBERS = {"gpud-46-dmesg-ctime-xid13-109.txt": {13, 109},
               "akash-support-244-dmesg-T-xid43-31-94.txt": {43, 31, 94},
               "bumblebee-677-dmesg-xid32-31.txt": {32, 31},
               "gpud-870-dmesg-decode-iso-xid79.txt": {79},
               "ogkm-1150-journal-kernel-xid45-after-149.txt": {45},  # not "previous Xid 149"
               "gpud-1174-kmsg-gb200-xid149-145-94.txt": {149, 145, 94}}
XID_COUNTS = {"gpud-46-dmesg-ctime-xid13-109.txt": 4,
              "akash-support-244-dmesg-T-xid43-31-94.txt": 4,
              "bumblebee-677-dmesg-xid32-31.txt": 3, "gpud-870-dmesg-decode-iso-xid79.txt": 1,
              "ogkm-1150-journal-kernel-xid45-after-149.txt": 7,
              "gpud-1174-kmsg-gb200-xid149-145-94.txt": 4}


@pytest.mark.parametrize("name", sorted(XID))
def test_xid_lines_in_every_log_format(name: str, tmp_path: Path) -> None:
    result = judge_kernel_log((CORPUS / "xid" / name).read_text(), tmp_path)
    verdict, pieces = XID[name]
    assert result.status == verdict, result.reason
    assert result.values["new_xids"] == XID_COUNTS[name]
    assert all(piece in result.reason for piece in pieces), result.reason
    assert {v["xid"] for v in result.values["xids"]} == XID_NUMBERS[name]
