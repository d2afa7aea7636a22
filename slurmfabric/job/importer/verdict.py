"""Whether an imported config is honest: it loads, it renders, and what it left out is named.

``import`` exits 0 only when the config it wrote loads (``load_config``, exactly as
``render -c`` reads it), renders (``render_sbatch``, which also shellchecks the kept code)
and no script line is left "not mapped". A field the loader refuses is taken out of the
config and named at the script line it came from, so the written config still loads; what
cannot be taken out (a rule across fields, a shellcheck finding in kept code) is named too.
Every one of these becomes a ``FILE:LINE: what and why`` line in a comment block at the top
of the written config, and the command exits 1. No string in the config ever holds a
control byte or an importer-internal marker (``expand.ARGS``): such a value is replaced by
its source text and named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from slurmfabric.job.importer import ImportResult, Note
from slurmfabric.job.importer.expand import ARGS

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a tab in kept code is code
_FIELD = re.compile(r"((?:job|launcher|program|fabric|kubernetes|steps)(?:\.[A-Za-z0-9_]+)*)"
                    r": ")
_FIELD_ANY = re.compile(r"\b((?:job|launcher|program|fabric|steps)\.[A-Za-z0-9_.]*[A-Za-z0-9_])")
_MAX_REPAIRS = 64


@dataclass
class Verdict:
    """The config to write, the lines still to fix (``FILE:LINE: what and why``) and the
    exit code the command returns: 0 honest and complete, 1 written with lines to fix."""

    config: dict[str, Any]
    todo: list[str] = field(default_factory=list)

    @property
    def code(self) -> int:
        return 1 if self.todo else 0

    def header(self, script: str) -> str:
        """The comment block at the top of the written config."""
        lines = [f"# Imported by 'slurmfabric import' from {script}."]
        if self.todo:
            lines.append(f"# STILL TO FIX ({len(self.todo)}): this config does not yet do what "
                         "the script does:")
            lines += [f"#   {line}" for line in self.todo]
        lines.append("# Review program.setup/teardown (kept as code) and the notes it printed.")
        return "\n".join(lines) + "\n"


def settle(result: ImportResult, script: str,
           render: Optional[Callable[[Any], str]] = None) -> Verdict:
    """Scrub, load and render ``result.config``; name every line still to fix. ``script``:
    the name used in ``FILE:LINE``. ``render``: the renderer (default ``render_sbatch``)."""
    config = result.config
    _scrub(config, (), result)
    loaded, problems = _load_repairing(config, result)
    todo_notes = [n for n in result.leftovers() if n.kind == "unmapped"]
    todo = [_line(script, n.line, n.text, n.message) for n in todo_notes]
    todo += [_line(script, _named(result, p), "", "the config does not load: " + p)
             for p in problems]
    if loaded is not None:
        from slurmfabric.errors import ConfigError

        if render is None:
            from slurmfabric.job.render import render_sbatch as render
        try:
            render(loaded)
        except ConfigError as exc:
            todo += [_line(script, _named(result, p), "", "the config does not render: " + p)
                     for p in exc.problems]
        from slurmfabric.job.expansion import lookalikes

        todo += [_line(script, _named(result, p), "", "render warns: " + p)
                 for p in lookalikes(loaded)]
    return Verdict(config, todo)


def _line(script: str, line: int, text: str, why: str) -> str:
    where = f"{script}:{line}"
    text = " ".join(text.split())
    return f"{where}: {text} -- {why}" if text else f"{where}: {why}"


def _scrub(value: Any, path: tuple[Any, ...], result: ImportResult) -> Any:
    """Replace, in place, strings holding an internal marker or a control byte; each one
    becomes an "unmapped" note at the line the field came from."""
    if isinstance(value, dict):
        for key in list(value):
            value[key] = _scrub(value[key], (*path, key), result)
        return value
    if isinstance(value, list):
        for i, item in enumerate(value):
            value[i] = _scrub(item, (*path, i), result)
        return value
    if not isinstance(value, str) or not (ARGS in value or _CONTROL.search(value)):
        return value
    dotted = ".".join(str(p) for p in path)
    clean = value.replace(ARGS, '"$@"')
    if ARGS in value:
        result.notes.append(Note(_origin(result, dotted), "unmapped", clean, f"{dotted}: the "
                                 "script's arguments inside a value; kept as the literal text "
                                 "'\"$@\"', which no shell expands here"))
    bad = _CONTROL.search(clean)
    if bad:
        clean = _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", clean)
        result.notes.append(Note(_origin(result, dotted), "unmapped", clean, f"{dotted}: holds "
                                 f"the control byte 0x{ord(bad.group(0)):02x}, which a config "
                                 "never carries; written as the text \\xNN"))
    return clean


def _load_repairing(config: dict[str, Any],
                    result: ImportResult) -> tuple[Optional[Any], list[str]]:
    """Load the config as ``render -c`` would; a refused field that can be taken out is
    taken out and named (the rest keeps loading). The loaded config, or None and the
    problems left."""
    from slurmfabric.config.loader import load_config
    from slurmfabric.errors import ConfigError

    for _ in range(_MAX_REPAIRS):
        try:
            return load_config(data=config, site_defaults=""), []
        except ConfigError as exc:
            problems = list(exc.problems)
        removed = False
        for problem in problems:
            match = _FIELD.match(problem)
            path = match.group(1).split(".") if match else []
            item = _quoted_item(config, path, problem)
            if item is not None:  # one line of a list, not the whole field
                path = [*path, str(item)]
                dotted = ".".join(path)
                result.notes.append(Note(_origin(result, dotted), "unmapped", dotted,
                                         "left out: the loader refuses the value import "
                                         "wrote: " + problem[match.end():]))
                _remove(config, path)
                if path[0] == "program" and path[1] in result.code_lines:
                    del result.code_lines[path[1]][item]
                removed = True
                continue
            if match and _remove(config, path):
                result.notes.append(Note(_origin(result, match.group(1)), "unmapped",
                                         match.group(1), "left out: the loader refuses the "
                                         "value import wrote: " + problem[match.end():]))
                removed = True
        if not removed:
            return None, problems
    return None, problems


def _quoted_item(config: dict[str, Any], path: list[str], problem: str) -> Optional[int]:
    """The index of the list item a problem quotes (``'#SBATCH --x' looks like ...``)."""
    node: Any = config
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, list):
        return None
    return next((i for i, item in enumerate(node) if isinstance(item, str)
                 and repr(item) in problem), None)


def _remove(config: dict[str, Any], path: list[str]) -> bool:
    """Delete the field at ``path`` (dict keys, list indexes), the nearest one that exists."""
    node: Any = config
    for part in path[:-1]:
        key: Any = int(part) if isinstance(node, list) and part.isdigit() else part
        if isinstance(node, dict) and key in node or isinstance(node, list) \
                and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return False
    last: Any = path[-1]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        del node[int(last)]
        return True
    if isinstance(node, dict) and last in node:
        del node[last]
        return True
    return len(path) > 1 and _remove(config, path[:-1])


def _named(result: ImportResult, problem: str) -> int:
    """The script line behind the first config field a problem names."""
    match = _FIELD_ANY.search(problem)
    return _origin(result, match.group(1)) if match else 0


def _origin(result: ImportResult, dotted: str) -> int:
    """The script line a config field came from: the note that mapped it (the longest
    dotted prefix a note names), else the code line behind a program.setup/teardown index,
    else 0 (the whole script)."""
    parts = dotted.split(".")
    if parts[0] == "steps" and len(parts) > 1 and parts[1].isdigit():
        wanted = f"[[steps]] step{int(parts[1]) + 1}"
        return next((n.line for n in result.notes if n.message == wanted), 0)
    if parts[0] == "program" and len(parts) > 2 and parts[1] in result.code_lines \
            and parts[2].isdigit() and int(parts[2]) < len(result.code_lines[parts[1]]):
        return result.code_lines[parts[1]][int(parts[2])]
    for size in range(len(parts), 1, -1):
        prefix = ".".join(parts[:size])
        for note in result.notes:
            if note.line and re.search(re.escape(prefix) + r"(?![A-Za-z0-9_])", note.message):
                return note.line
    code = result.code_lines.get(parts[1] if len(parts) > 1 else "", [])
    return code[0] if code else 0
