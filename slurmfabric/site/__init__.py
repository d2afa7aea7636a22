"""Site-wide hooks for jobs slurmfabric did not render: the TaskProlog (taskprolog.py), the
cli_filter.lua policy (clifilter.py) and the files an admin installs (install.py)."""
