"""``slurmfabric import``: an existing sbatch script -> a config, and what did not fit.

The script is read, never run (shellwords.py). ``#SBATCH`` lines become ``[job]`` fields
(sbatch.py); exports become ``program.env`` or the explicit expansion fields
(``env_prepend``/``env_append``/``env_expand``, job/expansion.py); ``: "${NAME:=default}"``
knobs become ``program.params``; the launch line becomes ``[launcher]`` and
``program.command`` (launch.py); ``module load`` becomes ``program.modules``; other srun lines
become ``[[steps]]``; every other line is kept as code in ``program.setup`` (before the
launch) or ``program.teardown`` (after it). Values slurmfabric derives (MASTER_ADDR, ranks,
node counts, the rendezvous) are dropped. Every line gets a note saying where it went, and
the notes that are not a plain mapping are the leftovers the command prints.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from slurmfabric.job.importer import launch as launchmod
from slurmfabric.job.importer import sbatch
from slurmfabric.job.importer.expand import (
    ARGS,
    Field,
    Scope,
    Value,
    default_value,
    expand,
)
from slurmfabric.job.importer.shellwords import Command, Op, ShellSyntaxError, Word, commands

KINDS = ("mapped", "derived", "dropped", "fixed", "verbatim", "unmapped")
_LONGEST = 1 << 16  # a value built from itself line after line stops being tracked here
_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_SIMPLE_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?\Z")


@dataclass(frozen=True)
class Note:
    """Where one piece of the script went. ``kind``: mapped (to a field), derived
    (slurmfabric computes it: dropped), dropped (no effect here), fixed (a run-time value
    taken at its default), verbatim (kept as code), unmapped (not carried over)."""

    line: int
    kind: str
    text: str
    message: str


@dataclass
class ImportResult:
    config: dict[str, Any]
    notes: list[Note] = field(default_factory=list)
    # program.setup / program.teardown: the script line of each list item
    code_lines: dict[str, list[int]] = field(default_factory=dict)

    def leftovers(self) -> list[Note]:
        """Everything that is not a plain mapping, in line order."""
        return sorted((n for n in self.notes if n.kind != "mapped"), key=lambda n: n.line)


class _Importer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.notes: list[Note] = []
        self.scope = Scope()
        self.params: dict[str, str] = {}
        self.env: dict[str, str] = {}
        self.prepend: dict[str, str] = {}
        self.append: dict[str, str] = {}
        self.expand_env: dict[str, str] = {}
        self.modules: list[str] = []
        self.kept: list[tuple[Command, str]] = []  # (command, "setup" | "teardown")
        self.assigns: list[tuple[Command, list[str], str]] = []
        self.steps: list[dict[str, Any]] = []
        self.errexit = False
        self.code_lines: dict[str, list[int]] = {}
        self.job: dict[str, Any] = {}
        self.where = "setup"
        self.env_code: Optional[int] = None  # line of the first kept module/source/conda line
        self.derived_exports: list[tuple[Command, str, str, str]] = []  # cmd, name, text, where
        # The script's shell options (set -e/-u/-o pipefail) at the launch line.
        self.options = {"e": False, "u": False, "pipefail": False}

    def note(self, line: int, kind: str, text: str, message: str) -> None:
        text = " ".join(text.split())
        self.notes.append(Note(line, kind, text[:160], message))

    # --- the parts of the script ---

    def run(self) -> ImportResult:
        found, bad = sbatch.directives(self.text)
        _refuse_heterogeneous(self.text, bad)
        for line, word in bad:
            self.note(line, "unmapped", word, "not an sbatch option sbatch would read")
        job, other = sbatch.job_fields(found, self.note)
        self.job = job
        self._shebang()
        cmds = commands(self.text)
        index = self._launch_index(cmds)
        launched: Optional[launchmod.Launch] = None
        for i, cmd in enumerate(cmds):
            where = "setup" if index is None or i < index else "teardown"
            self.where = "launch" if i == index else where
            if i == index:
                launched = self._launch(cmd, job)
            else:
                self._command(cmd, where)
        if index is None:
            self.note(0, "unmapped", "", "no launch line (srun, mpirun, torchrun or python -m "
                      "torch.distributed.run) found; program.command is empty")
        self._settle_assignments(launched)
        config = self._config(job, other, launched)
        return ImportResult(config, self.notes, self.code_lines)

    def _shebang(self) -> None:
        first = self.text.split("\n", 1)[0]
        if first.startswith("#!") and first.split() not in (["#!/bin/bash"],
                                                            ["#!/usr/bin/env", "bash"]):
            self.note(1, "unmapped", first, "slurmfabric scripts run '#!/bin/bash' (no login "
                      "shell, no other shell); put profile lines in program.setup")

    def _launch_index(self, cmds: list[Command]) -> Optional[int]:
        """The launch line: the last srun/mpirun/torchrun line, preferring one that starts
        torchrun, then one that starts python or a benchmark (``*_perf``), then any other
        program; a probe (``hostname``, ``nvidia-smi``, ...) is the launch only when
        nothing else is (``mpirun -N 1 hostname`` before the benchmark is a step)."""
        found, best = None, -2
        for i, cmd in enumerate(cmds):
            if cmd.block or cmd.heredoc:
                continue
            words = []
            for tok in cmd.tokens:
                if isinstance(tok, Op):
                    if not tok.redirect:
                        break
                    continue
                words.append(tok.literal() or tok.raw)
            if launchmod.is_launch(words):
                score = 2 if any(launchmod.base(w) == "torchrun" or w == "torch.distributed.run"
                                 for w in words) else \
                    1 if any(re.match(r"(.*/)?python[0-9.]*\Z|.*\.py\Z|(.*/)?[a-z_]+_perf"
                                      r"(_mpi)?\Z", w) for w in words) else \
                    -1 if any(launchmod.base(w) in _PROBES for w in words) else 0
                if score >= best:
                    found, best = i, score
        return found

    def _command(self, cmd: Command, where: str) -> None:
        if cmd.block or cmd.heredoc or not cmd.simple():
            for word in cmd.words:
                assigned = word.assignment()
                if assigned:
                    self.scope.values[assigned[0]] = Value("runtime")
            why = "a heredoc" if cmd.heredoc else "a block" if cmd.block else "a pipeline or list"
            self._keep(cmd, where, f"{why}, kept as code")
            return
        words = cmd.words
        first = words[0].literal()
        if all(w.assignment() for w in words):
            names = [n for n in (self._assign(w, cmd) for w in words) if n]
            if names:
                self.assigns.append((cmd, names, where))
            return
        if first == ":" and len(words) == 2 and self._param_default(words[1], cmd):
            return
        if first in ("declare", "typeset", "local", "readonly", "export"):
            self._declare(cmd, words, where)
            return
        if first == "module" and len(words) > 2 and words[1].literal() in ("load", "add") \
                and where == "setup" and self.env_code is not None:
            self._keep(cmd, where, f"after line {self.env_code}'s environment code, so the "
                       "order stays (program.modules would load before it)")
            return
        if first == "module" and len(words) > 2 and words[1].literal() in ("load", "add") \
                and where == "setup" and all(w.literal() for w in words[2:]):
            self.modules += [w.literal() or "" for w in words[2:]]
            self.note(cmd.line, "mapped", cmd.raw, "program.modules")
            return
        if first and launchmod.base(first) == "srun":
            self._step(cmd, where)
            return
        if first == "set" and any(re.fullmatch(r"-[a-z]*e[a-z]*", w.raw) for w in words[1:]):
            self.errexit = where == "setup" or self.errexit
        if first == "set" and where == "setup":
            _set_options(self.options, [w.raw for w in words[1:]])
        self._keep(cmd, where, "kept as code")

    def _keep(self, cmd: Command, where: str, why: str) -> None:
        first = cmd.words[0].literal() if cmd.words else None
        if where == "setup" and self.env_code is None and first in _ENV_CODE:
            self.env_code = cmd.line
        self.kept.append((cmd, where))
        self.note(cmd.line, "verbatim", cmd.raw, f"program.{where} ({why})")

    def _assign(self, word: Word, cmd: Command) -> Optional[str]:
        assigned = word.assignment()
        if assigned is None:
            return None
        name, value = assigned
        if value.array is not None:
            items: list[Field] = []
            for element in value.array:
                items += expand(element, self.scope)
            self.scope.values[name] = Value("array", items=tuple(items))
            return name
        if len(value.parts) == 1 and value.parts[0].kind == "param" \
                and value.parts[0].name == name and value.parts[0].op in (":-", "-"):
            default = default_value(value.parts[0], self.scope)
            if default is not None:
                self._declare_param(name, default, cmd)
                return None
        fields = expand(value, self.scope, split=False)
        f = fields[0] if fields else Field("")
        whole_runtime = len(f.runtime) == 1 and f.runtime[0] == f.text or _has_args(fields)
        self.scope.values[name] = Value("runtime") if whole_runtime or len(f.text) > _LONGEST \
            else Value("static", f.text, (f,))
        return name

    def _param_default(self, word: Word, cmd: Command) -> bool:
        """``: "${NAME:=default}"``: a named parameter with a default."""
        if len(word.parts) != 1 or word.parts[0].kind != "param" \
                or word.parts[0].op not in (":=", "="):
            return False
        default = default_value(word.parts[0], self.scope)
        if default is None:
            self.scope.values[word.parts[0].name] = Value("runtime")
            self._keep(cmd, "setup", "a default computed at run time, kept as code")
            return True
        self._declare_param(word.parts[0].name, default, cmd)
        return True

    def _declare_param(self, name: str, default: str, cmd: Command) -> None:
        problem = _param_name_problem(name)
        if problem:  # a name the environment owns (NCCL_*, SLURM_*): its default is used
            self.scope.values[name] = Value("static", default,
                                            (Field(default, fixed=(name,)),))
            self.note(cmd.line, "fixed", cmd.raw, f"not a parameter ({problem}); its default "
                      "is written where it is used")
            return
        self.params[name] = default
        self.scope.values[name] = Value("param", default, (Field(default),))
        self.note(cmd.line, "mapped", cmd.raw, f"program.params.{name} = {default!r}")

    def _declare(self, cmd: Command, words: list[Word], where: str) -> None:
        flags = "".join(w.raw[1:] for w in words[1:] if w.raw.startswith("-"))
        rest = [w for w in words[1:] if not w.raw.startswith("-")]
        export = words[0].literal() == "export" or "x" in flags
        if not export or where == "teardown":
            names = [self._assign(w, cmd) for w in rest if w.assignment()]
            if len(names) != len(rest) or where == "teardown":
                self._keep(cmd, where, "kept as code")
                return
            self.assigns.append((cmd, [n for n in names if n], where))
            return
        for word in rest:
            assigned = word.assignment()
            if assigned is None:
                value = self.scope.get(word.raw)
                if value is not None and value.kind == "static" and value.items \
                        and value.items[0].static:
                    self._env(word.raw, value.items[0], cmd)
                else:
                    self._keep(cmd, where, "exports a value known at run time, kept as code")
                    return
                continue
            name, value_word = assigned
            fields = expand(value_word, self.scope, split=False)
            f = fields[0] if fields else Field("")
            mapped = self._env(name, f, cmd)
            # What is known of the value still serves the launch line ("srun bash -c "$CMD"").
            # (Mapped to env_prepend and the like, the value is the fields' business.)
            whole_runtime = len(f.runtime) == 1 and f.runtime[0] == f.text \
                or _has_args(fields)
            partial = not mapped and not whole_runtime and not f.params \
                and len(f.text) <= _LONGEST
            self.scope.values[name] = Value("static", f.text, (f,)) if f.static or partial \
                else Value("runtime")
            if not mapped:
                self._keep(cmd, where, "an export computed at run time, kept as code")
                return

    def _env(self, name: str, f: Field, cmd: Command) -> bool:
        """One exported variable -> the env field that does the same; False: it needs code."""
        line = cmd.line
        if name in launchmod.DERIVED_ENV:
            self.derived_exports.append((cmd, name, f"{name}={f.text}", self.where))
            return True
        if f.runtime and not all(_SIMPLE_REF.match(r) and self._outside(
                _SIMPLE_REF.match(r).group(1), name) for r in f.runtime):
            return False
        for fixed in f.fixed:
            self.note(line, "fixed", f"{name}={f.text}", f"uses the default of {fixed}")
        if f.static:
            self.env[name] = f.text
            self.note(line, "mapped", f"{name}={f.text}", f"program.env.{name}")
            return True
        text = _SIMPLE_REF_ANY.sub(lambda m: "${" + (m.group(1) or m.group(2)) + "}", f.text)
        own = "${" + name + "}"
        pathlike = name.endswith("PATH") or name == "LD_PRELOAD"
        head, _, tail = text.rpartition(":" + own)
        if pathlike and text.endswith(":" + own) and "${" not in head:
            self._add_path(self.prepend, name, head, first=True)
            self.note(line, "mapped", f"{name}={f.text}", f"program.env_prepend.{name}")
            return True
        if pathlike and text.startswith(own + ":") and "${" not in text[len(own) + 1:]:
            self._add_path(self.append, name, text[len(own) + 1:], first=False)
            self.note(line, "mapped", f"{name}={f.text}", f"program.env_append.{name}")
            return True
        if own in text:
            return False
        self.expand_env[name] = text
        self.env.pop(name, None)
        self.note(line, "mapped", f"{name}={f.text}", f"program.env_expand.{name}")
        return True

    def _outside(self, ref: str, name: str) -> bool:
        """A variable env_expand may read at run time: the job's own environment (Slurm's
        variables, HOME, PWD, a PATH-like variable), never one this script computes."""
        return ref == name or ref in self.params or bool(_OUTSIDE.match(ref)) \
            and ref not in self.scope.values

    def _add_path(self, table: dict[str, str], name: str, value: str, first: bool) -> None:
        if name in self.env:  # a value set earlier: the result is known text
            self.env[name] = f"{value}:{self.env[name]}" if first else f"{self.env[name]}:{value}"
            return
        old = table.get(name)
        table[name] = value if old is None else (f"{value}:{old}" if first else f"{old}:{value}")

    def _step(self, cmd: Command, where: str) -> None:
        fields = [f for w in cmd.words for f in expand(w, self.scope)]
        step = launchmod.map_step(fields[1:], cmd.line, self.note, self.params)
        if step is None:
            self._keep(cmd, where, "an srun line that is not one step, kept as code")
            return
        counts = {"-n", "--ntasks", "--ntasks-per-node", "--ntasks-per-gpu"}
        if "ntasks_per_node" not in step and self.job.get("ntasks_per_node", 1) != 1 \
                and not any(a.split("=")[0] in counts or re.match(r"-n[0-9]", a)
                            for a in step.get("srun_args", [])):
            # srun(1) "INPUT ENVIRONMENT VARIABLES": a plain srun in the batch shell reads
            # SLURM_NTASKS_PER_NODE, so it runs sbatch's task layout, not one per node.
            step["ntasks_per_node"] = self.job["ntasks_per_node"]
            self.note(cmd.line, "mapped", "srun", f"steps ntasks_per_node = "
                      f"{self.job['ntasks_per_node']} (srun inherits sbatch's task layout)")
        step["name"] = f"step{len(self.steps) + 1}"
        step["when"] = "before" if where == "setup" else "after"
        self.steps.append(step)
        self.note(cmd.line, "mapped", cmd.raw, f"[[steps]] {step['name']}")

    # --- the launch line ---

    def _launch(self, cmd: Command, job: dict[str, Any]) -> launchmod.Launch:
        words: list[Word] = []
        for tok in cmd.tokens:
            if isinstance(tok, Op):
                tail = cmd.raw[cmd.raw.find(tok.text):] if tok.text in cmd.raw else tok.text
                self.note(cmd.line, "unmapped", tail, "the launch's output redirection or "
                          "pipeline; not mapped (see job.output, launcher.task_output)")
                break
            words.append(tok)
        fields = [f for w in words for f in expand(w, self.scope)]
        self.note(cmd.line, "mapped", cmd.raw, "the launch line: [launcher], program.command")
        out = launchmod.map_launch(fields, cmd.line, job, self.note, self.params)
        inner, out.inner = out.inner, None
        if inner is not None:
            code, extra = inner
            self.note(cmd.line, "mapped", "bash -c", "the command string is the program's "
                      "command line")
            if extra:
                self.note(cmd.line, "unmapped", " ".join(extra), "bash -c's $0 and arguments")
            try:
                parsed = commands(code.text)
            except ShellSyntaxError:
                parsed = []
            inner_words = _after_cd(parsed[0], self.scope) if len(parsed) == 1 else None
            if inner_words is not None:
                workdir, inner_words = inner_words
                out.program["workdir"] = workdir
                self.note(cmd.line, "mapped", f"cd {workdir} &&", "program.workdir")
                inner_fields = [f for w in inner_words for f in expand(w, self.scope)]
                launchmod.map_program(out, inner_fields, cmd.line, job, self.note)
            elif len(parsed) == 1 and parsed[0].simple():
                inner_fields = [f for w in parsed[0].words for f in expand(w, self.scope)]
                launchmod.map_program(out, inner_fields, cmd.line, job, self.note)
            else:
                self.note(cmd.line, "unmapped", code.text, "bash -c code that is not one "
                          "simple command; not mapped")
        for name, f in out.env:
            if not self._env(name, f, cmd):
                self.note(cmd.line, "unmapped", f"{name}={f.text}", "a variable computed at "
                          "run time for the program; not mapped")
        return out

    def _settle_assignments(self, launched: Optional[launchmod.Launch]) -> None:
        """Keep a plain assignment only when kept code reads it; otherwise its value went
        into the fields already (or into nothing) and the line is dropped."""
        derived = {m.group(1) for n in self.notes if n.kind == "derived"
                   for m in _REF.finditer(n.text)}
        derived |= {m.group(1) for _c, _n, text, _w in self.derived_exports
                    for m in _REF.finditer(text)}
        pending = list(self.assigns)
        read = {name for c, _ in self.kept for name in _reads(c.raw)}
        changed = True
        while changed:
            changed = False
            for item in list(pending):
                cmd, names, where = item
                if all(n in _BATCH_SHELL for n in names):
                    continue  # kept code then reads slurmfabric's value
                if any(n in read for n in names):
                    # WORLD_SIZE, RANK, ... are set per rank, never in the batch shell: kept
                    # code that reads one needs the script's own line.
                    self._keep(cmd, where, "read by kept code")
                    read |= _reads(cmd.raw)
                    pending.remove(item)
                    changed = True
        for cmd, name, text, where in self.derived_exports:
            if name in read and where != "launch" and name not in _BATCH_SHELL \
                    and cmd.line not in {c.line for c, _ in self.kept}:
                self._keep(cmd, where, f"read by kept code ({name} is not in the batch shell; "
                           "slurmfabric sets it again for every rank)")
            elif name not in read or where == "launch":
                self.note(cmd.line, "derived", text, "slurmfabric sets it for every rank")
        for cmd, names, _where in pending:
            if names and all(n in _BATCH_SHELL for n in names) and any(n in read for n in names):
                self.note(cmd.line, "derived", cmd.raw, "kept code reads it and gets "
                          "slurmfabric's value (set before program.setup runs)")
            elif names and all(n in derived or n in launchmod.DERIVED_ENV for n in names):
                self.note(cmd.line, "derived", cmd.raw, "feeds only values slurmfabric derives "
                          "(rendezvous address, node counts)")
            else:
                self.note(cmd.line, "dropped", cmd.raw, "no kept code reads it; where the "
                          "launch line used it, its value is written into the fields")

    # --- the result ---

    def _own_options(self, where: str, kept: list[Command], lines: list[str],
                     numbers: list[int]) -> tuple[list[str], list[int]]:
        """Kept code runs with the script's own shell options, not slurmfabric's ``set -euo
        pipefail``: a ``set`` line before it gives them back (none at the script's start;
        at the teardown, those in effect at the launch), and one after program.setup
        restores slurmfabric's for its own lines."""
        state = {"e": False, "u": False, "pipefail": False} if where == "setup" \
            else dict(self.options)
        if where == "setup" and kept[0].words and kept[0].words[0].literal() == "set":
            after = dict(state)
            _set_options(after, [w.raw for w in kept[0].words[1:]])
            state = after if all(after.values()) else state
        restore = options_line(state)
        if restore:
            lines, numbers = [restore, *lines], [kept[0].line, *numbers]
            self.note(kept[0].line, "verbatim", restore, f"program.{where} starts with the "
                      "script's own shell options (slurmfabric's script runs set -euo "
                      "pipefail), so kept code means what it meant")
        if where == "setup" and options_line(self.options):
            lines, numbers = [*lines, "set -euo pipefail"], [*numbers, kept[-1].end]
        return lines, numbers

    def _config(self, job: dict[str, Any], other: dict[str, Any],
                launched: Optional[launchmod.Launch]) -> dict[str, Any]:
        launcher: dict[str, Any] = {}
        program: dict[str, Any] = {}
        if launched is not None:
            launcher.update(launched.launcher)
            program.update(launched.program)
            for key, value in launched.job.items():
                job.setdefault(key, value)
        if "signal" in other:
            launcher["signal"] = other["signal"]
            launcher["signal_seconds"] = other["signal_seconds"]
        if "workdir" in other:  # --chdir, then the launch's own 'cd DIR' (relative to it)
            inner = program.get("workdir")
            program["workdir"] = other["workdir"] if inner is None else inner \
                if inner.startswith("/") else f"{other['workdir'].rstrip('/')}/{inner}"
        used = set(launched.params if launched is not None else [])
        texts = "\n".join([c.raw for c, _ in self.kept] + list(self.expand_env.values()))
        used |= {m.group(1) for m in _REF.finditer(texts)}
        params = {k: v for k, v in self.params.items() if k in used}
        for name in sorted(set(self.params) - set(params)):
            self.note(0, "fixed", name, f"parameter {name} is used only where a value is data; "
                      f"its default {self.params[name]!r} was written there")
        for key, value in (("env", self.env), ("env_prepend", self.prepend),
                           ("env_append", self.append), ("env_expand", self.expand_env),
                           ("params", params)):
            if value:
                program[key] = dict(value)
        if self.modules:
            program["modules"] = self.modules
        for where in ("setup", "teardown"):
            kept = [c for c, w in sorted(self.kept, key=lambda k: k[0].line) if w == where]
            lines = [line for c in kept for line in c.raw.split("\n")]
            numbers = [c.line + i for c in kept for i in range(len(c.raw.split("\n")))]
            if lines:
                lines, numbers = self._own_options(where, kept, lines, numbers)
                program[where] = lines
                self.code_lines[where] = numbers
        if program.get("teardown") and not self.errexit:
            program["teardown_on_failure"] = True
            self.note(0, "mapped", "teardown", "program.teardown_on_failure = true (the script "
                      "has no 'set -e', so its teardown ran after a failed launch too)")
        gpus, tasks = job.get("gpus_per_node"), job.get("ntasks_per_node")
        if launcher.get("type") in ("srun", "srun-pmix") and gpus and tasks not in (None, gpus):
            self.note(0, "unmapped", f"{tasks} task(s) per node, {gpus} GPUs per node",
                      "slurmfabric's srun launchers run one task per GPU; a program that "
                      "starts its own workers fits launcher.type = \"torchrun\" or "
                      "job.gpus_per_task")
        config: dict[str, Any] = {"job": job, "launcher": launcher, "program": program}
        if self.steps:
            config["steps"] = self.steps
        return config


