"""``python -m slurmfabric`` is the same as the ``slurmfabric`` console script."""

from slurmfabric.cli import main

raise SystemExit(main())
