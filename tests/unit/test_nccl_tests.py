from __future__ import annotations

import json
from pathlib import Path

import fakesysfs
import nodes
import pytest

from slurmfabric.commands import nccl_tests as cmd
from slurmfabric.nccl.tests import (
    discover_rates,
    expected_busbw,
    judge,
    parse,
)
from slurmfabric.topology.rdma import parse_rate

HERE = Path(__file__).resolve().parents[1]

FIX = HERE / "fixtures" / "nccl"


def one(name: str):
    runs = parse((FIX / name).read_text())
    assert len(runs) == 1
    return runs[0]


def test_two_node_h100_header_devices_rows_footer():
    run = one("nccl-tests-allreduce-2node-h100.txt")
    assert run.header["nGpus"] == "1" and run.header["maxBytes"] == "17179869184"
    assert run.header["warmup iters"] == "5" and run.header["agg iters"] == "1"
    assert len(run.devices) == 16
    assert run.devices[8].host == "inst-yyyyy-h100-ol89" and run.devices[8].bus == "0x0f"
    assert run.hosts == ["inst-xxxxx-h100-ol89", "inst-yyyyy-h100-ol89"]
    assert [r.size for r in run.rows][-1] == 17179869184
    last = run.rows[-1]
    assert (last.redop, last.root, last.type) == ("sum", -1, "float")
    assert last.out_of_place.busbw == 464.57 and last.in_place.busbw == 464.79
    assert last.out_of_place.time_us == 69338 and last.out_of_place.wrong == 0
    assert run.out_of_bounds == 0 and run.avg_busbw == 458.452
    assert run.large_message_busbw() == 464.79 and not run.data_errors


def test_wrong_counts_printed_with_g_are_data_errors():
    run = one("nccl-tests-allreduce-wrong-failed.txt")
    big = run.rows[-1]
    assert big.out_of_place.wrong == 536871000  # "5.36871e+08" as nccl-tests prints it
    assert run.rows[0].wrong == 16
    assert run.out_of_bounds == 216 and run.data_errors
    verdict = judge(run)  # no bandwidth expectation: data errors still fail
    assert not verdict.ok and verdict.findings[0].startswith("DATA ERRORS")


def test_old_format_error_column_is_not_a_wrong_count():
    run = one("nccl-tests-allreduce-old-error-column.txt")
    row = run.rows[0]
    assert row.root is None and row.redop == "sum"
    assert row.out_of_place.error == 1e-06 and row.out_of_place.wrong is None
    assert run.wrong_total == 0 and len(run.rows) == 6


def test_old_broadcast_without_redop_and_na_check():
    run = one("nccl-tests-broadcast-old-no-redop.txt")
    (row,) = run.rows
    assert row.redop is None and row.root == 0 and row.out_of_place.error is None
    assert run.nccl_version == "2.9.6"
    assert [d.host for d in run.devices] == ["v100-gpu-1", "v100-gpu-5"]


def test_new_header_lines_and_pci_domain_bus_ids():
    run = one("nccl-tests-allreduce-gb10-2.20.txt")
    assert run.tests_version == "2.20.0" and run.collective == "all_reduce_perf"
    assert run.devices[1].bus == "000f:01:00" and run.devices[1].name == "NVIDIA GB10"
    assert len(run.rows) == 4 and run.header["unalign"] == "0"


def test_launcher_prefixes_are_stripped():
    tagged = one("nccl-tests-allreduce-mpirun-tagged.txt")
    assert [r.size for r in tagged.rows] == [8, 16, 32] and tagged.avg_busbw == 92.3405
    labelled = one("nccl-tests-allreduce-srun-label.txt")
    assert labelled.large_message_busbw() == 479.28 and len(labelled.rows) == 9


def test_rccl_broadcast_trailer_and_rows_without_header():
    run = one("nccl-tests-broadcast-rccl-concluded.txt")
    assert run.collective == "broadcast_perf"
    assert run.rows[0].redop == "none" and run.rows[0].root == 0 and len(run.rows) == 10


def test_several_runs_in_one_output():
    text = (FIX / "nccl-tests-allreduce-2node-h100.txt").read_text()
    text += (FIX / "nccl-tests-allreduce-wrong-failed.txt").read_text()
    runs = parse(text)
    assert [len(r.rows) for r in runs] == [5, 8]
    assert runs[0].out_of_bounds == 0 and runs[1].out_of_bounds == 216


def test_expected_rule_matches_8x400():
    low, high = expected_busbw([400.0] * 8)
    assert (round(low, 1), high) == (345.6, 384.0)  # 8 x 48 GB/s, less 10 %


