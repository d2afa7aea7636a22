"""Hostile configs: thousands of them, each refused with a clear error or rendered and *run*.

Every user-controlled field of the job config gets every value of a hostile corpus (shell
metacharacters, quotes, newline, CR, NUL, Unicode separators and format characters, an
``#SBATCH`` line, leading dashes, list separators, an undecodable byte), through each config
source (the TOML file, ``--set``, the ``SLURMFABRIC_*`` environment). A config is either

* refused: a ConfigError whose every line is one printable line, one of them naming the field
  (or its environment variable / --set key); never another exception; and values of the
  classes the rules forbid (textcheck.py and the field validators) are always refused; or
* rendered: the script passes ``bash -n`` and shellcheck and is run by bash in a sandbox whose
  PATH holds recording stubs for srun, torchrun, mpirun, module and slurmfabric (the stub for
  ``slurmfabric env`` runs the real one); then no injected command ran (a canary file), the
  hostile value reached its command as one exact argument (or cwd, or environment value), and
  the ``#SBATCH`` block holds exactly the configured directives.

The counts are printed at the end (``-s``) and asserted: 0 injections, 0 tracebacks, 0 wrong
argv, at least 4,000 configs tried.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurmfabric.config import load_config
from slurmfabric.errors import ConfigError
from slurmfabric.job.render import comment, render_sbatch, sbatch_options

pytestmark = pytest.mark.hostile

CANARY = "@CANARY@"
HOSTILE = [
    "a b", "a'b", 'a"b', f"$(touch {CANARY})", f"`touch {CANARY}`", f"; touch {CANARY}",
    f"| touch {CANARY}", f"&& touch {CANARY} &&", "$HOME", "${PATH}", "\\", "*", "?", "~",
    "!!", "#x", "%s%n", "a=b", "é中😀", "\u00a0nbsp", f"x\ntouch {CANARY}", "x\r",
    "\ttab", "\x1b[31m", "nul\x00byte", "\u2028sep", "\u0085nel", "\u202ertl", "\u200bzw",
    "\n#SBATCH --exclusive", "-n", "--", "--help", ",", "a,b", "a:b:c:d", "bad\udcffbyte",
    f"' ; touch {CANARY} ; '", f'"; touch {CANARY}; "', "ok", "'", '"', "$", "&", ";",
    "<x>", "a\\nb", "${IFS}", "$((1+1))", f"\\$(touch {CANARY})", "{a,b}", "[!x]",
    f"'$(touch {CANARY})'", "\x7fdel", "\x0bvt", "\x0cff", "  ", "", "a\u3000b", "\ufeffbom",
    "#SBATCH --exclusive", "-", "-x=1", "=",
]
# Classes that must be refused wherever they appear (NUL, undecodable) or in strict fields.
ALWAYS_REFUSED = ("\x00", "\udcff")
CONTROL = ("\n", "\r", "\t", "\x1b", "\u2028", "\u0085", "\u202e", "\u200b")
FREE_KINDS = {"arg", "env_value", "srun_arg", "mpirun_arg", "torchrun_arg", "code"}

# dotted field -> (kind, launcher it needs or None)
FIELDS: dict[str, tuple[str, str | None]] = {
    **{f"job.{name}": ("sbatch", None) for name in (
        "name", "partition", "account", "qos", "time", "mem", "constraint", "reservation",
        "output", "error", "array", "dependency", "mail_type", "mail_user",
        # issue 31: Slurm's other request forms and common options
        "mem_per_cpu", "mem_per_gpu", "gpu_type", "exclude", "nodelist", "distribution",
        "hint")},
    "job.extra_sbatch[]": ("extra_sbatch", None),
    "launcher.slurmfabric": ("exe", None),
    "launcher.torchrun": ("exe", "torchrun"),
    "launcher.mpirun": ("exe", "mpirun"),
    "launcher.slurmfabric_module": ("module", None),
    "launcher.srun_args[]": ("srun_arg", "srun"),
    "launcher.mpirun_args[]": ("mpirun_arg", "mpirun"),
    "launcher.nccl_tests.bin_dir": ("bindir", "nccl-tests"),
    "launcher.nccl_tests.min_bytes": ("size", "nccl-tests"),
    "program.command[0]": ("exe", None),
    "program.command[]": ("arg", None),
    "program.workdir": ("workdir", None),
    "program.env.HX_VALUE": ("env_value", None),
    "program.env.<name>": ("env_name", None),
    # added to what HX_PATH holds at run time (unset here, so exactly the value)
    "program.env_prepend.HX_PATH": ("env_value", None),
    # ${NAME} expands at run time (so no exact value to compare); nothing else may run
    "program.env_expand.HX_VALUE": ("env_value", None),
    "program.container_image": ("image", "srun"),
    "program.container_mounts[]": ("mount", "srun"),
    "program.modules[]": ("module", None),
    "fabric.nccl.NCCL_DEBUG": ("nccl_value", None),
    # issue 31's data fields: a step's argv, srun options, image and name; a parameter's
    # default (exported, and ${HX_P} in program.command) and name; torchrun's own words/options
    "steps[].command[]": ("arg", None),
    "steps[].srun_args[]": ("srun_arg", None),
    "steps[].container_image": ("image", None),
    "steps[].name": ("step_name", None),
    "program.params.HX_P": ("env_value", None),
    "program.params.<name>": ("param_name", None),
    "launcher.torchrun[]": ("torchrun_word", "torchrun"),
    "launcher.torchrun_args[]": ("torchrun_arg", "torchrun"),
    # the code fields (shell code by the user's explicit choice): refused with a clear error
    # or rendered verbatim; never run here, since running code is what they are for
    "program.setup[]": ("code", None),
    "program.teardown[]": ("code", None),
    "program.task_setup[]": ("code", None),
}
CODE_KIND = "code"
LAUNCHERS = ("torchrun", "srun", "mpirun", "srun-pmix", "nccl-tests")
SOURCES = ("toml", "set", "env")

STUB_RECORD = 'printf "%s\\0" "STUB:$STUB_NAME" "$@" >> "$REC"; printf "\\1\\0" >> "$REC"\n'
STUBS = {
    # srun / mpirun / torchrun: record, then run what follows their options (the agent's bash,
    # or slurmfabric: its path is STUB_SF), like the real launchers would.
    # In a container job the node check is 'sh -c' and the ranks run 'python3 ZIPAPP'.
    "srun": ('for ((i = 1; i <= $#; i++)); do a=${!i}; if [ "$a" = bash ] || [ "$a" = sh ] '
             '|| [ "$a" = python3 ] || [ "$a" = "$STUB_SF" ] || [ "${a##*/}" = probe ]; then '
             'exec "${@:i}"; fi; done; exit 97'),
    "mpirun": ('for ((i = 1; i <= $#; i++)); do if [ "${!i}" = "$STUB_SF" ]; then '
               'exec "${@:i}"; fi; done; exit 97'),
    "torchrun": ('for ((i = 1; i <= $#; i++)); do if [ "${!i}" = "$STUB_SF" ] || '
                 '[ "${!i}" = python3 ]; then exec "${@:i}"; fi; done; exit 97'),
    # the image's python3 running the slurmfabric zipapp (docs/containers.md)
    "python3": ('if [ "${1##*/}" = slurmfabric.pyz ]; then shift; exec "$STUB_SF" "$@"; fi; '
                'exit 97'),
    "module": "exit 0",
    # slurmfabric: env is the real one; launch execs what follows its "--"
    # zipapp: a path that exists, since the script's host check reads it on every node
    "slurmfabric": ('if [ "$1" = env ]; then exec "$STUB_PY" -m slurmfabric "$@"; fi\n'
                    'if [ "$1" = zipapp ]; then echo /dev/null; exit 0; fi\n'
                    'if [ "$1" = --version ]; then exit 0; fi\n'
                    'while [ "$#" -gt 0 ] && [ "$1" != -- ]; do shift; done; shift; '
                    'exec "$@"'),
    # the program: its argv, cwd and environment, NUL-separated
    "probe": ('pwd > "$REC.cwd"; env -0 > "$REC.env"; exit 0'),
}


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    return _toml_string(str(value))


def _toml(data: dict) -> str:
    lines = []
    for section, table in data.items():
        if isinstance(table, list):  # [[steps]]
            for item in table:
                lines.append(f"[[{section}]]")
                lines += [f"{_toml_string(k)} = {_toml_value(v)}" for k, v in item.items()]
            continue
        lines.append(f"[{section}]")
        lines += [f"{_toml_string(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def base_config(launcher: str, stubs: Path) -> dict:
    """A 2-node config of ``launcher`` whose every program is a recording stub."""
    data: dict = {
        "job": {"nodes": 2, "partition": "debug"},
        "launcher": {"type": launcher, "slurmfabric": str(stubs / "slurmfabric"),
                     "torchrun": str(stubs / "torchrun"), "mpirun": str(stubs / "mpirun")},
        "program": {"command": [str(stubs / "probe"), "fixed-arg"]},
    }
    if launcher == "torchrun":
        data["launcher"]["nproc_per_node"] = 2
    else:
        data["job"]["ntasks_per_node"] = 2
    return data


class Case:
    """One (field, value, source) combination and the sandbox it runs in."""

    def __init__(self, index: int, field: str, value: str, source: str, root: Path) -> None:
        self.index, self.field, self.raw, self.source = index, field, value, source
        self.kind, needed = FIELDS[field]
        spread = zlib.crc32(f"{field}{value}".encode("utf-8", "surrogatepass"))
        self.launcher = needed or LAUNCHERS[spread % len(LAUNCHERS)]
        self.dir = root / f"c{index}"
        self.canary = self.dir / "pwned"
        self.value = value.replace(CANARY, str(self.canary))
        self.error: str | None = None
        self.script: Path | None = None

    def must_refuse(self) -> bool:
        value = self.value
        if any(ch in value for ch in ALWAYS_REFUSED):
            return True
        if self.kind not in FREE_KINDS and any(ch in value for ch in CONTROL):
            return True
        if self.kind == "exe":
            return not value  # else a path under the sandbox: a leading '-' cannot occur
        if self.kind == "module" and (value.startswith("-") or not value):
            return True
        if self.kind == "mount" and "," in value:
            return True
        if self.kind in ("env_name", "param_name"):
            return not (value.isidentifier() and value.isascii())
        if self.kind == "step_name":
            return not value or not (value[0].isalnum() and value.isascii())
        if self.kind == "code":
            return "\n" in value or "\r" in value or \
                value.lstrip().upper().startswith("#SBATCH")
        return False

    def exe_path(self) -> str:
        if not self.value:
            return ""  # an empty program: must be refused, never a directory to exec
        return str(self.dir / "bin" / self.value.replace("/", "_"))

    def build(self, stubs: Path) -> tuple[dict, str, object]:
        """(base data for the TOML file, dotted key, hostile value in its field's form)."""
        launcher = self.launcher
        data = base_config(launcher, stubs)
        if launcher == "nccl-tests":
            del data["program"]["command"]
            data["launcher"]["nccl_tests"] = {"bin_dir": str(self.dir / "nt")}
        key, value = self.field, self.value
        if self.kind == "exe":
            value = self.exe_path()
        if self.field == "launcher.nccl_tests.bin_dir":
            value = str(self.dir / "nt" / self.value.replace("/", "_"))
        if self.field == "program.workdir":
            value = "wd/" + self.value.replace("/", "_")
        if self.field == "program.command[0]":
            return data, "program.command", [value, "fixed-arg"]
        if self.field == "program.command[]":
            return data, "program.command", [str(stubs / "probe"), value, "fixed-arg"]
        if self.field == "program.env.<name>":
            return data, f"program.env.{self.value}", "v"
        if self.field == "program.params.<name>":
            return data, f"program.params.{self.value}", "v"
        if self.field == "program.params.HX_P" and launcher != "nccl-tests":
            data["program"]["command"] = [str(stubs / "probe"), "p=${HX_P}", "fixed-arg"]
        if key.startswith("steps[]."):
            step = {"name": "hx", "command": [str(stubs / "probe"), "step-arg"]}
            name = key.split(".")[1]
            if name == "command[]":
                step["command"] = [str(stubs / "probe"), value]
            else:
                step[name.removesuffix("[]")] = [value] if name.endswith("[]") else value
            return data, "steps", [step]
        if self.field == "launcher.torchrun[]":
            return data, "launcher.torchrun", [str(stubs / "torchrun"), value]
        if key.endswith("[]"):
            return data, key[:-2], [value]
        return data, key, value


def _deliver(case: Case, stubs: Path) -> tuple[Path, list[str], dict[str, str]]:
    """Write the TOML file; return (path, --set items, environment) for the source."""
    data, key, value = case.build(stubs)
    case.dir.mkdir(parents=True)
    sets: list[str] = []
    env: dict[str, str] = {}
    parts = key.split(".")
    if case.source == "toml":
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    elif case.source == "set":
        text = _toml_value(value) if isinstance(value, list) else value
        sets.append(f"{key}={text}")
    else:
        name = "SLURMFABRIC_" + "__".join(parts)
        env[name] = json.dumps(value, ensure_ascii=False) if isinstance(value, list) else value
    # nested tables go first-level into sections; deeper ones (nccl_tests) inline
    path = case.dir / "job.toml"
    try:
        path.write_text(_toml(data), encoding="utf-8")
    except UnicodeEncodeError:
        raise _NotApplicable from None
    return path, sets, env


class _NotApplicable(Exception):
    """A value the source cannot carry at all (NUL in an environment variable)."""


def _load(case: Case, stubs: Path) -> object | None:
    """Load and render in-process; record the outcome on the case."""
    if case.source == "env" and "\x00" in case.value:
        raise _NotApplicable
    if case.kind in ("env_name", "param_name") and case.source in ("env", "set") and (
            "=" in case.value or "." in case.value or not case.value.strip(" ")):
        raise _NotApplicable  # the source's own syntax: such a name never reaches the config
    if case.source == "toml" and "\udcff" in case.value:
        raise _NotApplicable  # a TOML file is UTF-8: it cannot hold an undecodable byte
    path, sets, env = _deliver(case, stubs)
    saved = {k: v for k, v in os.environ.items() if k.startswith("SLURMFABRIC_")}
    for name in saved:
        del os.environ[name]
    os.environ.update(env)
    try:
        config = load_config(path, sets, site_defaults="", environment=True)
        script = render_sbatch(config)
    except ConfigError as error:
        case.error = "\n".join(error.problems)
        return None
    finally:
        for name in env:
            os.environ.pop(name, None)
        os.environ.update(saved)
    case.script = case.dir / "job.sh"
    case.script.write_text(script, encoding="utf-8")
    return config


def _field_named(case: Case, text: str) -> bool:
    base = case.field.split("[")[0].replace(".<name>", "")
    names = {base, base.rsplit(".", 1)[0], "SLURMFABRIC_" + "__".join(base.split("."))}
    if case.kind == "exe" and case.field == "program.command[0]":
        names.add("program.command")
    return any(name in text for name in names)


def _records(case: Case) -> list[list[str]]:
    raw = (case.dir / "rec").read_bytes() if (case.dir / "rec").exists() else b""
    out = []
    for chunk in raw.split(b"\x01\x00"):
        if chunk:
            out.append([p.decode("utf-8", "surrogateescape") for p in chunk.split(b"\x00")[:-1]])
    return out


def _prepare_sandbox(case: Case, stubs: Path, config: object) -> dict[str, str]:
    (case.dir / "bin").mkdir(exist_ok=True)
    cfg = config
    sf = cfg.launcher.slurmfabric  # type: ignore[attr-defined]
    for path in {sf, cfg.launcher.torchrun[0], cfg.launcher.mpirun}:  # type: ignore[attr-defined]
        target = Path(path)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            name = "slurmfabric" if path == sf else Path(path).name
            stub = {"launcher.torchrun": "torchrun", "launcher.mpirun": "mpirun"}.get(
                case.field, name if name in STUBS else "slurmfabric")
            target.symlink_to(stubs / stub)
    command = cfg.program.command  # type: ignore[attr-defined]
    if command and not Path(command[0]).exists():
        Path(command[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(command[0]).symlink_to(stubs / "probe")
    if cfg.launcher.type == "nccl-tests":  # type: ignore[attr-defined]
        bin_dir = Path(cfg.launcher.nccl_tests.bin_dir)  # type: ignore[attr-defined]
        bin_dir.mkdir(parents=True, exist_ok=True)
        for op in cfg.launcher.nccl_tests.ops:  # type: ignore[attr-defined]
            (bin_dir / f"{op}_perf").symlink_to(stubs / "probe")
    if cfg.program.workdir:  # type: ignore[attr-defined]
        (case.dir / cfg.program.workdir).mkdir(parents=True)  # type: ignore[attr-defined]
    return {
        "PATH": f"{stubs}:/usr/bin:/bin", "REC": str(case.dir / "rec"), "STUB_SF": sf,
        "STUB_PY": sys.executable, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
        "SLURMD_NODENAME": "n1", "SLURMFABRIC_PORT_DIR": str(case.dir / "ports"),
        "LANG": "C.UTF-8", "HOME": str(case.dir),
        "PYTHONPYCACHEPREFIX": os.environ["PYTHONPYCACHEPREFIX"],  # no bytecode in the checkout
    }


def _run(case: Case, stubs: Path, config: object) -> list[str]:
    """Run the rendered script; return what went wrong (empty: all good)."""
    env = _prepare_sandbox(case, stubs, config)
    wrong = []
    syntax = subprocess.run(["bash", "-n", str(case.script)], capture_output=True)
    if syntax.returncode:
        return [f"bash -n: {syntax.stderr.decode(errors='replace')}"]
    proc = subprocess.run(["bash", str(case.script)], cwd=case.dir, env=env,
                          capture_output=True, timeout=120)
    if case.canary.exists():
        return ["INJECTION: the canary file was created"]
    if proc.returncode:
        return [f"script exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-400:]}"]
    records = _records(case)
    probes = [r for r in records if r[0] == "STUB:probe"]
    if not probes:
        return ["the program never ran"]
    cfg = config
    value = case.build(stubs)[2]
    if case.field == "program.command[]" and any(p[1:] != [value[1], "fixed-arg"]
                                                  for p in probes):
        wrong.append(f"argv {probes[0][1:]!r} != {[value[1], 'fixed-arg']!r}")
    if case.field == "program.workdir":
        cwd = (case.dir / "rec.cwd").read_bytes().decode("utf-8", "surrogateescape").rstrip("\n")
        if cwd != str(case.dir / value):
            wrong.append(f"cwd {cwd!r} != {str(case.dir / value)!r}")
    if case.field == "steps[].command[]" and [value[0]["command"][1]] not in [
            p[1:] for p in probes]:
        wrong.append(f"no step probe got argv {[value[0]['command'][1]]!r}: {probes!r}")
    if case.field == "program.params.HX_P" and case.launcher != "nccl-tests" and any(
            p[1:] != ["p=" + value, "fixed-arg"] for p in probes):
        wrong.append(f"argv {probes[0][1:]!r} != {['p=' + value, 'fixed-arg']!r}")
    if case.field == "launcher.torchrun[]" and not any(
            r[0] == "STUB:torchrun" and r[1:2] == [value[1]] for r in records):
        wrong.append(f"torchrun's second word {value[1]!r} did not arrive as its first argument")
    step_sruns = [r for r in records if r[0] == "STUB:srun" and "--job-name=hx" in r]
    if case.field == "steps[].srun_args[]" and not any(value[0]["srun_args"][0] in r[1:]
                                                       for r in step_sruns):
        wrong.append(f"the step's srun lacks {value[0]['srun_args'][0]!r} as one argument")
    if case.field == "steps[].container_image" and not any(
            f"--container-image={value[0]['container_image']}" in r for r in step_sruns):
        wrong.append("the step's srun never got --container-image=<value> as one argument")
    if case.field in ("program.env.HX_VALUE", "fabric.nccl.NCCL_DEBUG",
                      "program.env_prepend.HX_PATH", "program.params.HX_P"):
        name = case.field.rsplit(".", 1)[1]
        pairs = (case.dir / "rec.env").read_bytes().split(b"\x00")
        got = [p.split(b"=", 1)[1].decode("utf-8", "surrogateescape") for p in pairs
               if p.startswith(name.encode() + b"=")]
        if got != [value]:
            wrong.append(f"{name} reached the program as {got!r}, not {value!r}")
    if case.field in ("program.modules[]", "launcher.slurmfabric_module"):
        modules = [r[1:] for r in records if r[0] == "STUB:module"]
        wanted = value[0] if isinstance(value, list) else value
        if ["load", wanted] not in modules:
            wrong.append(f"module calls {modules!r} lack ['load', {wanted!r}]")
    for listed, stub in (("launcher.srun_args[]", "STUB:srun"),
                         ("launcher.mpirun_args[]", "STUB:mpirun")):
        if case.field == listed:
            calls = [r for r in records if r[0] == stub]
            if not calls or not all(value[0] in r[1:] for r in calls[-1:]):
                wrong.append(f"{stub} argv lacks {value[0]!r} as one argument: {calls[-1:]}")
    srun_calls = [r for r in records if r[0] == "STUB:srun"]
    if case.field == "program.container_image" and not any(
            f"--container-image={value}" in r for r in srun_calls):
        wrong.append("srun never got --container-image=<value> as one argument")
    # in a container job the slurmfabric zipapp's mount comes first (docs/containers.md)
    zipapp = "/dev/null:/opt/slurmfabric/slurmfabric.pyz:ro,"
    if case.field == "program.container_mounts[]" and not any(
            f"--container-mounts={first}{value[0]}" in r for r in srun_calls
            for first in ("", zipapp)):
        wrong.append("srun never got --container-mounts=<value> as one argument")
    expected = ["#SBATCH " + o for o in sbatch_options(cfg)]  # type: ignore[arg-type]
    expected += ["#SBATCH " + comment(o) for o in cfg.job.extra_sbatch]  # type: ignore
    lines = [line for line in case.script.read_text().splitlines()
             if line.lstrip().upper().startswith("#SBATCH")]
    if lines != expected:
        wrong.append(f"#SBATCH block {lines!r} != {expected!r}")
    return wrong


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stubs")
    for name, body in STUBS.items():
        path = root / name
        path.write_text(f"#!/bin/bash\nSTUB_NAME={name}\n{STUB_RECORD}{body}\n")
        path.chmod(0o755)
    return root


def test_thousands_of_hostile_configs(stubs: Path, tmp_path: Path, hostile_report) -> None:
    assert shutil.which("shellcheck"), "shellcheck missing: apt-get install shellcheck"
    cases = [Case(i, field, value, source, tmp_path)
             for i, (field, value, source) in enumerate(
                 (f, v, s) for f in FIELDS for v in HOSTILE for s in SOURCES)]
    counts = dict(tried=0, not_applicable=0, rejected=0, rendered=0, code_rendered=0,
                  injections=0, tracebacks=0, wrong_argv=0, wrong_accept=0, unclear_errors=0)
    failures: list[str] = []
    rendered: list[tuple[Case, object]] = []
    for case in cases:
        try:
            config = _load(case, stubs)
        except _NotApplicable:
            counts["not_applicable"] += 1
            continue
        except Exception as exc:  # anything but ConfigError is a traceback for the user
            counts["tried"] += 1
            counts["tracebacks"] += 1
            failures.append(f"{case.field} via {case.source} = {case.raw!r}: "
                            f"{type(exc).__name__}: {exc}")
            continue
        counts["tried"] += 1
        if config is None:
            counts["rejected"] += 1
            lines = (case.error or "").split("\n")
            if not all(line and line.isprintable() for line in lines) or not _field_named(
                    case, case.error or ""):
                counts["unclear_errors"] += 1
                failures.append(f"unclear error for {case.field} via {case.source} = "
                                f"{case.raw!r}: {case.error!r}")
            continue
        if case.must_refuse():
            counts["wrong_accept"] += 1
            failures.append(f"accepted {case.field} via {case.source} = {case.raw!r}")
        if case.kind == CODE_KIND:  # code runs by choice: its script is not a data check
            counts["code_rendered"] += 1
            continue
        rendered.append((case, config))
    counts["rendered"] = len(rendered)
    scripts = [str(c.script) for c, _ in rendered]
    for start in range(0, len(scripts), 300):
        lint = subprocess.run(["shellcheck", "--shell=bash", *scripts[start:start + 300]],
                              capture_output=True, text=True)
        if lint.returncode:
            failures.append(f"shellcheck: {lint.stdout[:2000]}")
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda pair: _run(pair[0], stubs, pair[1]), rendered))
    for (case, _), wrong in zip(rendered, results):
        for line in wrong:
            key = "injections" if line.startswith("INJECTION") else "wrong_argv"
            counts[key] += 1
            failures.append(f"{case.field} via {case.source} = {case.raw!r} "
                            f"({case.launcher}): {line}")
    hostile_report("hostile configs: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    failures.sort(key=lambda line: line.startswith("shellcheck"))  # the short ones first
    assert not failures, "\n".join(failures[:30]) + f"\n... {len(failures)} problems"
    assert counts["tried"] >= 4000, counts


# Values that mean something else to bash where a command name or a ``cd`` operand stands:
# '%...' is the 'fg' builtin (bash manual, "Job Control Basics"), a builtin's name runs the
# builtin ('eval' would run the launch line's arguments as code), '-' is ``cd "$OLDPWD"``, and
# a relative ``cd`` operand is looked up in CDPATH. Each must be refused naming its field, or
# name exactly the program (directory) it says.
COMMAND_NAMES = ["%stub", "%", "%1", "%%", "%-", "%+", "eval", "exec", "command", "builtin",
                 "fg", "-", "-stub", "+stub", "~stub", "~", "%d/stub"]
COMMAND_FIELDS = {"launcher.slurmfabric": ("srun", "slurmfabric"),
                  "launcher.mpirun": ("mpirun", "mpirun"),
                  "launcher.torchrun": ("torchrun", "torchrun")}
WORKDIRS = ["-", "--", "-P", "%", "%1", "~", "~x", "+", "wd", "..x", "-L/x"]


def _command_case(root: Path, stubs: Path, index: int, field: str | None,
                  value: str) -> tuple[Path, str | None, dict[str, str]]:
    """Render one config with ``value`` in ``field`` (None: program.workdir) and prepare its
    sandbox: (case dir, the ConfigError text or None, the script's environment)."""
    here = root / f"cmd{index}"
    (here / "bin").mkdir(parents=True)
    launcher = COMMAND_FIELDS[field][0] if field else "srun"
    data = base_config(launcher, stubs)
    if field:
        data["launcher"][field.split(".")[1]] = value
        # the name on PATH (or, with a '/', relative to the job's directory) is the stub
        target = here / value if "/" in value else here / "bin" / value
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(stubs / COMMAND_FIELDS[field][1])
    else:
        data["program"]["workdir"] = value
        (here / value).mkdir(parents=True, exist_ok=True)
        (here / "decoy" / value).mkdir(parents=True)  # what CDPATH would pick
    (here / "job.toml").write_text(_toml(data), encoding="utf-8")
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("SLURMFABRIC_")}
    try:
        config = load_config(here / "job.toml", [], site_defaults="")
        (here / "job.sh").write_text(render_sbatch(config), encoding="utf-8")
    except ConfigError as error:
        return here, "\n".join(error.problems), {}
    finally:
        os.environ.update(saved)
    sf = config.launcher.slurmfabric
    env = {
        "PATH": f"{here / 'bin'}:{stubs}:/usr/bin:/bin", "REC": str(here / "rec"),
        "STUB_SF": sf, "STUB_PY": sys.executable, "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
        "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1", "LANG": "C.UTF-8", "HOME": str(here),
        "SLURMFABRIC_PORT_DIR": str(here / "ports"), "CDPATH": str(here / "decoy"),
        "PYTHONPYCACHEPREFIX": os.environ["PYTHONPYCACHEPREFIX"],  # no bytecode in the checkout
    }
    return here, None, env


def test_command_names_and_cd_operands_are_data(stubs: Path, tmp_path: Path,
                                                hostile_report) -> None:
    cases = [(f, v) for f in COMMAND_FIELDS for v in COMMAND_NAMES]
    cases += [(None, v) for v in WORKDIRS]
    failures, ran, refused = [], 0, 0
    for index, (field, value) in enumerate(cases):
        name = field or "program.workdir"
        here, error, env = _command_case(tmp_path, stubs, index, field, value)
        if error is not None:
            refused += 1
            if name not in error or not all(line.isprintable() for line in error.split("\n")):
                failures.append(f"{name} = {value!r}: unclear refusal {error!r}")
            continue
        ran += 1
        proc = subprocess.run(["bash", str(here / "job.sh")], cwd=here, env=env,
                              capture_output=True, timeout=120)
        err = proc.stderr.decode(errors="replace")
        records = _records_in(here)
        if proc.returncode or "job control" in err:
            failures.append(f"{name} = {value!r}: script exit {proc.returncode}: {err[-300:]}")
            continue
        stub = {"launcher.mpirun": "STUB:mpirun", "launcher.torchrun": "STUB:torchrun"}.get(
            name, "STUB:slurmfabric")
        if not any(r[0] == stub for r in records) or not any(r[0] == "STUB:probe"
                                                             for r in records):
            failures.append(f"{name} = {value!r}: {stub} or the program never ran: "
                            f"{[r[0] for r in records]}")
        if field is None:
            cwd = (here / "rec.cwd").read_text().rstrip("\n")
            if cwd != str(here / value):
                failures.append(f"program.workdir = {value!r}: ran in {cwd!r}, not "
                                f"{str(here / value)!r}")
    hostile_report(f"command names and cd operands: {len(cases)} configs, {refused} refused, "
                   f"{ran} run, {len(failures)} problems")
    assert not failures, "\n".join(failures[:30])


def _records_in(directory: Path) -> list[list[str]]:
    raw = (directory / "rec").read_bytes() if (directory / "rec").exists() else b""
    return [[p.decode("utf-8", "surrogateescape") for p in chunk.split(b"\x00")[:-1]]
            for chunk in raw.split(b"\x01\x00") if chunk]


def test_the_code_fields_are_exactly_the_declared_ones() -> None:
    """Shell code by explicit choice lives in the declared code fields only: the suite's
    code kind is exactly launchrules.CODE_FIELDS, and every text field issue 31 added to the
    launch side is in the suite as data or code."""
    from slurmfabric.config.launchrules import CODE_FIELDS

    code = {field.removesuffix("[]") for field, (kind, _) in FIELDS.items() if kind == CODE_KIND}
    assert code == set(CODE_FIELDS)
    covered = {field.split("[")[0].replace(".<name>", "").removesuffix(".HX_P")
               for field in FIELDS}
    for name in ("program.setup", "program.teardown", "program.task_setup", "program.params",
                 "steps", "launcher.torchrun", "launcher.torchrun_args"):
        assert name in covered, name


def test_script_arguments_and_parameter_values_stay_data(stubs: Path, tmp_path: Path,
                                                         hostile_report) -> None:
    """What a submitter passes at run time, ``submit -- ARGS`` ("$@") and ``--param
    NAME=VALUE`` (the job's environment), reaches the program as one exact argument."""
    data = base_config("srun", stubs)
    data["program"].update(command=[str(stubs / "probe"), "p=${HX_P}"], pass_args=True,
                           params={"HX_P": "default"})
    (tmp_path / "job.toml").write_text(_toml(data), encoding="utf-8")
    config = load_config(tmp_path / "job.toml", [], site_defaults="")
    failures, ran = [], 0
    for index, raw in enumerate(HOSTILE):
        if any(ch in raw for ch in ALWAYS_REFUSED):
            continue  # no argv or environment entry can carry these
        case = Case(index, "program.command[]", raw, "toml", tmp_path)
        case.dir.mkdir(parents=True)
        case.script = case.dir / "job.sh"
        case.script.write_text(render_sbatch(config), encoding="utf-8")
        env = {**_prepare_sandbox(case, stubs, config), "HX_P": case.value}
        proc = subprocess.run(["bash", str(case.script), case.value, "fixed-arg"],
                              cwd=case.dir, env=env, capture_output=True, timeout=120)
        ran += 1
        probes = [r[1:] for r in _records(case) if r[0] == "STUB:probe"]
        if case.canary.exists():
            failures.append(f"{raw!r}: INJECTION")
        elif proc.returncode or probes != [["p=" + case.value, case.value, "fixed-arg"]]:
            failures.append(f"{raw!r}: exit {proc.returncode}, argv {probes!r}")
    hostile_report(f"script arguments and parameter values: {ran} run, {len(failures)} "
                   "problems")
    assert not failures, "\n".join(failures[:30])
