"""How a pair sweep is judged: against what, and below which fraction a pair is low.

One rule for the sweep job's retests, ``pairs retest-plan`` and ``pairs report``: the options
given now, else the ones the sweep was submitted with (``plan.json``'s ``judge``), else the
defaults: the median of the node medians at 0.8, or the sweep's best pair at 0.93 (NVIDIA
ClusterKit's rule), or an expected bus bandwidth (given, or from the whatif model)."""

from __future__ import annotations

from dataclasses import dataclass

from slurmfabric.errors import UsageError


@dataclass(frozen=True)
class Judge:
    reference: str  # "median" or "best"
    threshold: float
    expected: float | None = None

    def to_dict(self) -> dict:
        """As plan.json and ``pairs report --json`` carry it."""
        return {"reference": self.reference, "threshold": self.threshold,
                "expected": self.expected}


def resolve(reference: str | None = None, threshold: float | None = None,
            expected: float | None = None, saved: dict | None = None) -> Judge:
    """The options given now (None: not given), else ``saved``, else the defaults."""
    saved = saved or {}
    reference = reference or saved.get("reference") or "median"
    expected = expected if expected is not None else saved.get("expected")
    threshold = threshold if threshold is not None else saved.get("threshold")
    if threshold is None:
        threshold = 0.93 if reference == "best" and expected is None else 0.8
    return Judge(reference=reference, threshold=float(threshold),
                 expected=None if expected is None else float(expected))


def expected_from(spec: str) -> tuple[float, str]:
    """The pair bandwidth the rails should give, from the whatif model
    (slurmfabric/whatif/model.py), for this node's rails ('topo') or a compute node's
    topology snapshot; with the line that says where it came from."""
    from slurmfabric.nccl.tests import discover_fabric
    from slurmfabric.whatif import model as whatif

    topo = None
    if spec != "topo":
        from slurmfabric.topology import snapshot

        topo = snapshot.load(spec)
    rates, names, fabric = discover_fabric(None, topo)
    if not rates:
        raise UsageError(f"--expected-from {spec}: no rail NIC found (slurmfabric topo "
                         "--explain says why)", hint="give --expected GBPS instead")
    expected = whatif.nic_bound_busbw(rates, fabric)
    why = (f"expected {expected:.1f} GB/s: {len(rates)} {fabric} rails of {max(rates):g} Gb/s "
           f"({', '.join(names[:4])}{' ...' if len(names) > 4 else ''}), the whatif model")
    return expected, why
