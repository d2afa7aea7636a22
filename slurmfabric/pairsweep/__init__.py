"""Node-pair bandwidth sweep: which node, link or cable is slow.

``plan`` writes the sweep's pair list (every node measured against a reference set),
``report`` reads the nccl-tests output of each pair and names the slow node, ``heatmap``
draws the pair matrix. The job script comes from ``templates/pairs.sh.j2`` and is submitted
through ``slurmfabric.job.submit``; the CLI is ``slurmfabric pairs``.
"""

from __future__ import annotations
