"""Differential tests: slurmfabric.slurm.hostlist against the installed ``scontrol``.

``scontrol show hostnames`` / ``show hostlist`` need a slurm.conf to start but no daemon,
so a throwaway one is written to a temporary directory. Expressions are batched (dozens
per scontrol call) to keep thousands of cases within a few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from slurmfabric.slurm import hostlist

SCONTROL = shutil.which("scontrol")
pytestmark = pytest.mark.skipif(
    SCONTROL is None,
    reason="scontrol (slurm-client) is not installed: no reference to test against",
)
SENTINEL = "zzsep"  # a name with no digits never joins a neighbour, so it splits batches


class Scontrol:
    def __init__(self, conf: Path) -> None:
        self.env = {**os.environ, "SLURM_CONF": str(conf)}
        out = self._run("--version").stdout
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
        assert match, f"cannot read the Slurm version from {out!r}"
        self.version = tuple(int(x) for x in match.groups())
        # A suffix after the last bracket (n[1-2]-ib) is valid from Slurm 23.02.5 on.
        self.accepts_suffix = self.version >= (23, 2, 5)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [SCONTROL, *args], env=self.env, capture_output=True, text=True, timeout=30
        )

    # Every argument starts with the sentinel: scontrol reads "-a[1-2]" as an option.
    def hostnames(self, expr: str) -> list[str] | None:
        """The expansion, or None when scontrol rejects it (it may still exit 0)."""
        proc = self._run("show", "hostnames", f"{SENTINEL},{expr}")
        if proc.returncode != 0 or "Invalid hostlist" in proc.stderr:
            return None
        lines = proc.stdout.splitlines()
        assert lines[0] == SENTINEL, proc.stdout
        return lines[1:]

    def hostlist(self, names: list[str]) -> str:
        proc = self._run("show", "hostlist", ",".join([SENTINEL, *names]))
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout.strip()
        assert out.startswith(SENTINEL), out
        return out[len(SENTINEL) + 1 :]


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory) -> Scontrol:
    conf = tmp_path_factory.mktemp("slurmconf") / "slurm.conf"
    conf.write_text(
        "ClusterName=hltest\nSlurmctldHost=localhost\n"
        "NodeName=localhost CPUs=1\nPartitionName=debug Nodes=localhost Default=YES\n"
    )
    return Scontrol(conf)


# --- strategies -------------------------------------------------------------------------

text = st.text(alphabet="abn-_.", min_size=0, max_size=3)
inner_text = st.text(alphabet="ab-_.0123456789", min_size=0, max_size=3)


@st.composite
def a_range(draw) -> str:
    lo = draw(st.integers(0, 120))
    hi = lo + draw(st.integers(0, 12))
    lo_text = str(lo).zfill(len(str(lo)) + draw(st.integers(0, 2)))
    if hi == lo and draw(st.booleans()):
        return lo_text
    hi_text = str(hi).zfill(len(str(hi)) + draw(st.integers(0, 1)))
    return f"{lo_text}-{hi_text}"


group = st.lists(a_range(), min_size=1, max_size=3).map(lambda rs: "[" + ",".join(rs) + "]")


@st.composite
def an_item(draw, suffix: bool = False) -> str:
    if not suffix and draw(st.integers(0, 4)) == 0:  # a literal name, maybe ending in digits
        name = draw(text) + draw(st.sampled_from(["", "0", "7", "01", "10", "099"]))
        return name or "x"
    ngroups = draw(st.integers(1, 3))
    parts = [draw(text)]
    for i in range(ngroups):
        parts.append(draw(group))
        if i < ngroups - 1:
            parts.append(draw(inner_text))
    if suffix:
        parts.append(draw(st.text(alphabet="ab-_.", min_size=1, max_size=3)))
    return "".join(parts)


separator = st.sampled_from([",", " ", ",,", "\t", " , "])


@st.composite
def an_expression(draw) -> str:
    items = draw(st.lists(an_item(), min_size=1, max_size=4))
    out = items[0]
    for item in items[1:]:
        out += draw(separator) + item
    return out


@st.composite
def a_name_run_list(draw) -> list[str]:
    """Runs of consecutive numbers with mixed padding, shuffled a little: the merge cases."""
    names: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        prefix = draw(st.sampled_from(["n", "n0", "gpu-", "", "a1b", "x"]))
        start = draw(st.integers(0, 120))
        width = draw(st.integers(0, 4))
        for num in range(start, start + draw(st.integers(1, 6))):
            names.append(prefix + str(num).zfill(width) if width or prefix else str(num))
    if draw(st.booleans()):
        names = draw(st.permutations(names))
    if names and draw(st.booleans()):
        names.append(draw(st.sampled_from(names)))  # a duplicate
    return names


# No shrinking: each step would cost scontrol calls; a failure names its culprit instead.
# Expansions small enough that 25 of them fit in one argument (Linux caps one at 128 KiB).
small_names = an_expression().map(lambda e: hostlist.expand(e)[:150])

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)


# --- tests ------------------------------------------------------------------------------


@SETTINGS
@given(batch=st.lists(an_expression(), min_size=40, max_size=40))
def test_expand_matches_scontrol_hostnames(scontrol, batch):
    """60 batches x 40 expressions: 2,400 generated expressions per run."""
    ours = [name for expr in batch for name in hostlist.expand(expr)]
    theirs = scontrol.hostnames(",".join(batch))
    if theirs != ours:  # find the culprit for a readable failure
        for expr in batch:
            assert hostlist.expand(expr) == scontrol.hostnames(expr), expr
    assert theirs == ours
    assert sum(hostlist.count(e) for e in batch) == len(ours)
    assert [hostlist.first(e) for e in batch] == [hostlist.expand(e)[0] for e in batch]


@SETTINGS
@given(batch=st.lists(st.one_of(a_name_run_list(), small_names), min_size=25, max_size=25))
def test_compress_matches_scontrol_hostlist(scontrol, batch):
    """60 batches x 25 name lists: 1,500 lists per run, separated by a sentinel name."""
    joined: list[str] = []
    for names in batch:
        joined += [*names, SENTINEL]
    theirs = scontrol.hostlist(joined)
    ours = hostlist.compress(joined)
    if theirs != ours:
        for names in batch:
            assert hostlist.compress(names) == scontrol.hostlist(names), names
    assert ours == theirs
    # and the compressed form expands back to the same names, order and duplicates kept
    assert hostlist.expand(ours) == joined


@settings(max_examples=300, deadline=None, phases=SETTINGS.phases)
@given(expr=st.text(alphabet="n1[]-,0 9", max_size=12))
def test_malformed_input_is_never_accepted_differently(scontrol, expr):
    """On junk we may be stricter than Slurm, never laxer, and never different."""
    try:
        ours = hostlist.expand(expr)
    except hostlist.HostlistError:
        return
    theirs = scontrol.hostnames(expr)
    if _has_suffix(expr) and not scontrol.accepts_suffix:
        assert theirs is None, expr
    else:
        assert theirs == ours, expr


def _has_suffix(expr: str) -> bool:
    return any(not isinstance(item, str) and item[0][-1] for item in hostlist.parse(expr))


@settings(max_examples=40, deadline=None, phases=SETTINGS.phases)
@given(item=an_item(suffix=True))
def test_suffix_after_brackets_follows_the_installed_version(scontrol, item):
    ours = hostlist.expand(item)
    theirs = scontrol.hostnames(item)
    if scontrol.accepts_suffix:
        assert theirs == ours
    else:  # Slurm < 23.02.5 rejects these; we accept them as newer Slurm writes them
        assert theirs is None, f"Slurm {scontrol.version} accepted {item!r}"
        assert all(name.endswith(item[item.rindex("]") + 1 :]) for name in ours)


def test_rejections_agree_on_documented_errors(scontrol):
    # (not "n[1-2": after another item Slurm 22.05 half-parses it into the name "n]")
    for expr in [
        "n[3-1]",
        "n[]",
        "n[a-c]",
        "n[1-2]]",
        "n[[1-2]]",
        "n[1-65537]",
        "n[1,,2]",
        "n[1,]",
        "n[-1]",
        "n[1--2]",
        "n[1-2-3]",
        "n[1x2]",
    ]:
        assert scontrol.hostnames(expr) is None, expr
        with pytest.raises(hostlist.HostlistError):
            hostlist.expand(expr)


NEAR_MISSES = [
    # a name replaced inside a run: the run-end guess sees names where a run puts them
    [f"n{i}" if i != 10 else "x" for i in range(1, 41)],
    # names cut at other places: the same concatenation as a run, other lengths
    ["n1", "n2", "n3", "n4n", "5"] + [f"n{i}" for i in range(6, 21)],
    # a repeat in a long run; runs just around the probe sizes 8, 16, 32
    [f"n{i}" for i in range(1, 30)] + ["n5"] + [f"n{i}" for i in range(30, 60)],
    [f"n{i}" for i in range(1, 18)] + [f"n{i}" for i in range(18, 51)] + ["n50"],
    # racks of 100 with widths that change at the rack's end
    [f"c{r}n{i:02d}" for r in range(3) for i in range(1, 101)],
    # a long run (checked name by name above 1,024) with one name replaced
    [f"n{i:04d}" if i != 2000 else "x" for i in range(1, 3001)],
]


@pytest.mark.parametrize("names", NEAR_MISSES, ids=range(len(NEAR_MISSES)))
def test_compress_near_miss_runs_match_scontrol(scontrol, names):
    assert hostlist.compress(names) == scontrol.hostlist(names)
