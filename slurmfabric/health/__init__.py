"""Node health checks for Slurm prolog/epilog: checks, hang-proof runner, drain and resume.

Standard library only at import time: this package is on the hook path (a test asserts
that the prolog imports no pydantic, jinja2, torch, psutil or pynvml).
"""

from __future__ import annotations
