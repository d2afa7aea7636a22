"""Issue 46, items 3 and 4: NCCL logs and nccl-tests output on real public outputs, and every
reader of a file the project writes and reads back.

Each file in tests/fixtures/corpus/nccl/ and nccltests/ added for issue 46 is cited in its
folder's SOURCES.md with the verdict the output itself supports and what the code before
issue 46 said (each of these got it wrong, or crashed, unless SOURCES.md says "the same").
Classes pinned here:
* bootstrap and TCP connection failures are FAIL, naming the host;
* a run whose ranks are all on one host is not judged on the network (nccl-tests' device
  table, ``ncclCommInitAll``, or every rank of ``nranks N`` seen on one host);
* merged NICs (``[0]={[0] mlx5_2:1/RoCE, ...}``, 2.20-2.23 and HPC-X's plugin; ``Made virtual
  device``, 2.24+) are read as devices, not as ``={[0]``;
* nccl-tests: tags anywhere in a row, failure lines, older layouts, -J JSON, and a sweep
  that ends below 1 GiB is UNKNOWN (exit 3), never OK, when an expectation is given;
* a plan, baseline, result or ledger of the wrong shape is refused in one line (exit 2).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import fakebw
import pytest

from slurmfabric.commands import nccl_log as nccl_log_cmd
from slurmfabric.commands import nccl_tests as nccl_tests_cmd
from slurmfabric.commands import pairs as pairs_cmd
from slurmfabric.errors import UsageError
from slurmfabric.nccl import tests as nccl_tests
from slurmfabric.nccl.log import parse_log
from slurmfabric.nccl.tests import judge, parse, parse_json

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"

# file -> (verdict with --expect-gdr, problem kinds that must be there, kinds that must not)
NCCL_46 = {
    "nccl-tests-373-ibext-v8-merged-nics-no-gdrdma.log": ("FAIL", {"gdr_off"}, set()),
    "nccl-1920-bootstrap-reset-by-peer-host-only-prefix.log": (
        "FAIL", {"comm_failed", "connection"}, set()),
    "nccl-963-bootstrap-connect-reset-async-thread.log": (
        "FAIL", {"comm_failed", "connection"}, set()),
    "nccl-tests-217-2.21.5-single-gpu-lo-connection-closed.log": (
        "FAIL", {"peer_lost", "socket_fallback"}, set()),
    "nccl-428-2.8.3-one-process-two-gpus-socket.log": (
        "OK", {"socket_fallback", "no_verbs", "gdr_not_used"}, set()),
    "nccl-tests-131-2.16.5-one-process-socket-path-warn.log": (
        "OK", {"socket_fallback", "gdr_not_used"}, set()),
    "nccl-1706-initall-one-process-init-complete.log": ("OK", {"gdr_not_used"}, {"gdr_unknown"}),
    "pytorch-29482-bootstrap-no-socket-interface.log": ("FAIL", {"comm_failed"}, set()),
    "pytorch-lightning-14986-bootstrap-root-rank-checked-in.log": ("FAIL", {"bootstrap"}, set()),
    "espnet-1940-2.4.8-line-numbered-socket-forced.log": ("FAIL", {"socket_fallback"}, set()),
    "pytorch-68893-2.7.8-color-code-prefix-socket-two-ranks.log": (
        "FAIL", {"socket_fallback", "no_verbs"}, set()),
}

# file -> (runs' rows, large-message busbw or None, devices, verdict without an expectation,
#          verdict with --expect-busbw 10)
NCCL_TESTS_46 = {
    "nccl-644-all-gather-old-three-columns-no-header.txt": (13, 7.32, 0, "OK", "UNKNOWN"),
    "nccl-tests-287-rtx5090-alltoall-one-gpu.txt": (1, 0.0, 1, "OK", "UNKNOWN"),
    "nccl-tests-182-two-runs-interleaved.txt": (10, 0.02, 0, "OK", "UNKNOWN"),
    "nccl-tests-293-sweep-stops-at-4k.txt": (10, 0.18, 0, "OK", "UNKNOWN"),
    "deepep-303-h20-intra-node-small-sizes.txt": (10, 0.23, 0, "OK", "UNKNOWN"),
    "pytorch-84803-a6000-rank-line-without-group.txt": (3, 0.0, 1, "OK", "UNKNOWN"),
    "nccl-tests-167-max-min-redops-step-bytes.txt": (11, 3.08, 0, "OK", "UNKNOWN"),
    "nccl-tests-219-two-hosts-test-nccl-failure.txt": (0, None, 4, "FAIL", "FAIL"),
    "nccl-tests-280-unindented-rows-unhandled-cuda-error.txt": (3, 0.0, 3, "FAIL", "FAIL"),
    "nccl-258-old-error-column-no-root.txt": (4, 0.0, 4, "OK", "UNKNOWN"),
    "ucx-10055-containers-one-server-step-bytes.txt": (11, 9.20, 0, "OK", "UNKNOWN"),
    "nccl-tests-5-nccl1-bytes-header-cuda-failure.txt": (0, None, 0, "FAIL", "FAIL"),
}


def _kinds(report) -> set[str]:
    return {p.kind for p in report.problems}


@pytest.mark.parametrize("name", sorted(NCCL_46))
def test_nccl_logs_of_issue_46(name: str) -> None:
    verdict, present, absent = NCCL_46[name]
    report = parse_log((CORPUS / "nccl" / name).read_text(), source=name, expect_gdr=True)
    assert report.verdict() == verdict, [p.to_dict() for p in report.problems]
    assert present <= _kinds(report) and not absent & _kinds(report)


def test_bootstrap_failures_fail_and_name_the_host(capsys) -> None:
    reset = CORPUS / "nccl" / "nccl-1920-bootstrap-reset-by-peer-host-only-prefix.log"
    assert nccl_log_cmd.main([str(reset)]) == 1  # before issue 46: 0, "result: OK"
    out = capsys.readouterr().out
    assert "communicator failed during bootstrap: first on gpu-server320" in out
    assert "Connection reset by peer" in out and "NCCL_SOCKET_IFNAME" in out
    report = parse_log(reset.read_text())
    (connection,) = [p for p in report.problems if p.kind == "connection"]
    assert connection.severity == "error" and connection.where.startswith("gpu-server320")
    root = parse_log((CORPUS / "nccl" / "pytorch-lightning-14986-bootstrap-root-rank-checked-"
                      "in.log").read_text())
    (twice,) = [p for p in root.problems if p.kind == "bootstrap"]
    assert twice.where.startswith("hpc-25-14:18569[0]") and "same rank" in twice.remedy
    # a chain that stops in bootstrap.cc is the communicator's end, as one reaching init.cc
    chain = parse_log((CORPUS / "nccl" / "nccl-963-bootstrap-connect-reset-async-thread.log")
                      .read_text())
    (failed,) = [p for p in chain.problems if p.kind == "comm_failed"]
    assert "during bootstrap" in failed.message and "9306dc444753" in failed.message


def test_single_host_runs_are_not_judged_on_the_network() -> None:
    """nccl-tests' device table, ncclCommInitAll, or all N ranks of ``nranks N`` on one host:
    nothing crossed a network, so sockets are said, not failed (issue 46)."""
    one = (CORPUS / "nccl" / "nccl-428-2.8.3-one-process-two-gpus-socket.log").read_text()
    report = parse_log(one)
    socket = [p for p in report.problems if p.kind == "socket_fallback"]
    assert socket and all(p.severity == "warning" for p in socket)
    assert report.verdict() == "OK"
    # the same log with the second rank on another host is a two-node run: sockets fail
    two = one.replace("#   Rank  1 Pid  93569 on ai-vtraining-prd-10-193-84-3",
                      "#   Rank  1 Pid  93569 on ai-vtraining-prd-10-193-84-4")
    assert parse_log(two).verdict() == "FAIL"
    lone = CORPUS / "nccl" / "nccl-tests-217-2.21.5-single-gpu-lo-connection-closed.log"
    lone_report = parse_log(lone.read_text())
    assert {p.severity for p in lone_report.problems if p.kind == "socket_fallback"} == \
        {"warning"}  # it still fails: the proxy connection closed (peer_lost)
    initall = parse_log((CORPUS / "nccl" / "nccl-1706-initall-one-process-init-complete.log")
                        .read_text())
    assert all(r.one_node for r in initall.ranks) and len(initall.ranks) == 2


def test_merged_nics_are_read_as_devices() -> None:
    report = parse_log((CORPUS / "nccl" / "nccl-tests-373-ibext-v8-merged-nics-no-gdrdma.log")
                       .read_text())
    (rank,) = report.ranks
    assert rank.net_devices == ["mlx5_2:1/RoCE", "mlx5_3:1/RoCE", "mlx5_0:1/RoCE",
                                "mlx5_1:1/RoCE"]
    assert rank.merged_devices == ["mlx5_2:1/RoCE+mlx5_3:1/RoCE", "mlx5_0:1/RoCE+mlx5_1:1/RoCE"]
    assert rank.interfaces == ["bond0.526:169.136.106.9<0>"] and rank.network == "IBext_v8"
    # 2.24+ (src/transport/net_ib.cc, NVIDIA/nccl v2.24.3-1 .. v2.30.7-1): physical devices
    # in the "Using" line, each merge a "Made virtual device" line; 2.29+ may add ":rail"
    # after the port. The format strings are NCCL's; the values are the file's above.
    text = ("bigo:1884:2298 [0] NCCL INFO NET/IB : Using [0]mlx5_2:1/RoCE [1]mlx5_3:1:0/RoCE "
            "[RO]; OOB bond0.526:169.136.106.9<0>\n"
            "bigo:1884:2298 [0] NCCL INFO NET/IB : Made virtual device [2] name=mlx5_2+mlx5_3 "
            "speed=400000 ndevs=2\n"
            "bigo:1884:2298 [0] NCCL INFO NET/IB : Made virtual device [0] name=mlx5_2 "
            "speed=200000 ndevs=1\n")
    (rank,) = parse_log(text).ranks
    assert rank.net_devices == ["mlx5_2:1/RoCE", "mlx5_3:1:0/RoCE"]
    assert rank.merged_devices == ["mlx5_2+mlx5_3"]


@pytest.mark.parametrize("name", sorted(NCCL_TESTS_46))
def test_nccl_tests_outputs_of_issue_46(name: str) -> None:
    rows, busbw, devices, plain, expected = NCCL_TESTS_46[name]
    (run,) = parse((CORPUS / "nccltests" / name).read_text())
    assert run.rows_total == len(run.rows) == rows and len(run.devices) == devices
    assert run.large_message_busbw() == (None if busbw is None else pytest.approx(busbw))
    assert judge(run).state == plain
    assert judge(run, expected_min=10.0).state == expected


def test_test_failure_lines_fail_and_name_the_host(capsys) -> None:
    out = CORPUS / "nccltests" / "nccl-tests-219-two-hosts-test-nccl-failure.txt"
    assert nccl_tests_cmd.main(["parse", str(out)]) == 1
    assert "TEST FAILED: fengyun: Test NCCL failure common.cu:959" in capsys.readouterr().out
    old = CORPUS / "nccltests" / "nccl-tests-5-nccl1-bytes-header-cuda-failure.txt"
    assert nccl_tests_cmd.main(["parse", str(old)]) == 1  # before: exit 2, "no output found"
    assert "unhandled cuda error" in capsys.readouterr().out


def test_a_sweep_that_stops_below_1_gib_cannot_tell(capsys) -> None:
    """8 nodes x 100 Gb/s IB collapsed to 4.3 GB/s (11.5-12 expected), a sweep to 512 MiB:
    before issue 46 'result: OK' (bandwidth "not judged"); now UNKNOWN, exit 3, with the
    size it needed."""
    out = CORPUS / "nccltests" / "nccl-tests-78-allreduce-4gbps-collapsed.txt"
    assert nccl_tests_cmd.main(["parse", str(out), "--rates", "100"]) == 3
    text = capsys.readouterr().out
    assert "CANNOT TELL: the sweep ends at 536870912 B (4.32 GB/s busbw)" in text
    assert "-e 1G" in text and "result: UNKNOWN" in text and "result: OK" not in text
    assert nccl_tests_cmd.main(["parse", str(out)]) == 0  # nothing asked about bandwidth
    capsys.readouterr()
    assert nccl_tests_cmd.main(["parse", str(out), "--rates", "100", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "UNKNOWN" and data["runs"][0]["verdict"]["state"] == "UNKNOWN"


def _chunk_tagged(line: str, tag: str = "[0]") -> str:
    """A row as a launcher that labels every write shows it: nccl-tests prints a row in
    three printf calls (writeBenchmarkLinePreamble, then writeBenchmarkLineBody for the
    out-of-place and the in-place half; src/util.cu of NVIDIA/nccl-tests)."""
    tokens = line.split()
    if len(tokens) != 13 or not tokens[0].isdigit():
        return tag + line
    return (f"{tag}{' '.join(tokens[:5])}{tag}  {'  '.join(tokens[5:9])}"
            f"{tag}  {'  '.join(tokens[9:])}")


def test_rank_tags_before_each_chunk_of_a_row(tmp_path, capsys) -> None:
    real = (CORPUS / "nccltests" / "nccl-tests-252-allreduce-ring-8g.txt").read_text()
    tagged = "\n".join(_chunk_tagged(line) for line in real.splitlines())
    assert tagged.count("[0]") > 3 * 5  # three tags on each of the five rows
    (plain,), (chunked,) = parse(real), parse(tagged)
    assert chunked.rows == plain.rows and chunked.large_message_busbw() == pytest.approx(95.10)
    path = tmp_path / "tagged.txt"
    path.write_text(tagged)
    assert nccl_tests_cmd.main(["parse", str(path), "--expect-busbw", "90"]) == 0
    assert "bandwidth OK: 95.10 GB/s" in capsys.readouterr().out


def _as_json(run: nccl_tests.TestRun) -> dict:
    """A run as nccl-tests -J writes it (src/util.cu of NVIDIA/nccl-tests, JSON file version
    3: config.devices, results with out_of_place/in_place time, alg_bw, bus_bw, nwrong, the
    root as "%6i" text, out_of_bounds and average_bus_bandwidth), from a real run's figures."""
    def half(cell):
        return {"time": cell.time_us, "alg_bw": cell.algbw, "bus_bw": cell.busbw,
                "nwrong": None if cell.wrong is None else float(cell.wrong)}
    return {
        "version": 3, "start_time": "2025-10-17 10:00:00", "args": ["all_reduce_perf"],
        "env": [], "nccl_version": 22703,
        "config": {"nthreads": 1, "ngpus": 1, "devices": [
            {"rank": d.rank, "group": 0, "pid": d.pid, "hostname": d.host, "device": d.device,
             "device_hex": d.bus, "device_info": d.name} for d in run.devices]},
        "results": [{"size": r.size, "count": r.count, "type": r.type, "redop": r.redop,
                     "root": f"{r.root if r.root is not None else -1:6d}",
                     "out_of_place": half(r.out_of_place), "in_place": half(r.in_place),
                     "actual_iterations": 20, "experiment_name": "AllReduce"}
                    for r in run.rows],
        "out_of_bounds": {"count": run.out_of_bounds or 0, "okay": not run.out_of_bounds},
        "average_bus_bandwidth": {"bandwidth": run.avg_busbw or 0.0, "okay": "unchecked"},
        "errors": [], "end_time": "2025-10-17 10:00:05",
    }