# Programs a script runs once to look at the nodes, not to train (never the launch when
# another launcher line exists).
_PROBES = frozenset({"hostname", "nvidia-smi", "echo", "true", "date", "env", "printenv",
                     "sleep", "ls", "cat", "uname", "ibstat", "ibv_devinfo", "nproc", "pwd",
                     "which", "ip", "ifconfig", "free", "df", "lscpu", "numactl", "ulimit"})
# What 'slurmfabric env' sets in the batch shell before program.setup (rank/env.py, job
# scope); the other derived names exist only in each rank.
_BATCH_SHELL = frozenset({"MASTER_ADDR", "MASTER_PORT"})
# Lines that change what later module/PATH lines do: a module load must stay after them.
_ENV_CODE = frozenset({"module", "ml", "source", ".", "spack", "conda", "eval"})
_ARITH = re.compile(r"\(\((.*?)\)\)", re.S)
_IDENT_ANY = re.compile(r"(?<![$A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)")


def _after_cd(cmd: Command, scope: Scope) -> Optional[tuple[str, list[Word]]]:
    """``cd DIR && PROGRAM ...`` (bash -c's code): DIR when it is known text, and the
    program's words; None for any other shape."""
    toks = cmd.tokens
    if cmd.block or cmd.heredoc or len(toks) < 4 or not all(isinstance(t, Word)
                                                              for t in toks[:2]):
        return None
    if toks[0].literal() != "cd" or not isinstance(toks[2], Op) or toks[2].text != "&&" \
            or any(isinstance(t, Op) for t in toks[3:]):
        return None
    where = expand(toks[1], scope)
    if len(where) != 1 or not where[0].static or not where[0].text:
        return None
    return where[0].text, [t for t in toks[3:] if isinstance(t, Word)]


