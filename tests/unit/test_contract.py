"""plan/contract.py: fabric.type x node layout -> the NCCL environment, one implementation.

Each row is one (type, fixture node) pair; the fixtures are the layouts of
tests/fixtures/topology/nodes.py (their real-world sources are cited there).
"""

from __future__ import annotations

from pathlib import Path

import fakesysfs
import nodes
import pytest

from slurmfabric.errors import UsageError
from slurmfabric.plan import contract, make_plan
from slurmfabric.topology import Topology, discover

HERE = Path(__file__).resolve().parents[1]

LAYOUTS = ("h100_ib", "h100_roce_numa_off", "aws_efa", "tcp_only")
IB_VARS = {"NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_NET_GDR_LEVEL"}


@pytest.fixture(scope="module")
def topos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Topology]:
    return {name: discover(fakesysfs.build(nodes.NODES[name](), tmp_path_factory.mktemp(name)))
            for name in LAYOUTS}


# (type, layout) -> ("ok", variables that must be set, variables that must be absent) or
# ("error", text the error must contain)
TABLE = {
    ("auto", "h100_ib"): ("ok", {"NCCL_NET": "IB", "NCCL_IB_HCA": None}, {"NCCL_IB_DISABLE"}),
    ("auto", "h100_roce_numa_off"): ("ok", {"NCCL_NET": "IB", "NCCL_IB_GID_INDEX": "3"},
                                     {"NCCL_IB_DISABLE"}),
    ("auto", "aws_efa"): ("ok", {"FI_PROVIDER": "efa"}, {"NCCL_NET", *IB_VARS}),
    ("auto", "tcp_only"): ("ok", {}, {"NCCL_NET", "NCCL_IB_DISABLE", *IB_VARS}),
    ("ib", "h100_ib"): ("ok", {"NCCL_NET": "IB", "NCCL_IB_HCA": None}, {"NCCL_IB_GID_INDEX"}),
    ("ib", "h100_roce_numa_off"): ("error", "no usable InfiniBand rail: found 8 Ethernet rail"),
    ("ib", "aws_efa"): ("error", "no usable InfiniBand rail: found 4 AWS EFA devices"),
    ("ib", "tcp_only"): ("error", "no usable InfiniBand rail: found no RDMA devices"),
    ("roce", "h100_ib"): ("error", "no usable RoCE rail: found 8 InfiniBand rail ports"),
    ("roce", "h100_roce_numa_off"): ("ok", {"NCCL_NET": "IB", "NCCL_IB_GID_INDEX": "3"}, set()),
    ("roce", "aws_efa"): ("error", "no usable RoCE rail"),
    ("roce", "tcp_only"): ("error", "no usable RoCE rail"),
    ("efa", "h100_ib"): ("error", "no usable AWS EFA rail: found 8 InfiniBand"),
    ("efa", "h100_roce_numa_off"): ("error", "no usable AWS EFA rail"),
    ("efa", "aws_efa"): ("ok", {"FI_PROVIDER": "efa"}, {"NCCL_NET", *IB_VARS}),
    ("efa", "tcp_only"): ("error", "no usable AWS EFA rail"),
    ("tcp", "h100_ib"): ("ok", {"NCCL_IB_DISABLE": "1"}, {"NCCL_NET", *IB_VARS}),
    ("tcp", "h100_roce_numa_off"): ("ok", {"NCCL_IB_DISABLE": "1"}, {"NCCL_NET", *IB_VARS}),
    ("tcp", "aws_efa"): ("ok", {"NCCL_IB_DISABLE": "1"}, {"NCCL_NET", "FI_PROVIDER"}),
    ("tcp", "tcp_only"): ("ok", {"NCCL_IB_DISABLE": "1"}, {"NCCL_NET", *IB_VARS}),
}


def test_the_table_covers_every_type_and_layout() -> None:
    assert set(TABLE) == {(t, n) for t in contract.FABRIC_TYPES for n in LAYOUTS}


@pytest.mark.parametrize(("fabric", "layout"), sorted(TABLE))
def test_type_by_layout(topos: dict[str, Topology], fabric: str, layout: str) -> None:
    plan = make_plan(topos[layout], 2, fabric_type=fabric, node="gpu042")
    row = TABLE[(fabric, layout)]
    if row[0] == "error":
        assert len(plan.errors) == 1, plan.errors
        assert plan.errors[0].startswith(f"fabric.type={fabric} but node gpu042 has ")
        assert row[1] in plan.errors[0]
        # a node that cannot honour the type gets nothing that would pretend it can
        assert not IB_VARS & set(plan.nccl_env) and "NCCL_NET" not in plan.nccl_env
        assert "FI_PROVIDER" not in plan.nccl_env
        return
    assert plan.errors == []
    for name, value in row[1].items():
        assert name in plan.nccl_env, (name, plan.nccl_env)
        if value is not None:
            assert plan.nccl_env[name] == value
    assert not row[2] & set(plan.nccl_env), plan.nccl_env
    if fabric == "tcp":
        assert plan.fabric == "tcp"
        assert plan.bindings and all(b.cpus for b in plan.bindings)  # binding still applies
    if fabric == "auto":
        assert any(note.startswith("fabric.type=auto: node gpu042 uses ") for note in plan.notes)


def test_the_users_own_values_still_win_and_contradictions_are_reported(
        topos: dict[str, Topology]) -> None:
    user = {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_DISABLE": "1"}
    plan = make_plan(topos["h100_ib"], 2, fabric_type="tcp", user_env=user)
    assert plan.nccl_env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in plan.nccl_env  # never set by us; the user's stays as it is
    assert any(w.startswith("NCCL_IB_HCA: '=mlx5_0:1' selects IB/RoCE devices, but "
                            "fabric.type is tcp") for w in plan.warnings), plan.warnings
    plan = make_plan(topos["h100_ib"], 2, fabric_type="ib", user_env={"NCCL_NET": "Socket"})
    assert plan.nccl_env["NCCL_NET"] == "Socket"  # the user's value wins, and is flagged
    assert any("NCCL_NET: 'Socket' is not an IB transport" in w for w in plan.warnings)


def test_job_env_is_what_render_exports() -> None:
    assert contract.job_env("tcp") == {"NCCL_IB_DISABLE": "1"}
    assert contract.job_env("ib", {"NCCL_DEBUG": "WARN"}) == {"NCCL_NET": "IB",
                                                              "NCCL_DEBUG": "WARN"}
    assert contract.job_env("auto") == {}
    with pytest.raises(UsageError, match="fabric type 'infiniband' is not accepted"):
        contract.job_env("infiniband")


@pytest.mark.parametrize(("fabric", "env", "bad"), [
    ("auto", {"NCCL_IB_DISABLE": "1", "NCCL_NET": "IB"}, "NCCL_NET"),
    ("ib", {"NCCL_NET": "IBext"}, None),
    ("ib", {"NCCL_NET": "ib"}, None),  # NCCL matches net names without case
    ("efa", {"FI_PROVIDER": "tcp"}, "FI_PROVIDER"),
    ("tcp", {"NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1"}, None),
    ("tcp", {"FI_PROVIDER": "efa"}, "FI_PROVIDER"),
])
def test_conflicts(fabric: str, env: dict[str, str], bad: str | None) -> None:
    lines = contract.conflicts(fabric, env)
    if bad is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith(bad + ":"), lines