def test_nccl_tests_json_output_is_read(tmp_path, capsys) -> None:
    (text_run,) = parse((CORPUS / "nccltests" / "nccl-tests-290-srun-label-2node-h100-low.txt")
                        .read_text())
    document = _as_json(text_run)
    (run,) = parse_json(json.dumps(document))
    assert run.source == "json" and run.nccl_version == "2.27.3"
    assert [(r.size, r.busbw, r.wrong) for r in run.rows] == \
        [(r.size, r.busbw, r.wrong) for r in text_run.rows]
    assert run.hosts == text_run.hosts and run.large_message_busbw() == pytest.approx(155.57)
    path = tmp_path / "allreduce.json"
    # one line, as util.cu writes it (no newline), and longer than a log line may be
    document["env"] = [f"VAR{i}=" + "x" * 100 for i in range(1000)]
    path.write_text(json.dumps(document))
    assert path.stat().st_size > 100_000 and "\n" not in path.read_text()
    assert nccl_tests_cmd.main(["parse", str(path), "--ports", "8", "--port-rate", "400"]) == 1
    assert "LOW BANDWIDTH: 155.57 GB/s" in capsys.readouterr().out
    document["results"][3]["in_place"]["nwrong"] = 12.0
    document["results"][4]["out_of_place"]["bus_bw"] = "nan"  # util.cu's jsonDouble of NaN
    path.write_text(json.dumps(document))
    assert nccl_tests_cmd.main(["parse", str(path)]) == 1
    out = capsys.readouterr().out
    assert "DATA ERRORS: #wrong > 0 at 1 sizes" in out
    (nan_run,) = parse(path.read_text())  # the NaN row is not a measurement: left out
    assert nan_run.rows_total == len(text_run.rows) - 1
    document["results"][2] = 5  # a number where a result belongs
    path.write_text(json.dumps(document))
    with pytest.raises(UsageError, match="not the -J output of nccl-tests") as err:
        nccl_tests_cmd.main(["parse", str(path)])
    assert err.value.exit_code == 2 and "\n" not in str(err.value)