def _has_args(fields: list[Field]) -> bool:
    """The script's own arguments ("$@") are in the value: known only at run time."""
    return any(ARGS in f.text for f in fields)


def _reads(code: str) -> set[str]:
    """The variables a piece of code reads: ``$NAME``/``${NAME}``, and the bare names
    inside ``$(( ))`` and ``(( ))`` (bash reads them there without ``$``)."""
    names = {m.group(1) for m in _REF.finditer(code)}
    for arith in _ARITH.finditer(code):
        names |= {m.group(1) for m in _IDENT_ANY.finditer(arith.group(1))}
    return names


def _set_options(options: dict[str, bool], args: list[str]) -> None:
    """Follow ``set -e``/``+u``/``-o pipefail``/``-euo pipefail`` (bash's set builtin)."""
    long = {"errexit": "e", "nounset": "u", "pipefail": "pipefail"}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg[:1] not in "-+" or arg in ("-", "--"):
            break
        on = arg[0] == "-"
        for letter in arg[1:]:
            if letter in "eu":
                options[letter] = on
            elif letter == "o" and i < len(args):
                name = long.get(args[i])
                i += 1
                if name:
                    options[name] = on


def options_line(options: dict[str, bool]) -> str:
    """The ``set`` line that brings bash from slurmfabric's ``set -euo pipefail`` to
    ``options``, or "" when they are the same."""
    off = [f"+{k}" for k in ("e", "u") if not options[k]]
    if not options["pipefail"]:
        off.append("+o pipefail")
    return "set " + " ".join(off) if off else ""


