"""Pair sweep on the real local Slurm testbed: one degraded node must be named, alone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

FAKEBW = Path(__file__).resolve().parents[1] / "fakebw.py"  # the bandwidth double

pytestmark = pytest.mark.cluster

DEGRADED = 180.0  # GB/s for the bad node; the others run at the fake's default 360


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "slurmfabric", *args]


def bandwidth_command() -> tuple[str, bool]:
    """The real all_reduce_perf where nccl-tests and a GPU exist, the double otherwise; the
    test output says which (pytest -s, or the captured output of a failure)."""
    real = shutil.which("all_reduce_perf")
    gpus = shutil.which("nvidia-smi") and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    if real and gpus:
        print(f"nccl-tests: the real {real}")
        return f"{real} -b 256M -e 8G -f 2 -g 1", True
    why = "no all_reduce_perf on PATH" if not real else "no GPU (nvidia-smi -L)"
    print(f"nccl-tests: the test double {FAKEBW} ({why})")
    return f"{sys.executable} {FAKEBW} -b 256M -e 8G -f 2 -g 1", False


def test_pair_sweep_finds_the_degraded_node(cluster, tmp_path):
    nodes = cluster.nodes
    assert len(nodes) == 4
    bad = nodes[2]
    results = tmp_path / "sweep"
    env = {
        "SLURMFABRIC_FAKEBW": json.dumps({bad: DEGRADED}),
        "SLURMFABRIC_FAKEBW_SECONDS": "2",  # long enough that a round's steps overlap
    }
    command, real = bandwidth_command()
    sub = cluster.run(_cli("pairs", "submit", "--nodes", ",".join(nodes),
                           "--results", str(results), "--partition", cluster.partition,
                           "--time", "5", "--command", command), env=env)
    job_id = re.search(r"submitted job (\d+)", sub.stdout).group(1)
    state = cluster.wait(job_id, timeout=240)
    job_out = "".join(p.read_text() for p in results.glob("job-*.out"))
    assert state == "COMPLETED", job_out

    svg = tmp_path / "pairs.svg"
    rep = cluster.run(_cli("pairs", "report", str(results), "--json", "--svg", str(svg)),
                      check=False)
    if real:  # nothing to inject a fault with: every pair measured, as scheduled
        data = json.loads(rep.stdout)
        assert data["execution_problems"] == [] and len(data["pairs"]) == 6, rep.stdout
        assert all(p["busbw"] and p["rc"] == 0 for p in data["pairs"]), rep.stdout
        return
    assert rep.returncode == 1, rep.stderr  # a suspect was found
    data = json.loads(rep.stdout)
    assert data["suspect_nodes"] == [bad]
    assert data["suspect_links"] == []
    assert data["execution_problems"] == []
    assert any(m.startswith(f"every pair with {bad} is at 50 %") for m in data["messages"])

    # The matrix holds every pair exactly once, with the slow node's pairs at its rate.
    pairs = data["pairs"]
    keys = [frozenset(p["pair"]) for p in pairs]
    assert len(keys) == len(set(keys)) == 6
    for p in pairs:
        assert p["busbw"] is not None and p["rc"] == 0
        expected = DEGRADED if bad in p["pair"] else 360.0
        assert expected * 0.95 < p["busbw"] <= expected
    # The job retested what was flagged (sfn3's three pairs, one at a time, as they share
    # sfn3), the verdict held, and the second pass found nothing left to run.
    assert sorted(tuple(sorted(r["pair"])) for r in data["retests"]) == sorted(
        tuple(sorted(p["pair"])) for p in data["pairs"] if bad in p["pair"])
    assert {r["pass"] for r in data["retests"]} == {1} and data["recovered"] == []
    assert (results / "retest-2.pairs").read_text() == ""
    assert "retest 1 start" in job_out and "retest 2 start" not in job_out
    m = data["matrix"]
    assert all(m[i][i] is None for i in range(4))
    assert all(m[i][j] == m[j][i] for i in range(4) for j in range(4))

    # From what the job recorded (not the schedule function): per round, every task line
    # names a node of its own pair and no node shows up in two pairs of the same round.
    rounds = sorted(results.glob("round-*"))
    assert len(rounds) == 3
    for round_dir in rounds:
        seen: list[str] = []
        spans = []
        for tasks in sorted(round_dir.glob("*.tasks")):
            lines = [line.split() for line in tasks.read_text().splitlines()]
            starts = [ln for ln in lines if ln[3] == "start"]
            ends = [ln for ln in lines if ln[3] == "end"]
            ran_on = {ln[1] for ln in starts}
            assert ran_on == set(tasks.stem.split("+")), tasks
            assert all(ln[5] == "0" for ln in ends) and len(ends) == 2
            seen += sorted(ran_on)
            spans.append((min(float(ln[4]) for ln in starts), max(float(ln[4]) for ln in ends)))
        assert len(seen) == len(set(seen)) == 4, (round_dir.name, seen)
        # The two steps of a round really ran at the same time.
        assert max(s for s, _ in spans) < min(e for _, e in spans), (round_dir.name, spans)

    # The picture is a valid SVG naming every node and the suspect.
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert all(any(t == n for t in texts) for n in nodes)
    assert any(f"suspect {bad}'s NIC" in t for t in texts)
    rects = list(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert len(rects) == 1 + 16  # background + 4 x 4 cells

    table = cluster.run(_cli("pairs", "report", str(results)), check=False)
    print(table.stdout)  # the report table, for the issue note (pytest -s)
    assert f"every pair with {bad}" in table.stdout


# --- the gate: drain the suspect, keep an admin's reason, burn-in resumes the repaired node --

ADMIN_REASON = "admin: cable swap"
RESERVATION = "sf_pairs_burnin"


def _sweep(cluster, nodes: list[str], results, degraded: dict[str, float], *extra: str):
    env = {"SLURMFABRIC_FAKEBW": json.dumps(degraded), "SLURMFABRIC_FAKEBW_SECONDS": "1"}
    fake = f"{sys.executable} {FAKEBW} -b 256M -e 8G -f 2 -g 1"
    sub = cluster.run(_cli("pairs", "submit", "--nodes", ",".join(nodes), "--results",
                           str(results), "--partition", cluster.partition, "--time", "5",
                           "--command", fake, *extra), env=env)
    job_id = re.search(r"submitted job (\d+)", sub.stdout).group(1)
    state = cluster.wait(job_id, timeout=240)
    assert state == "COMPLETED", "".join(p.read_text() for p in results.glob("job-*.out"))
    return sub


def _restore(cluster, nodes: list[str]) -> None:
    """Leave every node idle and undrained for the other tests, whatever happened here."""
    cluster.run(["scontrol", "delete", f"ReservationName={RESERVATION}"], check=False)
    for node in nodes:
        state, reason = cluster.node_state(node)
        if "DRAIN" in state and (reason.startswith("slurmfabric: pairs:")
                                 or reason.startswith(ADMIN_REASON)):
            cluster.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
    cluster.testbed.wait_idle(60)


def test_gate_drains_the_suspect_and_burn_in_resumes_only_it(cluster, tmp_path, request):
    nodes = cluster.nodes
    bad, admin = nodes[2], nodes[3]
    state_dir = tmp_path / "drain-state"
    gate_args = ("--state-dir", str(state_dir))
    request.addfinalizer(lambda: _restore(cluster, nodes))

    # 1. Sweep with one degraded node; --drain drains exactly that node, with our reason.
    first = tmp_path / "sweep1"
    _sweep(cluster, nodes, first, {bad: DEGRADED})
    before = {n: cluster.node_state(n) for n in nodes}
    assert all("DRAIN" not in s for s, _ in before.values()), before
    rep = cluster.run(_cli("pairs", "report", str(first), "--drain", *gate_args), check=False)
    assert rep.returncode == 1, rep.stdout + rep.stderr
    assert f"drain {bad}: drained" in rep.stdout
    state, reason = cluster.node_state(bad)
    assert "DRAIN" in state.split("+")
    assert reason.startswith(f"slurmfabric: pairs: every pair with {bad} is at 50 %"), reason
    assert {n: cluster.node_state(n) for n in nodes if n != bad} == {
        n: v for n, v in before.items() if n != bad}

    # 2. An admin drains another node by hand; --drain again changes nothing, and
    #    --resume-passing leaves the admin's node (it passed the sweep) drained.
    cluster.run(["scontrol", "update", f"NodeName={admin}", "State=DRAIN",
                 f"Reason={ADMIN_REASON}"])
    rep = cluster.run(_cli("pairs", "report", str(first), "--drain", "--resume-passing",
                           *gate_args), check=False)
    assert f"drain {bad}: already" in rep.stdout and f"resume {admin}: left as is" in rep.stdout
    assert cluster.node_state(admin)[1].startswith(ADMIN_REASON)
    assert "DRAIN" in cluster.node_state(bad)[0]

    # 3. Burn-in in a maintenance reservation (Slurm runs no job on a DRAIN node, not even
    #    in a reservation). A node someone else drained is refused, and nothing changes.
    cluster.run(["scontrol", "create", "reservation", f"ReservationName={RESERVATION}",
                 f"Nodes={','.join(nodes)}", "Users=root", "StartTime=now", "Duration=30",
                 "Flags=MAINT,IGNORE_JOBS"])
    refused = cluster.run(_cli("pairs", "submit", "--nodes", ",".join(nodes), "--results",
                               str(tmp_path / "refused"), "--burn-in", RESERVATION,
                               *gate_args), check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{admin} ({ADMIN_REASON}" in refused.stderr
    assert "DRAIN" in cluster.node_state(bad)[0] and "DRAIN" in cluster.node_state(admin)[0]

    # 4. The burn-in sweep over the nodes that may run (the repaired one resumed into the
    #    reservation, remembered), no degraded node: the gate ends its burn-in; the admin's
    #    node keeps its drain and reason.
    second = tmp_path / "sweep2"
    ready = [n for n in nodes if n != admin]
    sub = _sweep(cluster, ready, second, {}, "--burn-in", RESERVATION, *gate_args)
    assert f"burn-in {bad}: resumed into reservation {RESERVATION}" in sub.stdout
    rep = cluster.run(_cli("pairs", "report", str(second), "--json", "--drain",
                           "--resume-passing", *gate_args), check=False)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    data = json.loads(rep.stdout)
    assert data["suspect_nodes"] == [] and data["execution_problems"] == []
    assert f"resume {bad}: passed burn-in, back in service" in " | ".join(data["gate"])
    assert not any(line.startswith("drain ") for line in data["gate"])
    state, reason = cluster.node_state(bad)
    assert "DRAIN" not in state and reason == ""
    assert not (state_dir / f"drain-{bad}.json").exists()
    state, reason = cluster.node_state(admin)
    assert "DRAIN" in state.split("+") and reason.startswith(ADMIN_REASON)


DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "health" / "dcgm"


def _fake_dcgmi(path: Path, report: str, code: int, calls: Path) -> str:
    """dcgmi as on a node: records its argv, prints a recorded ``dcgmi diag -j`` report
    (tests/fixtures/health/dcgm, sources in SOURCES.md) and exits as dcgmi does for it."""
    path.write_text(f'#!/bin/sh\necho "$SLURMD_NODENAME $*" >> {calls}\n'
                    f"cat {DCGM / report}\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


def test_burn_in_gpu_stage_keeps_a_node_whose_gpus_fail(cluster, tmp_path, request):
    """A repaired node goes back to service only if its GPUs pass DCGM level 3 and its
    links pass the sweep: its network is fine here, its GPU memory test is not."""
    from helpers import nvsmi, write_config

    nodes = cluster.nodes
    bad = nodes[1]
    state_dir = tmp_path / "drain-state"
    request.addfinalizer(lambda: _restore(cluster, nodes))
    calls = tmp_path / "dcgmi.calls"
    good = _fake_dcgmi(tmp_path / "dcgmi-pass", "dcgm3-r3-pass.json", 0, calls)
    failing = _fake_dcgmi(tmp_path / "dcgmi-fail", "dcgm3-r2-fail-memory-RECONSTRUCTED.json",
                          226, calls)
    cfg = write_config(tmp_path / "health.toml", state_dir, [
        {"match": ",".join(nodes), "gpus": 8, "gpu_source": "nvidia-smi", "rdma_ports": 0,
         "nvidia_smi": nvsmi("h100-535-healthy"), "dcgmi": good},
        {"match": bad, "dcgmi": failing}], runner={"breaker_min_nodes": 2})
    gate = ("--state-dir", str(state_dir), "--health-config", str(cfg))
    # The node was drained by slurmfabric before its repair (what the hooks would have done).
    from slurmfabric.health import drain as drain_mod

    policy = drain_mod.DrainPolicy(state_dir=str(state_dir), retry_s=0.1)
    assert drain_mod.drain(bad, "gpu.ecc", "GPU3 2 uncorrected volatile ECC errors", policy,
                           env=cluster.env).drained
    cluster.run(["scontrol", "create", "reservation", f"ReservationName={RESERVATION}",
                 f"Nodes={','.join(nodes)}", "Users=root", "StartTime=now", "Duration=30",
                 "Flags=MAINT,IGNORE_JOBS"])
    results = tmp_path / "burnin"
    sub = _sweep(cluster, nodes, results, {}, "--burn-in", RESERVATION, "--gpu-stage", *gate)
    assert f"burn-in {bad}: resumed into reservation {RESERVATION}" in sub.stdout
    ran = sorted(calls.read_text().splitlines())
    assert ran == sorted(f"{n} diag -r 3 -j" for n in nodes)  # every node, level 3
    rep = cluster.run(_cli("pairs", "report", str(results), "--json", "--resume-passing",
                           *gate), check=False)
    assert rep.returncode == 1, rep.stdout + rep.stderr
    data = json.loads(rep.stdout)
    assert data["suspect_nodes"] == [bad] and data["suspect_links"] == []
    assert data["gpu_stage"] == {n: None for n in nodes if n != bad} | {bad: (
        "gpu.dcgm: DCGM level 3: GPU Memory on GPU0: GPU 0 Error using CUDA API cuCtxCreate "
        "Check DCGM and system logs for errors. Reset GPU. Restart DCG")}
    state, reason = cluster.node_state(bad)
    assert "DRAIN" in state.split("+"), (state, reason)
    assert reason.startswith(f"slurmfabric: pairs: {bad} failed the GPU burn-in: gpu.dcgm: "
                             "DCGM level 3: GPU Memory on GPU0"), reason
    for node in nodes:
        if node != bad:
            assert "DRAIN" not in cluster.node_state(node)[0]


FAKEPERF = Path(__file__).resolve().parents[1] / "fakeperftest.py"


def test_per_rail_rdma_sweep_names_the_one_slow_rail(cluster, tmp_path):
    """--test ib_write_bw: each pair's step runs a server task and a client task per rail,
    all rails at once. There is no RDMA here: a stand-in ib_write_bw on PATH does the
    server/client TCP handshake between the two virtual nodes and prints a recorded real
    client output (tests/fakeperftest.py), sfn3's second rail at 40 %."""
    nodes = cluster.nodes
    bad = nodes[2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ib_write_bw"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKEPERF} "$@"\n')
    tool.chmod(0o755)
    # A real ib_write_bw needs RDMA devices, and the double's fault (one slow rail) cannot
    # be put on real ones: this test always runs the double and says why.
    rdma = sorted(p.name for p in Path("/sys/class/infiniband").glob("*"))
    print(f"ib_write_bw: the test double {FAKEPERF} (real perftest: "
          f"{shutil.which('ib_write_bw') or 'not installed'}; RDMA devices: "
          f"{', '.join(rdma) or 'none'})")
    env = {"PATH": f"{bin_dir}:{cluster.env['PATH']}",
           "SLURMFABRIC_FAKEPERF": json.dumps({f"{bad}/mlx5_1": 0.4})}
    results = tmp_path / "rdma"
    sub = cluster.run(_cli("pairs", "submit", "--nodes", ",".join(nodes), "--results",
                           str(results), "--partition", cluster.partition, "--time", "5",
                           "--test", "ib_write_bw", "--rails", "mlx5_0,mlx5_1"), env=env)
    job_id = re.search(r"submitted job (\d+)", sub.stdout).group(1)
    state = cluster.wait(job_id, timeout=240)
    assert state == "COMPLETED", "".join(p.read_text() for p in results.glob("job-*.out"))
    rep = cluster.run(_cli("pairs", "report", str(results), "--json"), check=False)
    assert rep.returncode == 1, rep.stderr
    data = json.loads(rep.stdout)
    assert data["suspect_nodes"] == [bad] and data["execution_problems"] == []
    assert data["slow_rails"] == [f"rail mlx5_1 of {bad} is at 40 % of its best rail "
                                  "(39.4 vs 98.4 Gb/s)"]
    for pair in data["pairs"]:
        assert set(pair["rails"]) == {"mlx5_0", "mlx5_1"} and pair["rails"]["mlx5_0"] == 98.38
    assert data["retests"] and all(bad in r["pair"] for r in data["retests"])


def test_k_batch_screen_names_the_slow_node_from_two_rounds(cluster, tmp_path):
    """--pattern k-batch --batch 2 on the 4 nodes: round 1 sfn1+sfn2, sfn3+sfn4; round 2
    sfn1+sfn3, sfn2+sfn4, every group one step, both groups of a round at once. The slow
    node is the one member of its slow groups that no good group clears."""
    nodes = cluster.nodes
    bad = nodes[3]
    results = tmp_path / "kbatch"
    _sweep(cluster, nodes, results, {bad: DEGRADED}, "--pattern", "k-batch", "--batch", "2")
    rep = cluster.run(_cli("pairs", "report", str(results), "--json"), check=False)
    assert rep.returncode == 1, rep.stderr
    data = json.loads(rep.stdout)
    assert data["suspect_nodes"] == [bad] and data["unresolved"] == []
    assert data["execution_problems"] == []
    assert [g["nodes"] for g in data["groups"]] == [
        nodes[0:2], nodes[2:4], [nodes[0], nodes[2]], [nodes[1], nodes[3]]]
    for group in data["groups"]:
        expected = DEGRADED if bad in group["nodes"] else 360.0
        assert expected * 0.95 < group["busbw"] <= expected
    for round_dir in sorted(results.glob("round-*")):  # each node in one group per round
        ran = [line.split()[1] for t in round_dir.glob("*.tasks")
               for line in t.read_text().splitlines() if line.split()[3] == "start"]
        assert sorted(ran) == sorted(nodes), round_dir