def test_per_iteration_columns_and_timestamps() -> None:
    """nccl-tests 2.19.2+ with -I prints i_min, i_max, i_p99, i_cv% after each half, and
    -T a timestamp after the row (writeResultHeader, writeBenchmarkLineBody in src/util.cu);
    the figures are those of the real 8 GiB row of nccl-tests#290."""
    header = ("#       size         count      type   redop    root     time   algbw   busbw  "
              "#wrong    i_min    i_max    i_p99    i_cv%     time   algbw   busbw  #wrong    "
              "i_min    i_max    i_p99    i_cv%           timestamp")
    row = ("  8589934592    2147483648     float     sum      -1  104063   82.55  154.78       0"
           "   103812   104310   104301     0.12  103531   82.97  155.57       0   103498   "
           "103560   103559     0.02  2025-10-17 10:00:05")
    (run,) = parse(header + "\n" + row + "\n")
    (parsed,) = run.rows
    assert parsed.size == 8589934592 and parsed.busbw == pytest.approx(155.57)
    assert parsed.in_place.time_us == pytest.approx(103531) and parsed.wrong == 0


def test_a_200_mb_output_is_judged_with_bounded_rows(tmp_path, capsys, monkeypatch) -> None:
    """Every row is judged as it streams by, only ROWS_KEPT are kept (the memory figure is
    benchmarks/bench_nccl_tests_memory.py's): a #wrong after the kept rows still fails."""
    monkeypatch.setattr(nccl_tests, "ROWS_KEPT", 50)
    real = (CORPUS / "nccltests" / "nccl-tests-252-allreduce-ring-8g.txt").read_text()
    rows = [line for line in real.splitlines() if line.strip()[:1].isdigit()]
    header = [line for line in real.splitlines() if line.startswith("#")]
    bad = rows[0].rsplit(None, 1)[0] + "      7"  # the in-place #wrong of a late cycle
    body = rows * 40 + [bad] + rows
    path = tmp_path / "cycles.txt"
    path.write_text("\n".join(header + body) + "\n")
    (run,) = nccl_tests.iter_runs(path.read_text().splitlines())
    assert run.rows_total == len(body) and len(run.rows) == 50
    assert run.wrong_total == 7 and run.first_wrong_size == int(rows[0].split()[0])
    assert nccl_tests_cmd.main(["parse", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{len(body) - 50} more rows judged, not shown" in out and "DATA ERRORS" in out


# -- readers of files the project writes and reads back ------------------------------------

_WRONG = (5, "x", None, [], {}, [5], True, 1e308)


def _mutants(document: object, items: int = 2, wrong: tuple = _WRONG) -> list[object]:
    """The document with one value (the whole, each key's value, the first ``items`` of
    each list) replaced by a value of another type, one mutant per replacement."""
    out = []

    def walk(path: tuple) -> None:
        node = document
        for key in path:
            node = node[key]  # type: ignore[index]
        for value in wrong:
            copy = json.loads(json.dumps(document))
            if not path:
                out.append(value)
                continue
            parent = copy
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = value
            out.append(copy)
        if isinstance(node, dict):
            for key in node:
                walk(path + (key,))
        elif isinstance(node, list):
            for index in range(min(len(node), items)):
                walk(path + (index,))

    walk(())
    return out


def _refused_or_read(run, mutants: list[object]) -> list[str]:
    """Each mutant is read, or refused with a one-line UsageError (exit 2); anything else
    (a traceback, 'internal error', exit 70) is listed."""
    crashes = []
    for mutant in mutants:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                run(mutant)
        except UsageError as exc:
            if exc.exit_code != 2 or "\n" in str(exc):
                crashes.append(f"{exc!r} on {json.dumps(mutant)[:120]}")
        except Exception as exc:  # noqa: BLE001 - the point: nothing but UsageError
            crashes.append(f"{type(exc).__name__}: {exc} on {json.dumps(mutant)[:120]}")
    return crashes


def test_pairs_report_on_a_plan_with_a_number_for_a_pair_is_a_usage_error(tmp_path) -> None:
    plan = fakebw.sweep_results(tmp_path / "res", ["n0", "n1", "n2", "n3"], {})
    data = json.loads((plan.results / "plan.json").read_text())
    data["rounds"][0][0] = 5  # before issue 46: TypeError, "internal error" (exit 70)
    (plan.results / "plan.json").write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"round 1: 5 is not a list of 2 nodes") as err:
        pairs_cmd.main(["report", str(plan.results)])
    assert err.value.exit_code == 2


def test_every_pair_sweep_file_of_a_wrong_shape_is_refused_in_one_line(tmp_path) -> None:
    from slurmfabric.pairsweep import baseline
    from slurmfabric.pairsweep.report import latest, load_results

    plan = fakebw.sweep_results(tmp_path / "res", ["n0", "n1", "n2", "n3"], {})
    plan_file = plan.results / "plan.json"
    good_plan = json.loads(plan_file.read_text())

    def report(document: object) -> None:
        plan_file.write_text(json.dumps(document))
        pairs_cmd.main(["report", str(plan.results), "--json"])

    few = (5, "x", None, [5], {})  # one of each kind: each mutant runs the whole report
    assert _refused_or_read(report, _mutants(good_plan, wrong=few)) == []
    plan_file.write_text(json.dumps(good_plan))
    saved = tmp_path / "baseline.json"
    values = latest(load_results(plan.results)[1])[0]

    def with_baseline(document: object) -> None:
        saved.write_text(json.dumps(document))
        baseline.drift(values, baseline.read(str(saved)))

    good_baseline = baseline.from_sweeps([plan.results])
    assert _refused_or_read(with_baseline, _mutants(good_baseline)) == []


def test_nccl_tests_json_of_a_wrong_shape_is_refused_in_one_line(tmp_path) -> None:
    (run,) = parse((CORPUS / "nccltests" / "nccl-tests-252-allreduce-ring-8g.txt").read_text())
    document = _as_json(run)
    document["results"] = document["results"][:2]
    path = tmp_path / "r.json"

    def read(mutant: object) -> None:
        path.write_text(json.dumps(mutant))
        nccl_tests_cmd.main(["parse", str(path), "--expect-busbw", "10"])

    assert _refused_or_read(read, _mutants(document)) == []


def test_ib_audit_baseline_of_a_wrong_shape_is_refused_in_one_line(tmp_path) -> None:
    """Before issue 46 a number where a link end belongs ended in a TypeError (End(**5))."""
    from slurmfabric.ibaudit import audit as fa
    from slurmfabric.ibaudit import document, names
    from slurmfabric.ibaudit import parse as ibparse

    fixtures = CORPUS.parent / "ib"
    links = fa.build_links(ibparse.parse_iblinkinfo(
        (fixtures / "sim_healthy_iblinkinfo_line.txt").read_text()), names.NodeNamer())[:2]
    path = tmp_path / "audit.json"
    document.AuditDocument(created=1.5, findings=[], links=links,
                           counters={links[0].a.key: {"SymbolErrorCounter": 100}}).save(path)
    good = json.loads(path.read_text())

    def read(mutant: object) -> None:
        path.write_text(json.dumps(mutant))
        base = document.load_baseline(str(path))
        fa.audit(links, {}, expected=base.links, baseline_counters=base.counters)

    assert _refused_or_read(read, _mutants(good)) == []


def test_roce_audit_facts_of_a_wrong_shape_are_refused_in_one_line(tmp_path) -> None:
    from slurmfabric.roce import audit
    from slurmfabric.roce.facts import RocePort

    port = RocePort("mlx5_0", 1, "eth0")
    port.mtu, port.trust, port.pfc = 4200, "dscp", (False,) * 3 + (True,) + (False,) * 4
    port.dscp2prio, port.cnp_dscp, port.roce_tos = {26: 3}, 48, 106
    port.counters = {"rx_discards_phy": 1, "tx_prio3_pause": 2}
    good = {"node": "n1", "time": 100.0, "ports": [port.to_dict()]}
    for node in ("n1", "n2"):
        for k, when in ((0, 100.0), (1, 110.0)):
            (tmp_path / f"{node}.{k}.json").write_text(json.dumps(dict(good, node=node,
                                                                       time=when)))

    def read(mutant: object) -> None:
        (tmp_path / "n1.0.json").write_text(json.dumps(mutant))
        audit.to_json(audit.analyze(audit.load(tmp_path)))

    assert _refused_or_read(read, _mutants(good)) == []


def test_resume_history_reads_a_ledger_of_any_shape(tmp_path) -> None:
    """The restart ledger (events.jsonl) is read back by 'resume history': before issue 46 a
    node list that is a number, or a time no clock shows, ended in a traceback."""
    import os

    from slurmfabric.commands import resume as resume_cmd
    from slurmfabric.restart import events

    ledger = [
        {"event": "start", "run": "r1", "time": 90.0, "job": "1", "from_step": 0},
        {"event": "first_step", "run": "r1", "time": 95.0, "step": 1},
        {"event": "end", "run": "r1", "reason": "hang", "time": 100.0, "job": "1",
         "nodes": ["n1"], "exit_code": 0, "step_reached": 5, "action": "requeue"},
        {"event": "start", "run": "r1", "time": 110.0, "job": "2", "from_step": 4},
        {"event": "first_step", "run": "r1", "time": 120.0, "step": 5},
    ]
    state = events.state_dir(str(tmp_path))
    os.makedirs(state, exist_ok=True)

    def history(mutant: object) -> None:
        with open(os.path.join(state, events.EVENTS), "w") as handle:
            for record in mutant if isinstance(mutant, list) else [mutant]:
                handle.write(json.dumps(record) + "\n")
        for extra in ([], ["--json"]):
            resume_cmd.main(["history", str(tmp_path), *extra])

    assert _refused_or_read(history, _mutants(ledger, items=len(ledger))) == []