_OUTSIDE = re.compile(r"SLURM_[A-Z0-9_]+|SLURMD_NODENAME|HOME|PWD|USER|TMPDIR|HOSTNAME|"
                      r"[A-Z_]*PATH")
_SIMPLE_REF_ANY = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _param_name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be a program.params entry: the config's own rule
    (config/launchrules.py, issue 31 [A]) where this slurmfabric has it, else none."""
    try:
        from slurmfabric.config.launchrules import param_name_problem  # type: ignore
    except ImportError:
        return None
    problem = param_name_problem(name)
    return problem.split(": ", 1)[-1].split(";")[0] if problem else None


class Refused(ValueError):
    """A script import cannot express at all: ``line N: what and why`` (exit 2)."""


# A heterogeneous job (https://slurm.schedmd.com/heterogeneous_jobs.html): components
# separated by '#SBATCH hetjob' ('packjob' before Slurm 20.02), steps placed with
# srun --het-group ('--pack-group' before 20.02).
_HET_STEP = re.compile(r"^[^#\n]*\s--(?:het|pack)-group\b", re.MULTILINE)


def _refuse_heterogeneous(text: str, bad: list[tuple[int, str]]) -> None:
    """A job config describes one allocation: a heterogeneous job is refused by its line."""
    line = next((n for n, word in bad if word in ("hetjob", "packjob")), None)
    if line is None:
        step = _HET_STEP.search(text)
        line = text.count("\n", 0, step.start()) + 1 if step else None
    if line is not None:
        raise Refused(f"line {line}: a heterogeneous job (several components, each its own "
                      "request, https://slurm.schedmd.com/heterogeneous_jobs.html): a "
                      "slurmfabric config describes one allocation; submit each component "
                      "as a job of its own")


def import_script(text: str) -> ImportResult:
    """The config for an sbatch script's text, and a note for each piece of it. Never runs
    any of the script. Raises ShellSyntaxError for text the reader cannot follow."""
    return _Importer(text).run()
