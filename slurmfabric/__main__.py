#!/usr/bin/env python3
# The ``slurmfabric`` command as installed, and ``python -m slurmfabric``: both are cli.run.
#
# pyproject.toml installs this file itself as the ``slurmfabric`` script (hatchling's wheel
# ``shared-scripts``; the installer points its shebang at the environment's interpreter), not
# as a ``[project.scripts]`` entry point: pip's generated wrapper imports ``re`` before
# slurmfabric runs, about 0.6x of a bare interpreter start that every rank's
# ``slurmfabric launch`` would pay. Keep this file to this one import (cli.run: main(), exit).
# Comments, not a docstring: a script is compiled on every start (no .pyc for __main__), and
# a docstring costs about twice the compile time of these lines.

from slurmfabric.cli import run

run()
