"""NCCL settings for scale (slurmfabric/plan/scale.py): the advice for a fabric and node
count, the warnings for values NCCL's own rules refuse or the fabric ignores, in the
rendered script's comments, on render's stderr and in ``topo --explain``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmfabric.plan import scale

REPO = Path(__file__).resolve().parents[2]


def names(items: list[scale.Advice]) -> list[str]:
    return [a.name for a in items]


def test_the_advice_follows_the_fabric_and_the_scale() -> None:
    ib = scale.advice("ib", 64, {"NCCL_NET": "IB"})
    assert names(ib) == ["NCCL_IB_TIMEOUT"]
    assert "4.3 s" in ib[0].what and ib[0].now is None and "env.html" in ib[0].source
    roce = {a.name: a for a in scale.advice("roce", 16, {})}
    assert roce["NCCL_IB_QPS_PER_CONNECTION"].value.startswith("4 where the nodes span")
    assert scale.advice("roce", 1, {})[1].value == "1 (the default)"  # one node: one leaf
    tcp = {a.name: a for a in scale.advice("tcp", 4, {"NCCL_IB_DISABLE": "1"})}
    assert set(tcp) == {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"}
    assert tcp["NCCL_SOCKET_NTHREADS"].value.startswith("4 on 100 Gb/s")
    # what the user set is shown with its value, whatever the fabric
    user = {a.name: a for a in scale.advice("ib", 8, {"NCCL_ALGO": "Ring",
                                                      "NCCL_IB_TIMEOUT": "22"})}
    assert user["NCCL_IB_TIMEOUT"].now == "22" and user["NCCL_ALGO"].now == "Ring"


@pytest.mark.parametrize("env, says", [
    ({"NCCL_IB_TIMEOUT": "40"}, "NCCL_IB_TIMEOUT='40': the field holds 0-31"),
    ({"NCCL_IB_TIMEOUT": "abc"}, "NCCL_IB_TIMEOUT='abc': the field holds 0-31"),
    ({"NCCL_IB_TIMEOUT": "14"}, "NCCL_IB_TIMEOUT=14: 0.07 s a try, shorter than NCCL's "
                                "default 20"),
    ({"NCCL_IB_RETRY_CNT": "9"}, "NCCL_IB_RETRY_CNT='9': the field holds 0-7"),
    ({"NCCL_PROTO": "LL128"}, "NCCL_PROTO='LL128': forces one choice for every message size"),
    ({"NCCL_SOCKET_NTHREADS": "17"}, "NCCL_SOCKET_NTHREADS=17: NCCL takes at most 16"),
    ({"NCCL_SOCKET_NTHREADS": "8", "NCCL_NSOCKS_PERTHREAD": "16"},
     "NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = 128: NCCL takes at most 64"),
])
def test_values_against_ncclss_rules_are_warned(env, says) -> None:
    got = scale.warnings("ib", 16, env, where="fabric.nccl.")
    assert any(says in line for line in got), got
    assert all(line.startswith("fabric.nccl.") for line in got)


def test_sound_values_earn_no_warning() -> None:
    env = {"NCCL_IB_TIMEOUT": "22", "NCCL_IB_RETRY_CNT": "7", "NCCL_SOCKET_NTHREADS": "4",
           "NCCL_NSOCKS_PERTHREAD": "4", "NCCL_IB_QPS_PER_CONNECTION": "4"}
    assert scale.warnings("roce", 64, env) == []
    assert scale.warnings("ib", 1, {"NCCL_IB_TIMEOUT": "14"}) == []  # one node: no fabric
    assert scale.warnings("tcp", 4, {"NCCL_IB_HCA": "mlx5_0"}) == [
        "NCCL_IB_HCA: fabric.type is tcp, so NCCL never reads them"]


def render(*sets: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "slurmfabric", "render", "-c",
            str(REPO / "examples" / "h100-fsdp.toml")]
    for item in sets:
        args += ["--set", item]
    return subprocess.run(args, capture_output=True, text=True)


def test_the_script_explains_its_settings_and_render_warns_on_contradictions() -> None:
    ok = render()
    assert ok.returncode == 0, ok.stderr
    lines = ok.stdout.splitlines()
    start = lines.index("# NCCL settings for this fabric and node count (slurmfabric/plan/"
                        "scale.py; what each does,")
    assert lines[start + 2].startswith("#   NCCL_IB_TIMEOUT (NCCL's default): each send waits")
    assert "warning" not in ok.stderr
    bad = render("fabric.nccl.NCCL_ALGO=Tree", "fabric.nccl.NCCL_IB_TIMEOUT=40")
    assert bad.returncode == 0  # user values win: warned, still exported
    assert "export NCCL_ALGO=Tree" in bad.stdout and "export NCCL_IB_TIMEOUT=40" in bad.stdout
    assert "slurmfabric: warning: fabric.nccl.NCCL_ALGO='Tree': forces one choice" in bad.stderr
    assert "fabric.nccl.NCCL_IB_TIMEOUT='40': the field holds 0-31" in bad.stderr
    # a value with a newline never reaches the comment: the loader refuses it, and the
    # comment line escapes what it prints anyway
    odd = render("fabric.nccl.NCCL_ALGO=Ring\ntouch /tmp/pwned")
    assert odd.returncode == 2 and "fabric.nccl.NCCL_ALGO: contains" in odd.stderr
    line = scale.Advice("NCCL_ALGO", "Ring\ntouch x", "w", "w", "v", "s").line()
    assert "\n" not in line and "Ring\\ntouch x" in line


def test_topo_explain_prints_the_settings_at_the_jobs_scale(tmp_path, capsys,
                                                           monkeypatch) -> None:
    from slurmfabric.commands import topo as topo_cmd

    monkeypatch.delenv("SLURMFABRIC_SYSFS_ROOT", raising=False)
    monkeypatch.setenv("NCCL_IB_TIMEOUT", "12")
    (tmp_path / "sys").mkdir()
    assert topo_cmd.main(["--sysfs-root", str(tmp_path), "--explain", "--nodes", "32",
                          "--fabric-type", "tcp"]) in (0, 1)
    text = capsys.readouterr().out
    assert "NCCL settings for tcp at 32 node(s)" in text
    assert "  NCCL_SOCKET_NTHREADS (NCCL's default): " in text
    assert "  warning: NCCL_IB_TIMEOUT=12: " in text
