"""Node-pair bandwidth sweep: which node, link or cable is slow.

``plan`` writes the sweep's pair list (every node measured against a reference set),
``report`` reads the nccl-tests output of each pair and names the slow node, ``heatmap``
draws the pair matrix. ``summary`` assembles ``pairs report`` (its ``to_dict`` is the --json
document), ``judge`` says what a pair is judged against, ``burnin`` is the burn-in gate
(reservation, drain, resume) and ``sweepjob`` builds the plan ``pairs submit`` renders.
The job script comes from ``templates/pairs.sh.j2`` and is submitted through
``slurmfabric.job.submit``; the CLI is ``slurmfabric pairs``.
"""

from __future__ import annotations
