"""nccl-log on real logs from NCCL 2.3 to 2.27 (tests/fixtures/nccl/versions/SOURCES.md):
which network each rank really used, and what is not known from the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmfabric.nccl.log import parse_log

VERSIONS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl" / "versions"

# file -> (networks of the ranks, sorted; problem kinds that must be there; kinds that
# must not)
CASES = {
    # 2.4.7 prints its bootstrap as "NET/Socket : Using [0]ib0" before choosing: the rank
    # that reached "NET/IB : Using" used IB, the 7 cut off before it are not known
    "nccl-2.4.7-ib-after-socket-bootstrap.log": (["IB"] + [None] * 7, {"network_unknown"},
                                                 {"socket_fallback"}),
    "nccl-2.4.8-ib-bootstrap-line-2node.log": (["IB", "IB"], set(), {"socket_fallback"}),
    "nccl-2.4.8-socket-fallback-no-libibverbs-2node.log": (["Socket", "Socket"],
                                                           {"socket_fallback"}, set()),
    "nccl-2.3.7-internal-network-ib.log": (["IB", None, None], set(), {"socket_fallback"}),
    "nccl-2.3.7-internal-network-socket-ib0.log": (["Socket"] * 3, {"socket_fallback"}, set()),
    "nccl-2.5.6-ib-no-device-socket-mpirun-tagged.log": (["Socket"] * 3 + [None],
                                                         {"socket_fallback"}, set()),
    "nccl-2.4.8-ofi-efa-no-using-network-line.log": (None, set(), {"socket_fallback"}),
    "nccl-2.23.4-ofi-efa-aws-libfabric.log": (["AWS Libfabric"] * 2, set(),
                                              {"socket_fallback"}),
    "nccl-2.27.3-ofi-efa-libfabric-plugin-gdrdma.log": (["Libfabric"], set(),
                                                        {"socket_fallback"}),
    # the OFI plugin loads, fails, and NCCL takes its own IB transport over RoCE
    "nccl-2.27.5-ofi-plugin-failed-ib-chosen.log": (["IB"], set(), {"socket_fallback"}),
    "nccl-2.23.4-collnet-sharp-ibext-hang.log": (["IBext_v8"] * 4, set(), {"socket_fallback"}),
    "nccl-2.25.1-socket-no-libibverbs.log": (["Socket"], {"socket_fallback"}, set()),
    "nccl-2.4-bootstrap-no-socket-interface-crash.log": ([None], {"nccl_warn"},
                                                         {"socket_fallback"}),
}


def test_every_fixture_is_covered() -> None:
    assert {p.name for p in VERSIONS.glob("*.log")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_network_per_rank_across_releases(name: str) -> None:
    networks, must, must_not = CASES[name]
    report = parse_log((VERSIONS / name).read_text(errors="replace"), source=name)
    kinds = {p.kind for p in report.problems}
    if networks is not None:
        got = sorted((r.network for r in report.ranks), key=lambda n: (n is None, n or ""))
        want = sorted(networks, key=lambda n: (n is None, n or ""))
        assert got == want, [(r.key, r.network, r.undetermined) for r in report.ranks]
    else:  # 2.4.8 + the OFI plugin prints only "NET/OFI Selected Provider is efa"
        assert {r.network for r in report.ranks} == {"OFI/efa"}
    assert must <= kinds, kinds
    assert not (must_not & kinds), kinds


def test_collnet_is_reported_when_it_ran_and_when_it_did_not() -> None:
    text = (VERSIONS / "nccl-2.23.4-collnet-sharp-ibext-hang.log").read_text()
    report = parse_log(text, source="sharp")
    assert sum(r.collnet_channels for r in report.ranks) > 0
    assert "collnet_unused" not in {p.kind for p in report.problems}
    # the same log without its CollNet channel lines: asked for, never set up
    cut = "\n".join(line for line in text.splitlines() if "via COLLNET/" not in line)
    kinds = {p.kind for p in parse_log(cut, source="sharp").problems}
    assert "collnet_unused" in kinds
