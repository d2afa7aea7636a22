"""slurmfabric as one file for container images that lack it: a zipapp of this package.

Every rank runs ``slurmfabric launch`` inside the job's image, and the per-rank path imports
only the standard library, so the image's own ``python3`` can run it from a zip archive
(PEP 441, https://docs.python.org/3/library/zipapp.html: "python3 app.pyz" runs the
archive's ``__main__.py``). The archive is built from the package's own files, so the
host's ``slurmfabric env`` and the ranks' ``slurmfabric launch`` are always the same code;
it is cached under a name that carries the version and a digest of those files, written
atomically (concurrent jobs on a shared cache each see a whole file).

zipimport never writes bytecode, so a rank importing source compiles every module it
needs at each start (~150 ms). Each module therefore also goes in as an unchecked
hash-based ``.pyc`` (PEP 552) of the building interpreter, which zipimport tries first: an
image whose python3 has the same version loads it as it is; any other finds a bad magic
number and falls back to the ``.py`` next to it (CPython Lib/zipimport.py
``_get_module_code``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import zipfile
from pathlib import Path
from typing import BinaryIO, Optional

from slurmfabric import __version__
from slurmfabric.errors import UsageError

PACKAGE = Path(__file__).resolve().parents[1]
# Where the rendered script mounts the archive inside the container (pyxis
# --container-mounts=SRC:DST:ro; pyxis creates DST, https://github.com/NVIDIA/pyxis/wiki/Usage).
CONTAINER_PATH = "/opt/slurmfabric/slurmfabric.pyz"
ENV_DIR = "SLURMFABRIC_ZIPAPP_DIR"
# cli.run is the installed command's own entry (slurmfabric/__main__.py).
# An image's python3 older than the package's floor (pyproject requires-python) says so.
MAIN = ("import sys\n\nif sys.version_info < (3, 9):\n"
        "    sys.exit('slurmfabric: error: needs python3 >= 3.9, this is '\n"
        "             + sys.version.split()[0])\n"
        "from slurmfabric.cli import run  # noqa: E402\n\nrun()\n")
_STAMP = (2020, 1, 1, 0, 0, 0)  # fixed member times: the same files give the same bytes


def sources(package: Path = PACKAGE) -> list[tuple[str, bytes]]:
    """(archive name, bytes) of every .py file of the package, sorted."""
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        if "__pycache__" in rel.parts:
            continue
        out.append((rel.as_posix(), path.read_bytes()))
    return out


def _bytecode(name: str, source: bytes) -> bytes:
    """An unchecked hash-based .pyc of ``source`` for this interpreter (PEP 552 flags 0b01:
    never compared with the source, which cannot change inside the archive)."""
    code = compile(source, f"{CONTAINER_PATH}/{name}", "exec", dont_inherit=True)
    source_hash = importlib.util.source_hash(source)
    from importlib._bootstrap_external import _code_to_hash_pyc  # what py_compile uses

    return bytes(_code_to_hash_pyc(code, source_hash, checked=False))


def digest(files: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256(importlib.util.MAGIC_NUMBER)  # the bytecode's Python version
    for name, data in files:
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:12]


def default_dir(environ: Optional[dict[str, str]] = None) -> Path:
    """``$SLURMFABRIC_ZIPAPP_DIR``, else ``$XDG_CACHE_HOME/slurmfabric`` or
    ``~/.cache/slurmfabric``: a home directory that every compute node mounts."""
    env = os.environ if environ is None else environ
    if env.get(ENV_DIR):
        return Path(env[ENV_DIR])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slurmfabric"


def ensure(directory: Optional[Path] = None) -> Path:
    """The cached zipapp of this slurmfabric in ``directory`` (default_dir), built if absent.

    The path goes into pyxis's ``--container-mounts`` list, where ',' separates mounts and
    ':' source from target, so a directory holding either is refused."""
    directory = Path(directory or default_dir()).absolute()
    if any(c in str(directory) for c in ",:") or any(c.isspace() for c in str(directory)):
        raise UsageError(f"zipapp directory {str(directory)!r} holds ',', ':' or whitespace, "
                         "which pyxis --container-mounts cannot carry",
                         f"set {ENV_DIR} to a plain path that every compute node sees")
    files = sources()
    target = directory / f"slurmfabric-{__version__}-{digest(files)}.pyz"
    if target.is_file():
        return target
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{target.name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as raw:
            _write(raw, files, bytecode=True)
        tmp.chmod(0o755)
        os.replace(tmp, target)
    except OSError as exc:
        raise UsageError(f"cannot write the slurmfabric zipapp in {directory}: {exc.strerror}",
                         f"set {ENV_DIR} to a writable directory that every compute node "
                         "sees") from None
    return target


def archive(bytecode: bool = True) -> tuple[bytes, str]:
    """(the zipapp's bytes, its digest), built in memory: for a Kubernetes ConfigMap
    (job/k8s.py), whose 1 MiB limit leaves room for the sources but not their bytecode."""
    files = sources()
    buffer = io.BytesIO()
    _write(buffer, files, bytecode)
    return buffer.getvalue(), digest(files)


def _write(raw: BinaryIO, files: list[tuple[str, bytes]], bytecode: bool) -> None:
    raw.write(b"#!/usr/bin/env python3\n")  # zipapp's shebang line: run as a program
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zipped:
        for name, data in [("__main__.py", MAIN.encode()), *files]:
            zipped.writestr(zipfile.ZipInfo(name, _STAMP), data,
                            compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            if bytecode and name != "__main__.py":  # run as a script: never from bytecode
                zipped.writestr(zipfile.ZipInfo(name + "c", _STAMP), _bytecode(name, data),
                                compress_type=zipfile.ZIP_DEFLATED)
