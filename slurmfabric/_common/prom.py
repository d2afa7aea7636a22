"""The Prometheus text exposition format, written for node_exporter's textfile collector.

Format: https://prometheus.io/docs/instrumenting/exposition_formats/ (label values escape
backslash, newline and double quote). The collector may read the file at any moment, so it
is written atomically (``files.write_atomic``) and readable by the exporter (0644).
"""

from __future__ import annotations

import os

from slurmfabric._common.files import write_atomic


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(*pairs: tuple[str, str], **named: str) -> str:
    """``{k="v",...}`` from ordered pairs and/or keywords, values escaped."""
    items = [*pairs, *named.items()]
    return "{" + ",".join(f'{k}="{escape(str(v))}"' for k, v in items) + "}"


def write_textfile(path: str | os.PathLike[str], text: str) -> None:
    write_atomic(path, text, 0o644)
