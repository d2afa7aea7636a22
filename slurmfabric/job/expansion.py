"""Shell expansion in a job config: explicit, never by accident.

Every config value reaches the script as data: ``LD_LIBRARY_PATH = "/opt/efa/lib:$LD_LIBRARY_PATH"``
exports a literal ``$LD_LIBRARY_PATH`` component and replaces the library path. Users who
write ``$`` mean expansion, so the expansion they mean has explicit fields, and a data value
that looks like shell syntax is named at render time with the field that does it:

* ``program.env_prepend`` / ``program.env_append``: add to a PATH-like variable as it is at
  run time, with ``:`` only when it held something (bash manual, "Shell Parameter Expansion":
  ``${NAME:+word}``, safe under ``set -u``);
* ``program.env_expand``: values in which ``${NAME}`` (braces, a variable name) is expanded at
  run time; nothing else is: no command substitution, no arithmetic, no globbing, and an
  unset NAME stops the script (``set -u``) instead of expanding to nothing.
"""

from __future__ import annotations

import re
from typing import Any

from slurmfabric.errors import ConfigError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_TOKEN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_DOLLAR_NAME = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_GLOB = re.compile(r"[*?]|\[[^\]]*\]")


def _name(name: str, field: str) -> str:
    if not _NAME.match(name):
        raise ConfigError([f"{field}: {name!r} is not an environment variable name"])
    return name


def prepend_export(name: str, value: str, q: Any) -> str:
    """``export NAME=VALUE${NAME:+:$NAME}``: VALUE first, then what NAME held at run time."""
    n = _name(name, "program.env_prepend")
    return f'export {n}={q(value)}"${{{n}:+:${n}}}"'


def append_export(name: str, value: str, q: Any) -> str:
    """``export NAME=${NAME:+$NAME:}VALUE``: what NAME held at run time, then VALUE."""
    n = _name(name, "program.env_append")
    return f'export {n}="${{{n}:+${n}:}}"{q(value)}'


def expand_export(name: str, value: str, q: Any) -> str:
    """``export NAME=...`` where each ``${VAR}`` of ``value`` expands at run time and every
    other character is quoted data (``$(...)``, backticks, ``$VAR`` without braces, globs)."""
    n = _name(name, "program.env_expand")
    return f"export {n}={expand_word(value, q)}"


def expand_word(value: str, q: Any, names: Any = None) -> str:
    """One shell word in which ``${VAR}`` expands at run time (only VARs in ``names``, when
    given) and everything else is quoted data."""
    words, last = [], 0
    for match in _TOKEN.finditer(value):
        if names is not None and match.group(1) not in names:
            continue
        if match.start() > last:
            words.append(q(value[last:match.start()]))
        words.append(f'"${{{match.group(1)}}}"')
        last = match.end()
    if last < len(value) or not words:
        words.append(q(value[last:]))
    return "".join(words)


def program_argv(program: Any, q: Any) -> str:
    """program.command as the launch line's words: ``${NAME}`` of a program.params entry
    expands at run time, nothing else does; with program.pass_args the script's own
    arguments follow (``"$@"``)."""
    words = [q(program.command[0])] if program.command else []
    words += [expand_word(arg, q, program.params) for arg in program.command[1:]]
    if program.pass_args:
        words.append('"$@"')
    return " ".join(words)


def lookalikes(config: Any) -> list[str]:
    """One warning per data value that holds ``$``, a backtick or a glob: each names the
    field, says it stays literal, and gives the explicit field that does what was meant."""
    program = config.program
    out: list[str] = []
    for name, value in sorted(program.env.items()):
        field = f"program.env.{name}"
        own = re.fullmatch(rf"(.*):\$\{{?{name}\}}?|\$\{{?{name}\}}?:(.*)", value, re.S)
        if own and own.group(1) is not None:
            out.append(f"{field}: {value!r} stays literal text and replaces {name}; to add to "
                       f"it, set program.env_prepend.{name} = {own.group(1)!r}")
        elif own:
            out.append(f"{field}: {value!r} stays literal text and replaces {name}; to add to "
                       f"it, set program.env_append.{name} = {own.group(2)!r}")
        elif "$" in value or "`" in value:
            out.append(f"{field}: {value!r} stays literal text (values are data); for run-time "
                       f"variables set program.env_expand.{name} with ${{NAME}} forms, e.g. "
                       f"{_braced(value)!r}")
    for table in ("env_prepend", "env_append"):
        for name, value in sorted(getattr(program, table).items()):
            if "$" in value or "`" in value:
                whole = f"{value}:${{{name}}}" if table == "env_prepend" \
                    else f"${{{name}}}:{value}"
                out.append(f"program.{table}.{name}: {value!r} stays literal text (the part "
                           f"{'added' if table == 'env_prepend' else 'appended'} is data); for "
                           f"run-time variables in it set program.env_expand.{name} = "
                           f"{_braced(whole)!r} instead")
    for index, arg in enumerate(program.command):
        if index:  # ${NAME} of a declared parameter expands (program_argv)
            arg = _TOKEN.sub(lambda m: "" if m.group(1) in program.params else m.group(0), arg)
        if "$" in arg or "`" in arg:
            out.append(f"program.command[{index}]: {arg!r} reaches the program as literal text "
                       "(arguments are data); put run-time values in program.env_expand and "
                       "read them in the program")
        elif _GLOB.search(arg) and index:
            out.append(f"program.command[{index}]: {arg!r} is passed as is, not expanded as a "
                       "glob (arguments are data)")
    for number, step in enumerate(getattr(config, "steps", ())):
        for index, arg in enumerate(step.command):
            if "$" in arg or "`" in arg:
                out.append(f"steps[{number}].command[{index}]: {arg!r} reaches the step as "
                           "literal text (arguments are data); put run-time work in "
                           "program.setup")
    for field, value in (("program.workdir", program.workdir),
                         *((f"program.container_mounts[{i}]", m)
                           for i, m in enumerate(program.container_mounts))):
        if value and ("$" in value or "`" in value):
            out.append(f"{field}: {value!r} stays literal text (paths are data); give the "
                       "path itself")
    return out


def _braced(value: str) -> str:
    """``$NAME`` written as ``${NAME}``: the form env_expand expands."""
    return _DOLLAR_NAME.sub(lambda m: "${" + m.group(1) + "}", value)
