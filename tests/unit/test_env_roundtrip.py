"""Whatever ``slurmfabric env`` prints for ``eval`` survives it byte for byte, in bash and sh.

Hostile values reach the output as values the user set (kept, and shown in a comment) and
as values slurmfabric exports; the canary file proves that no part of a value ran as code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

STEP = {
    "SLURM_JOB_ID": "77", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURMFABRIC_NO_PLAN": "1", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
}
NASTY = ["a\ntouch {canary}", "x'; touch {canary}; '", "$(touch {canary})", "`touch {canary}`",
         "\r\n# \ntouch {canary}", "\\", "'", '"', "--", "-n", "é中\U0001f600", "\t\x1b[31m",
         "\u2028touch {canary}", "$'\\ntouch {canary}'", "%s%n", " lead and trail "]
values = st.one_of(st.sampled_from(NASTY),
                   st.text(st.characters(blacklist_categories=("Cs",),
                                         blacklist_characters="\x00"), min_size=1, max_size=30))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values, shell=st.sampled_from(["bash", "sh"]))
def test_eval_of_env_output_keeps_every_value(tmp_path_factory, value: str, shell: str) -> None:
    base = tmp_path_factory.mktemp("rt")
    canary = base / "pwned"
    value = value.replace("{canary}", str(canary))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    # MASTER_ADDR set by the user: kept (a comment line) and exported as it is
    env.update(STEP, MASTER_ADDR=value, LANG="C.UTF-8")
    printed = subprocess.run([sys.executable, "-m", "slurmfabric", "env"], env=env,
                             capture_output=True, timeout=30)
    assert printed.returncode == 0, printed.stderr
    out = base / "value"
    script = printed.stdout + f'\nprintf %s "$MASTER_ADDR" > {out}\n'.encode()
    ran = subprocess.run([shell], input=script, capture_output=True, timeout=30,
                         env={"PATH": os.environ["PATH"]})
    assert ran.returncode == 0, ran.stderr
    assert not canary.exists(), printed.stdout
    assert out.read_bytes() == value.encode("utf-8")


def test_undecodable_bytes_go_out_as_the_same_bytes(tmp_path: Path) -> None:
    raw = b"gpu\xff\xfe01"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "MASTER_"))}
    env.update(STEP)
    env_b = {k.encode(): v.encode() for k, v in env.items()}
    env_b[b"MASTER_ADDR"] = raw
    printed = subprocess.run([sys.executable, "-m", "slurmfabric", "env"], env=env_b,
                             capture_output=True, timeout=30)
    assert printed.returncode == 0 and b"Traceback" not in printed.stderr, printed.stderr
    out = tmp_path / "v"
    subprocess.run(["bash"], input=printed.stdout + f'\nprintf %s "$MASTER_ADDR" > {out}\n'
                   .encode(), check=True)
    assert out.read_bytes() == raw


@pytest.mark.parametrize("value", ["a\nb", "x`id`", 'q"$HOME'])
def test_dotenv_escapes_what_a_shell_would_run(value: str) -> None:
    from slurmfabric.rank.task import render

    text = render({"A": value}, {}, "dotenv", None)
    assert "\n" not in text.rstrip("\n") and "`id`" not in text.replace("\\`", "")
