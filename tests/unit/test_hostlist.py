"""Pure unit tests of slurmfabric.slurm.hostlist: vectors observed with scontrol, errors, counts."""

from __future__ import annotations

import pytest

from slurmfabric.errors import UsageError
from slurmfabric.slurm import hostlist

VECTORS = {  # observed with scontrol show hostnames, Slurm 22.05 (test_hostlist_scontrol.py)
    "n[9-11]": ["n9", "n10", "n11"],
    "n[009-11]": ["n009", "n010", "n011"],
    "n[1-010]": [f"n{i}" for i in range(1, 11)],
    "n[098-101]": ["n098", "n099", "n100", "n101"],
    "n[09-10,011]": ["n09", "n10", "n011"],
    "gpu[2,1,3]": ["gpu2", "gpu1", "gpu3"],
    "n[0-1],n[0-1]": ["n0", "n1", "n0", "n1"],
    "rack[0-1]_blade[2,3]": ["rack0_blade2", "rack0_blade3", "rack1_blade2", "rack1_blade3"],
    "n[1-2][3-4]": ["n13", "n14", "n23", "n24"],
    "host-[01-02]-gpu[1-2],login1": [
        "host-01-gpu1",
        "host-01-gpu2",
        "host-02-gpu1",
        "host-02-gpu2",
        "login1",
    ],
    "10.0.0.[1-3]": ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
    "n[1-2] m1": ["n1", "n2", "m1"],
    "n[1-2],,m1": ["n1", "n2", "m1"],
    "n1-n3": ["n1-n3"],
    "row[0,1]_rack[2-3]_blade[4,5]": [
        "row0_rack2_blade4",
        "row0_rack2_blade5",
        "row1_rack2_blade4",
        "row1_rack2_blade5",
        "row0_rack3_blade4",
        "row0_rack3_blade5",
        "row1_rack3_blade4",
        "row1_rack3_blade5",
    ],
    "n[1-2]-ib": ["n1-ib", "n2-ib"],  # valid from Slurm 23.02.5
    "": [],
}


@pytest.mark.parametrize("expr", VECTORS)
def test_expand_vectors(expr):
    assert hostlist.expand(expr) == VECTORS[expr]
    assert hostlist.count(expr) == len(VECTORS[expr])
    assert list(hostlist.iter_hosts(expr)) == VECTORS[expr]
    if VECTORS[expr]:
        assert hostlist.first(expr) == VECTORS[expr][0]
        last = VECTORS[expr][-1]
        assert hostlist.index(expr, last) == VECTORS[expr].index(last)


@pytest.mark.parametrize(
    ("expr", "pos"),
    [
        ("n[3-1]", 2),
        ("n[]", 2),
        ("n[a-c]", 2),
        ("n[1-2]]", 6),
        ("n[[1-2]]", 1),
        ("n[1-2", 1),
        ("n[1-65537]", 2),
        ("a,n[1,,2]", 6),
        ("n[1-]", 2),
        ("n[+1]", 2),
        ("n[1, 2]", 4),
        ("x\n[1-2]", 1),
    ],
)
def test_errors_carry_the_position(expr, pos):
    with pytest.raises(hostlist.HostlistError) as info:
        hostlist.expand(expr)
    assert info.value.pos == pos
    assert f"position {pos}" in str(info.value)
    assert isinstance(info.value, UsageError)


def test_guard_against_absurd_expansions():
    assert hostlist.count("n[1-65536][1-65536]") == 65536**2  # counted, never expanded
    with pytest.raises(hostlist.HostlistError, match="more than the limit"):
        hostlist.expand("n[1-65536][1-65536]")


def test_first_reads_only_the_first_item():
    # a broken tail does not matter: first() never parses it (the 10,000-node fast path)
    assert hostlist.first("gpu[0042-0099],n[3-1") == "gpu0042"
    with pytest.raises(hostlist.HostlistError, match="no names"):
        hostlist.first(" , ")


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["n1", "n2", "n3"], "n[1-3]"),
        (["n3", "n2", "n1"], "n[3,2,1]"),
        (["n1", "n2", "n3", "n2"], "n[1-3,2]"),
        (["n1", "a1", "n2"], "n1,a1,n2"),
        (["n1", "n2", "a1", "n3"], "n[1-2],a1,n3"),
        (["n9", "n10"], "n[9-10]"),
        (["n9", "n010"], "n[9,010]"),
        (["n0", "n1", "n00"], "n[0-1,00]"),
        (["n1", "n1"], "n[1,1]"),
        (["n1", "n", "n2"], "n1,n,n2"),
        (["x1y2", "x1y3", "x2y2"], "x1y[2-3],x2y2"),
        ([], ""),
    ],
)
def test_compress_like_scontrol_show_hostlist(names, expected):
    assert hostlist.compress(names) == expected
    assert hostlist.expand(expected) == names


def test_tasks_per_node_counts():
    assert hostlist.expand_counts("2(x3),1") == [2, 2, 2, 1]
    for bad in ["2(x)", "2(x3", "x", "", "2(3)"]:
        with pytest.raises(UsageError, match="invalid count list"):
            hostlist.expand_counts(bad)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        # n10 replaced: the run-end guess sees n11..n40 where a run would put them and must
        # be caught by the whole-block check
        ([f"n{i}" if i != 10 else "x" for i in range(1, 41)], "n[1-9],x,n[11-40]"),
        # a repeat inside a long run, and a run that stops one short of the end
        ([f"n{i}" for i in range(1, 30)] + ["n5"] + [f"n{i}" for i in range(30, 60)],
         "n[1-29,5,30-59]"),
        ([f"c{r}n{i:03d}" for r in range(3) for i in range(1, 101)] + ["c2n100"],
         "c0n[001-100],c1n[001-100],c2n[001-100,100]"),
        # runs of every length around the probe sizes (8, 16, 32, ...)
        ([f"n{i}" for i in range(1, 18)] + [f"n{i}" for i in range(40, 73)],
         "n[1-17,40-72]"),
    ],
)  # fmt: skip
def test_compress_runs_with_near_misses(names, expected):
    assert hostlist.compress(names) == expected
    assert hostlist.expand(expected) == names


def test_the_hand_scan_finds_the_items_and_errors_the_regex_finds() -> None:
    """_items scans short lists by hand (no ``re`` on an MPI rank) and long ones with
    ITEM_REGEX: both must give the same items, offsets and errors."""
    import random

    def run(items, expr):
        try:
            return list(items(expr))
        except hostlist.HostlistError as error:
            return str(error)

    rng = random.Random(35)
    alphabet = "ab1[],- \t\r\n\x0b\x1c\u2003-0"
    exprs = ["", "a", "n[1-4,7],gpu[01-16]", "a[1-2", "a]b", "a[[1]]", "x[1-2]y[3]z, q"]
    exprs += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(14)))
              for _ in range(20000)]
    for expr in exprs:
        assert len(expr) <= hostlist.SCAN_LIMIT
        assert run(hostlist._items, expr) == run(hostlist._items_regex, expr), repr(expr)
    assert any(isinstance(run(hostlist._items, e), str) for e in exprs)  # errors were hit
    assert any(len(run(hostlist._items, e)) > 1 for e in exprs if not
               isinstance(run(hostlist._items, e), str))
