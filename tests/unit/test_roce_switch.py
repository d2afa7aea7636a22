"""The switch side of lossless RoCE on recorded real switch outputs (tests/fixtures/switch/,
sources in SOURCES.md): each vendor's output against a host plan it matches (no finding),
the same output edited in one named place (exactly the finding that edit causes), the
hosts' plan taken from an audit's samples, and bad input (one line naming file and line,
exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurmfabric.errors import UsageError
from slurmfabric.roce import switch
from slurmfabric.roce.facts import RocePort
from slurmfabric.roce.switch import Plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "switch"
NVIDIA = Plan(3, 26, "test")  # RoCE DSCP 26 on priority 3 (Cumulus Linux RoCE defaults)


def saved(tmp_path: Path, name: str, fixture: str, old: str = "", new: str = "") -> str:
    """The fixture saved as ``name`` (the switch is named after the file), with the one
    edit ``old`` -> ``new`` applied where given."""
    text = (FIXTURES / fixture).read_text()
    if old:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def findings(spec: str, plan: Plan) -> list[str]:
    return [line for port in switch.read(spec) for line in switch.check(port, plan)[0]]


# (fixture, saved as, host plan, the one edit old -> new, findings of the real output,
# findings of the edited one): a wrong reader fails one side or the other.
CASES = {
    "sonic": ("sonic_config_db_qos_azure.json", "sonic1.json", Plan(3, 3, "SONiC AZURE"),
              '"dut-lc3|Asic0|Ethernet4|3"', '"dut-lc3|Asic0|Ethernet4|2"', [],
              ["switch sonic1 Ethernet4: ECN off on the lossless queue 3"]),
    "sonic-show": ("sonic_show_pfc_priority.txt", "sonic2.txt", Plan(4, 4, "test"),
                   "Ethernet8    3,4", "Ethernet8    3  ", [],
                   ["switch sonic2 Ethernet8: PFC on priority 3, host plan uses priority 4"]),
    "cumulus": ("cumulus_nv_show_interface_swp16_qos_roce_status.txt", "leaf1.txt", NVIDIA,
                "  enabled-tc        0,3   ", "  enabled-tc        0     ", [],
                ["switch leaf1 swp16: ECN off on the lossless queue 3"]),
    "cumulus-global": ("cumulus_nv_show_qos_roce.txt", "leaf2.txt", NVIDIA,
                       "    3  3    24,25,26,27,28,29,30,31  3",
                       "    3  3    24,25,27,28,29,30,31     3\n    0  0    26    0", [],
                       ["switch leaf2 (all ports): DSCP 26 maps to switch priority 0 on the "
                        "switch, host marks 26 for priority 3"]),
    "onyx": ("onyx_show_roce.txt", "spine1.txt", NVIDIA,
             "switch-priority 3: enabled", "switch-priority 4: enabled", [],
             ["switch spine1 (all ports): PFC on priority 4, host plan uses priority 3"]),
    # The real EOS outputs lack PFC where the plan needs it: the edit adds it.
    "eos": ("arista_eos_running_config_qos.cfg", "leaf3.cfg", Plan(4, 26, "test"),
            "   qos dscp 46\n", "   qos dscp 46\n   priority-flow-control priority 4 no-drop\n",
            ["switch leaf3 Ethernet1: PFC on no priority, host plan uses priority 4"], []),
    "eos-status": ("arista_eos_show_priority_flow_control.txt", "leaf4.txt", NVIDIA,
                   "Et1        D - -               -", "Et1        E A -   3           -",
                   ["switch leaf4 Ethernet1: PFC on no priority, host plan uses priority 3"],
                   []),
}


@pytest.mark.parametrize("vendor", sorted(CASES))
def test_each_vendor_output_and_one_named_edit_give_exactly_their_findings(tmp_path, vendor):
    fixture, name, plan, old, new, real, edited = CASES[vendor]
    assert findings(saved(tmp_path, name, fixture), plan) == real
    (tmp_path / "edited").mkdir()
    assert findings(saved(tmp_path / "edited", name, fixture, old, new), plan) == edited


def test_what_each_output_shows() -> None:
    (e0, e4) = switch.read(str(FIXTURES / "sonic_config_db_qos_azure.json"))
    assert (e0.port, sorted(e0.pfc), sorted(e0.ecn), e0.dscp_to[3], e0.dscp_to[26],
            e0.dscp_to[48]) == ("Ethernet0", [3, 4], [3, 4], 3, 1, 6)
    (swp16,) = switch.read(str(FIXTURES / "cumulus_nv_show_interface_swp16_qos_roce_status.txt"))
    assert (swp16.port, swp16.trust, swp16.dscp_to, swp16.queue_of) == (
        "swp16", "pcp,dscp", {48: 6, 26: 3}, {6: 6, 3: 3})
    (onyx,) = switch.read(str(FIXTURES / "onyx_show_roce.txt"))
    assert (onyx.trust, sorted(onyx.pfc), sorted(onyx.ecn), onyx.dscp_to) == \
        ("L3", [3], [3], None)
    (eos,) = switch.read(str(FIXTURES / "arista_eos_running_config_qos.cfg"))
    assert (eos.port, eos.trust, sorted(eos.ecn), eos.dscp_to[26], eos.dscp_to[46]) == \
        ("Ethernet1", "dscp", [2, 4], 4, 5)
    (et1,) = switch.read(str(FIXTURES / "arista_eos_show_priority_flow_control.txt"))
    assert (et1.port, et1.pfc, et1.ecn, et1.dscp_to) == ("Ethernet1", frozenset(), None, None)
    assert switch.check(et1, NVIDIA)[1] == [
        "switch arista_eos_show_priority_flow_control Ethernet1: DSCP map: no 'qos map dscp' "
        "line (save the running-config)",
        "switch arista_eos_show_priority_flow_control Ethernet1: ECN: not in the output"]
    show = switch.read(str(FIXTURES / "sonic_show_pfc_priority.txt"))
    assert [(p.port, sorted(p.pfc), p.ecn) for p in show][:2] == [
        ("Ethernet0", [3, 4], None), ("Ethernet2", [3, 4], None)]


def test_real_mismatches_and_what_is_not_seen() -> None:
    """SONiC's AZURE map carries DSCP 3/4 losslessly; NVIDIA's DSCP 26 lands on TC 1 there.
    Onyx 'show roce' has no DSCP map: said, never guessed."""
    sonic = str(FIXTURES / "sonic_config_db_qos_azure.json")
    assert findings(sonic, NVIDIA) == [
        f"switch sonic_config_db_qos_azure Ethernet{n}: DSCP 26 maps to TC 1 on the switch, "
        "host marks 26 for priority 3" for n in (0, 4)]
    (onyx,) = switch.read(str(FIXTURES / "onyx_show_roce.txt"))
    assert switch.check(onyx, NVIDIA) == ([], [
        "switch onyx_show_roce (all ports): DSCP map: 'show roce' prints the trust mode, not "
        "the DSCP to switch-priority map ('show qos interface ethernet 1/1' does)"])
    (port, *_) = switch.read(str(FIXTURES / "sonic_show_pfc_priority.txt"))
    assert switch.check(port, NVIDIA)[1][-1].endswith("Ethernet0: ECN: not in the output")
    (eos,) = switch.read(str(FIXTURES / "arista_eos_running_config_qos.cfg"))
    assert "service-policy pmap_test1" in switch.check(eos, NVIDIA)[1][0]


def test_the_format_can_be_named_and_bad_input_names_the_file_and_line(tmp_path) -> None:
    onyx = saved(tmp_path, "s.txt", "onyx_show_roce.txt")
    assert [p.fmt for p in switch.read(f"onyx:{onyx}")] == ["onyx"]
    with pytest.raises(UsageError) as error:
        switch.read(f"eos:{onyx}")
    assert str(error.value) == (f"{onyx}:1: eos: no interface with QoS settings and no 'show "
                                "priority-flow-control' table: not an EOS output")
    bad = saved(tmp_path, "bad.txt", "onyx_show_roce.txt", "switch-priority 3: enabled",
                "switch-priority 9: enabled")
    with pytest.raises(UsageError) as error:
        switch.read(bad)
    assert str(error.value) == f"{bad}:18: onyx: switch-priority '9': expected a number 0-7"
    broken = saved(tmp_path, "broken.json", "sonic_config_db_qos_azure.json",
                   '"pfc_enable"      : "3,4",\n            "pfcwd_sw_enable" : "3,4",\n'
                   '            "tc_to_pg_map"    : "AZURE",\n            "pfc_to_queue_map":'
                   ' "AZURE"\n        },\n        "Ethernet4"',
                   '"pfc_enable"      : "3,x",\n            "pfcwd_sw_enable" : "3,4",\n'
                   '            "tc_to_pg_map"    : "AZURE",\n            "pfc_to_queue_map":'
                   ' "AZURE"\n        },\n        "Ethernet4"')
    with pytest.raises(UsageError) as error:
        switch.read(broken)
    assert str(error.value).startswith(f"{broken}:") and "pfc_enable '3,x'" in str(error.value)
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    with pytest.raises(UsageError) as error:
        switch.read(str(other))
    assert str(error.value).startswith(f"{other}:1: not a switch output this reads")


@pytest.mark.parametrize(("name", "text"), [
    ("deep.json", "[" * 100_000),
    ("shape.json", '{"PORT_QOS_MAP": {"Ethernet0": {"pfc_enable": "3", "dscp_to_tc_map": []}},'
                   ' "DSCP_TO_TC_MAP": {}}'),
    ("queue.json", '{"PORT_QOS_MAP": {}, "QUEUE": {"Ethernet0|x": {"wred_profile": ["a"]}},'
                   ' "WRED_PROFILE": {"a": {"ecn": "ecn_all"}}}'),
    ("two.txt", "RoCE mode : lossless\nPFC : enabled\nswitch-priority 3,4: enabled\n"),
    ("nv.txt", "nv show qos roce\npfc\n  pfc-priority      -3\n"),
    ("eos.cfg", "interface Ethernet1\n   tx-queue 9\n"),
])
def test_hostile_switch_files_are_one_usage_error(tmp_path, name, text) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as error:
        switch.read(str(path))
    assert str(error.value).startswith(f"{path}:") and "\n" not in str(error.value)


def test_roce_audit_checks_switches_against_the_hosts_samples(tmp_path) -> None:
    """The plan comes from an audit's host samples (PFC priority 3, ToS 106 = DSCP 26);
    the command names the switch, the port and the mismatch, exit 1; bad input exit 2."""
    results = tmp_path / "results"
    results.mkdir()
    port = RocePort("mlx5_0", 1, "ens1np0", pfc=(False,) * 3 + (True,) + (False,) * 4,
                    roce_tos=106)
    for node in ("gpu1", "gpu2"):
        (results / f"{node}.0.json").write_text(json.dumps(
            {"node": node, "time": 1.0, "ports": [port.to_dict()]}))
    leaf = saved(tmp_path, "leaf1.txt", "cumulus_nv_show_interface_swp16_qos_roce_status.txt")
    sonic = saved(tmp_path, "sonic1.json", "sonic_config_db_qos_azure.json")
    base = [sys.executable, "-m", "slurmfabric", "roce", "audit"]
    proc = subprocess.run([*base, "--switch", f"cumulus:{leaf}", "--switch", sonic,
                           "--results", str(results)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [
        "switch check: 3 ports against the host plan: priority 3, DSCP 26 (the hosts' "
        "samples: PFC priority on 2 ports, ToS DSCP on 2 ports)",
        "switch sonic1 Ethernet0: DSCP 26 maps to TC 1 on the switch, host marks 26 for "
        "priority 3",
        "switch sonic1 Ethernet4: DSCP 26 maps to TC 1 on the switch, host marks 26 for "
        "priority 3"]
    ok = subprocess.run([*base, "--switch", leaf, "--priority", "3", "--dscp", "26"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1] == (
        "no switch port differs from the host plan")
    bad = subprocess.run([*base, "--switch", str(tmp_path / "missing.txt"), "--priority", "3",
                          "--dscp", "26"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines()[0].endswith("missing.txt: No such file or directory")
    alone = subprocess.run([*base, "--switch", leaf], capture_output=True, text=True)
    assert alone.returncode == 2 and "needs the hosts' plan" in alone.stderr


def test_every_switch_fixture_is_cited() -> None:
    sources = (FIXTURES / "SOURCES.md").read_text()
    names = sorted(p.name for p in FIXTURES.iterdir() if p.name != "SOURCES.md")
    assert len(names) == 7 and all(f"`{name}`" in sources for name in names)
