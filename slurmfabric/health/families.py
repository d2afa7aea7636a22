"""Every check family, in the order their checks are reported.

Adding a family is its file under health/checks/ (declaring ``FAMILY``) and its name here
(docs/health.md, "Adding a check family"). The import is by name so that this tuple is the
one line to add.
"""

from __future__ import annotations

from slurmfabric.health.family import Family

NAMES = ("gpu", "rdma", "roce", "xid", "nvlink", "dcgm", "clocks", "versions", "amd", "storage",
         "node")

FAMILIES: tuple[Family, ...] = tuple(
    __import__(f"slurmfabric.health.checks.{name}", fromlist=["FAMILY"]).FAMILY
    for name in NAMES)