def test_judge_low_bandwidth_and_small_messages():
    run = one("nccl-tests-allreduce-srun-label.txt")  # 479 GB/s at 8 GiB
    assert judge(run, [400.0] * 8).ok
    slow = judge(run, [400.0] * 16)  # 800 GB/s line rate -> wants >= 700
    assert not slow.ok and "LOW BANDWIDTH" in slow.findings[-1]
    tiny = one("nccl-tests-allreduce-gb10-2.20.txt")
    verdict = judge(tiny, [200.0])  # issue 46: a sweep too short to judge is not OK
    assert not verdict.ok and verdict.state == "UNKNOWN"
    assert "CANNOT TELL" in verdict.findings[0] and "-e 1G" in verdict.findings[0]
    assert judge(tiny).ok and "not judged" in judge(tiny).findings[0]  # nothing asked


def test_parse_rate_and_discover_counts_only_the_rails(tmp_path, capsys):
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("25 Gb/sec (1X EDR)") == 25.0 and parse_rate("garbage") is None
    # the 8-GPU H100 fixture: 8 NDR rails and 2 ACTIVE HDR storage NICs
    root = fakesysfs.build(nodes.h100_ib(), tmp_path / "h100")
    rates, names = discover_rates(str(root))
    assert rates == [400.0] * 8 and "mlx5_4:1" not in names and "mlx5_5:1" not in names
    code = cmd.main(["parse", str(FIX / "nccl-tests-allreduce-2node-h100.txt"), "--discover",
                     "--sysfs-root", str(root)])
    out = capsys.readouterr()
    assert code == 0 and "fabric: 8 ports, 400 GB/s line rate -> expected busbw 346-384" \
        in out.out and "rails: mlx5_0:1," in out.err


def test_cli_parse_json_and_exit_codes(capsys):
    ok = cmd.main(["parse", str(FIX / "nccl-tests-allreduce-2node-h100.txt"),
                   "--ports", "16", "--port-rate", "200", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert ok == 0 and data["ok"] and data["runs"][0]["large_message_busbw"] == 464.79
    assert [round(v, 1) for v in data["runs"][0]["verdict"]["expected"]] == [345.6, 384.0]
    bad = cmd.main(["parse", str(FIX / "nccl-tests-allreduce-wrong-failed.txt")])
    assert bad == 1 and "DATA ERRORS" in capsys.readouterr().out
    low = cmd.main(["parse", str(FIX / "nccl-tests-allreduce-2node-h100.txt"),
                    "--expect-busbw", "500"])
    assert low == 1


def test_cli_rejects_non_output(tmp_path):
    f = tmp_path / "x.txt"
    f.write_text("nothing here\n")
    with pytest.raises(Exception, match="no nccl-tests output"):
        cmd.main(["parse", str(f)])


def test_a_garbled_row_is_not_a_measurement():
    """NaN compares false with every threshold: a row with NaN or inf bandwidth, or a
    non-number in a cell, must drop out rather than pass or fail a check by accident."""
    text = (FIX / "nccl-tests-allreduce-2node-h100.txt").read_text()
    last = [line for line in text.splitlines() if line.strip().startswith("17179869184")][0]
    cells = last.split()
    for bad in ("nan", "inf", "-nan", "x", "1e999", "-3"):
        garbled = " ".join(cells[:7] + [bad] + cells[8:])  # out-of-place busbw
        run = parse(text.replace(last, garbled))[0]
        assert run.rows[-1].size == 8589934592, bad
        wrong = " ".join(cells[:8] + [bad] + cells[9:])  # the #wrong count
        assert parse(text.replace(last, wrong))[0].rows[-1].size == 8589934592, bad
    old = one("nccl-tests-allreduce-old-error-column.txt").rows[0]
    old_text = (FIX / "nccl-tests-allreduce-old-error-column.txt").read_text()
    assert old.out_of_place.error == 1e-06
    row_line = [line for line in old_text.splitlines() if line.strip().startswith(str(old.size))][0]
    corrupt = parse(old_text.replace(row_line, row_line.replace("1e-06", "-nan", 1)))[0].rows[0]
    assert corrupt.size == old.size and corrupt.out_of_place.error != corrupt.out_of_place.error


def test_discover_on_a_roce_node_expects_roce_rates(tmp_path, capsys):
    """The whatif model gives the expectation for the node's fabric: two 200G RoCE rails
    (tests/roce_nodes.py) carry 2 x 24 GB/s x the RoCE factor."""
    import roce_nodes

    from slurmfabric.whatif import model as whatif

    root = roce_nodes.build(tmp_path / "roce")
    code = cmd.main(["parse", str(FIX / "nccl-tests-allreduce-2node-h100.txt"), "--discover",
                     "--sysfs-root", str(root)])
    out = capsys.readouterr().out
    high = 2 * 200 / 8 * whatif.IB_EFFICIENCY * whatif.ROCE_FACTOR
    assert code == 0 and out.splitlines()[0] == (
        f"fabric: 2 ROCE ports, 50 GB/s line rate -> expected busbw {0.9 * high:.0f}-"
        f"{high:.0f} GB/s on large messages")
