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
from slurmfabric.job.importer.expand import Field, Scope, Value, default_value, expand
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

    def note(self, line: int, kind: str, text: str, message: str) -> None:
        text = " ".join(text.split())
        self.notes.append(Note(line, kind, text[:160], message))

    # --- the parts of the script ---

    def run(self) -> ImportResult:
        found, bad = sbatch.directives(self.text)
        for line, word in bad:
            self.note(line, "unmapped", word, "not an sbatch option sbatch would read")
        job, other = sbatch.job_fields(found, self.note)
        self._shebang()
        cmds = commands(self.text)
        index = self._launch_index(cmds)
        launched: Optional[launchmod.Launch] = None
        for i, cmd in enumerate(cmds):
            where = "setup" if index is None or i < index else "teardown"
            if i == index:
                launched = self._launch(cmd, job)
            else:
                self._command(cmd, where)
        if index is None:
            self.note(0, "unmapped", "", "no launch line (srun, mpirun, torchrun or python -m "
                      "torch.distributed.run) found; program.command is empty")
        self._settle_assignments(launched)
        return ImportResult(self._config(job, other, launched), self.notes)

    def _shebang(self) -> None:
        first = self.text.split("\n", 1)[0]
        if first.startswith("#!") and first.split() not in (["#!/bin/bash"],
                                                            ["#!/usr/bin/env", "bash"]):
            self.note(1, "unmapped", first, "slurmfabric scripts run '#!/bin/bash' (no login "
                      "shell, no other shell); put profile lines in program.setup")

    def _launch_index(self, cmds: list[Command]) -> Optional[int]:
        """The launch line: the last srun/mpirun/torchrun line, preferring one that starts
        torchrun, then one that starts python or MPI (a later 'srun ls' is a step)."""
        found, best = None, -1
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
                    1 if any(re.match(r"(.*/)?(python[0-9.]*|mpirun|mpiexec)\Z|.*\.py\Z", w)
                             for w in words) else 0
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
                and where == "setup" and all(w.literal() for w in words[2:]):
            self.modules += [w.literal() or "" for w in words[2:]]
            self.note(cmd.line, "mapped", cmd.raw, "program.modules")
            return
        if first and launchmod.base(first) == "srun":
            self._step(cmd, where)
            return
        if first == "set" and any(re.fullmatch(r"-[a-z]*e[a-z]*", w.raw) for w in words[1:]):
            self.errexit = where == "setup" or self.errexit
        self._keep(cmd, where, "kept as code")

    def _keep(self, cmd: Command, where: str, why: str) -> None:
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
        whole_runtime = len(f.runtime) == 1 and f.runtime[0] == f.text
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
            whole_runtime = len(f.runtime) == 1 and f.runtime[0] == f.text
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
            self.note(line, "derived", f"{name}={f.text}", "slurmfabric sets it for every rank")
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
            if len(parsed) == 1 and parsed[0].simple():
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
        pending = list(self.assigns)
        read = {m.group(1) for c, _ in self.kept for m in _REF.finditer(c.raw)}
        changed = True
        while changed:
            changed = False
            for item in list(pending):
                cmd, names, where = item
                if all(n in launchmod.DERIVED_ENV for n in names):
                    continue  # kept code then reads slurmfabric's value
                if any(n in read for n in names):
                    self._keep(cmd, where, "read by kept code")
                    read |= {m.group(1) for m in _REF.finditer(cmd.raw)}
                    pending.remove(item)
                    changed = True
        for cmd, names, _where in pending:
            if names and all(n in launchmod.DERIVED_ENV for n in names) \
                    and any(n in read for n in names):
                self.note(cmd.line, "derived", cmd.raw, "kept code reads it and gets "
                          "slurmfabric's value (set before program.setup runs)")
            elif names and all(n in derived or n in launchmod.DERIVED_ENV for n in names):
                self.note(cmd.line, "derived", cmd.raw, "feeds only values slurmfabric derives "
                          "(rendezvous address, node counts)")
            else:
                self.note(cmd.line, "dropped", cmd.raw, "no kept code reads it; where the "
                          "launch line used it, its value is written into the fields")

    # --- the result ---

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
        if "workdir" in other:
            program["workdir"] = other["workdir"]
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
            lines = [line for c, w in sorted(self.kept, key=lambda k: k[0].line) if w == where
                     for line in c.raw.split("\n")]
            if lines:
                program[where] = lines
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


def import_script(text: str) -> ImportResult:
    """The config for an sbatch script's text, and a note for each piece of it. Never runs
    any of the script. Raises ShellSyntaxError for text the reader cannot follow."""
    return _Importer(text).run()
