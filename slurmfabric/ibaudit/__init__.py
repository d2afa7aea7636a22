"""InfiniBand fabric audit with the infiniband-diags tools.

``runner`` runs the tools (with deadlines), ``parse`` turns their text into values,
``names`` maps HCAs to Slurm node names, ``audit`` turns links and counters into findings,
``metrics`` writes Prometheus textfile metrics, ``document`` saves an audit and reads it back
as a baseline, ``drain`` drains the nodes a finding names. The CLI is ``slurmfabric ib``.
"""

from __future__ import annotations
