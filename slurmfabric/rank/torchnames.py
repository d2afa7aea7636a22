"""PyTorch's flight-recorder variables under the names the rank's torch reads.

PyTorch 2.8 renamed them (pytorch/pytorch PR #152563, merged 2025-05-07, "Make FR vendor
neutral"; the first release holding it is 2.8.0, as NVIDIA/nvidia-resiliency-ext
inprocess/abort.py also records: "TORCH_FR_BUFFER_SIZE is introduced in PyTorch 2.8.0"):
torch/csrc/distributed/c10d/FlightRecorder.hpp reads
``getCvarInt({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, ...)`` and
FlightRecorder.cpp ``getCvarString({"TORCH_FR_DUMP_TEMP_FILE",
"TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}, ...)``, where torch <= 2.7 read only the old names.
c10d's getCvar* (Utils.hpp) warns once per process, "Environment variable OLD is deprecated;
use NEW instead", whenever an old name is set, even next to the new one (observed with torch
2.13.0: both names set still print it). ``TORCH_NCCL_DUMP_ON_TIMEOUT`` kept its name.

So the script sets the new names only, and ``slurmfabric launch`` (already on every rank,
just before the exec) adds the old names for a torch older than 2.8. Which torch the
program imports is read from its ``torch/version.py`` (or dist-info), never by importing it:
the program's interpreter is found from its command (a ``python`` on PATH, or a script's
``#!`` line), and its site directories from that interpreter's prefix.
"""

from __future__ import annotations

import os

# new name (torch >= 2.8) -> old name (torch <= 2.7)
RENAMED = {"TORCH_FR_BUFFER_SIZE": "TORCH_NCCL_TRACE_BUFFER_SIZE",
           "TORCH_FR_DUMP_TEMP_FILE": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
           "TORCH_FR_CPP_STACK": "TORCH_NCCL_TRACE_CPP_STACK"}
FIRST_NEW = (2, 8)
# re and typing stay off this path: launch runs on every rank (test_env_launch_cli.py)


def _is_python(name: str) -> bool:
    """python, python3, python3.11: what runs a Python program."""
    rest = name[len("python"):] if name.startswith("python") else "x"
    return rest == "" or rest.replace(".", "").isdigit()


def _version(name: str) -> tuple[int, int] | None:
    """(major, minor) of a torch distribution's metadata directory name, as pip writes it
    (torch-2.13.0+cpu.dist-info; torch-2.1.0-py3.10.egg-info), else None."""
    if not name.startswith("torch-") or not name.endswith((".dist-info", ".egg-info")):
        return None
    parts = name[len("torch-"):].split(".")
    if len(parts) < 3 or not parts[0].isdigit():
        return None
    minor = ""
    for char in parts[1]:
        if not char.isdigit():
            break
        minor += char
    return (int(parts[0]), int(minor)) if minor else None


def _which(name: str, env: dict[str, str]) -> str | None:
    if "/" in name:
        return name if os.path.isfile(name) else None
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def interpreter(command: list[str], env: dict[str, str]) -> str | None:
    """The Python that ``command`` runs: itself when it is a ``python``, else the one its
    ``#!`` line names (a console script such as torchrun, or an executable train.py)."""
    if not command:
        return None
    path = _which(command[0], env)
    if path is None:
        return None
    if _is_python(os.path.basename(path)):
        return path
    try:
        with open(path, "rb") as handle:
            first = handle.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        return _which(words[0], env) if words and _is_python(words[0]) else None
    return words[0] if words and _is_python(os.path.basename(words[0])) else None


def site_dirs(python: str, env: dict[str, str]) -> list[str]:
    """Where ``python`` imports from, as site.py lays it out: PYTHONPATH, then its prefix's
    site-packages (a venv's, and the base's with include-system-site-packages) and Debian's
    dist-packages. Read from the file system, without running it."""
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    dirs = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    prefixes = [prefix]
    try:
        with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as handle:
            cfg = dict(line.split("=", 1) for line in handle if "=" in line)
        cfg = {k.strip(): v.strip() for k, v in cfg.items()}
        if cfg.get("include-system-site-packages", "").lower() == "true" and cfg.get("home"):
            prefixes.append(os.path.dirname(cfg["home"]))
    except OSError:
        prefixes.append(os.path.join(prefix, "local"))  # Debian: /usr/local/lib/python3.X
    for base in prefixes:
        lib = os.path.join(base, "lib")
        try:
            names = sorted(n for n in os.listdir(lib) if n.startswith("python3"))
        except OSError:
            continue
        for name in names:
            dirs += [os.path.join(lib, name, "site-packages"),
                     os.path.join(lib, name, "dist-packages")]
    return dirs


def torch_version(dirs: list[str]) -> tuple[int, int] | None:
    """(major, minor) of the torch package that ``dirs`` give first, import order: its
    torch/version.py (``__version__ = '2.13.0+cpu'``, in every torch wheel), else the
    torch-*.dist-info beside it. One failed open per directory without torch."""
    for directory in dirs:
        try:
            with open(os.path.join(directory, "torch", "version.py"), encoding="utf-8") as f:
                text = f.read(4096)
        except OSError:
            if not os.path.isdir(os.path.join(directory, "torch")):
                continue
            text = ""
        for line in text.splitlines():
            if line.startswith("__version__"):
                found = _version("torch-" + line.split("=", 1)[1].strip().strip("'\"")
                                 + ".dist-info")
                if found:
                    return found
        for name in os.listdir(directory):
            found = _version(name)
            if found:
                return found
    return None


def program_torch(command: list[str], env: dict[str, str]) -> tuple[int, int] | None:
    python = interpreter(command, env)
    return torch_version(site_dirs(python, env)) if python else None


def adapt(env: dict[str, str], command: list[str]) -> tuple[int, int] | None:
    """Add the old names next to the new ones the script set when the program's torch
    predates 2.8, or cannot be found (then both: the dumps matter more than one warning).
    Does nothing (and looks for nothing) when no new name is set."""
    pending = [new for new in RENAMED if env.get(new) and RENAMED[new] not in env]
    if not pending:
        return None
    version = program_torch(command, env)
    if version is None or version < FIRST_NEW:
        for new in pending:
            env[RENAMED[new]] = env[new]
    return version
