"""What the importer knows of a script's variables, and words expanded with that knowledge.

The importer never runs the script, so a variable is one of: a value known from the text
(``GPUS_PER_NODE=8``), an array (``declare -a ARGS=(...)``), a named parameter with a default
(``: "${TP:=8}"`` or ``MODULE=${MODULE:-x}``: the submitter may override it), a script argument
with a default (``${1:-x}``), or unknown until run time (``$(hostname)``, ``$SLURM_JOB_ID``).
An expanded word keeps every unknown piece as its source text and lists it, so the caller
decides: map it, keep it as a ``${NAME}`` parameter, or report it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from slurmfabric.job.importer.shellwords import Part, Word, parse_word

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Value:
    kind: str  # "static" | "array" | "param" | "positional" | "runtime"
    text: str = ""  # static text; a param's or positional's default
    items: tuple[Field, ...] = ()


@dataclass(frozen=True)
class Field:
    """One argv word after expansion. ``runtime``: source text of pieces only known at run
    time (kept verbatim inside ``text``); ``params``: ``${NAME}`` parameters it holds;
    ``fixed``: parameters or script arguments replaced by their defaults."""

    text: str
    runtime: tuple[str, ...] = ()
    params: frozenset[str] = frozenset()
    fixed: tuple[str, ...] = ()

    @property
    def static(self) -> bool:
        return not self.runtime and not self.params


ARGS = "\x00args\x00"  # "$@" / $*: the script's own arguments


@dataclass
class Scope:
    values: dict[str, Value] = field(default_factory=dict)

    def get(self, name: str) -> Optional[Value]:
        return self.values.get(name)


class _Builder:
    """Fields under construction: bash joins adjacent pieces and splits unquoted ones."""

    def __init__(self) -> None:
        self.fields: list[Field] = []
        self.cur: Optional[Field] = None

    def add(self, text: str, runtime: tuple[str, ...] = (), params: frozenset[str] = frozenset(),
            fixed: tuple[str, ...] = ()) -> None:
        if self.cur is None:
            self.cur = Field(text, runtime, params, fixed)
        else:
            c = self.cur
            self.cur = Field(c.text + text, c.runtime + runtime, c.params | params,
                             c.fixed + fixed)

    def split_add(self, f: Field) -> None:
        """An unquoted expansion: split on whitespace, an unknown piece staying one word."""
        text = f.text
        for i, piece in enumerate(f.runtime):
            text = text.replace(piece, f"\x01{i}\x01")
        pieces = text.split()
        if text[:1].isspace() or not pieces:
            self.end()
        for j, piece in enumerate(pieces):
            if j:
                self.end()
            runtime = tuple(f.runtime[int(i)] for i in re.findall("\x01([0-9]+)\x01", piece))
            restored = re.sub("\x01([0-9]+)\x01", lambda m: f.runtime[int(m.group(1))], piece)
            self.add(restored, runtime, frozenset(p for p in f.params if p in restored),
                     f.fixed)
        if pieces and text[-1:].isspace():
            self.end()

    def end(self) -> None:
        if self.cur is not None:
            self.fields.append(self.cur)
            self.cur = None


def expand(word: Word, scope: Scope, *, split: bool = True, params_as_refs: bool = True,
           env_refs: bool = False) -> list[Field]:
    """The fields a word expands to. ``params_as_refs``: a named parameter stays ``${NAME}``
    (argv and env_expand can carry it), else its default is used and listed in ``fixed``.
    ``env_refs``: a variable unknown here stays ``${NAME}`` (env_expand expands it at run
    time) instead of being an unknown piece."""
    if word.array is not None:
        return [Field(word.raw, (word.raw,))]
    b = _Builder()
    for part in word.parts:
        _part(part, scope, b, split, params_as_refs, env_refs)
    b.end()
    if not b.fields and any(p.quoted for p in word.parts):
        return [Field("")]
    return b.fields


def _part(part: Part, scope: Scope, b: _Builder, split: bool, refs: bool, env_refs: bool) -> None:
    if part.kind == "lit":
        b.add(part.text)
        return
    if part.kind != "param":
        b.add(part.text, (part.text,))
        return
    name, op = part.name, part.op
    if name in ("@", "*") and not op:
        b.end()
        b.fields.append(Field(ARGS, (part.text,)))
        return
    if name.isdigit():
        value: Optional[Value] = Value("positional", _default(part, scope)) \
            if op in (":-", "-") else None
        op = ""
    else:
        value = scope.get(name)
    if op in ("[@]", "[*]") and value is not None and value.kind == "array":
        for item in value.items:
            if part.quoted or not split:
                b.end()
                b.add(item.text, item.runtime, item.params, item.fixed)
                b.end()
            else:
                b.split_add(item)
        return
    if op in ("[@]", "[*]", "[0]") and value is not None and value.kind == "array":
        first = value.items[0] if value.items else Field("")
        value = Value("static", first.text) if first.static else None
    elif op in (":-", "-") and value is not None and value.kind == "static":
        if not value.text and op == ":-":
            value = Value("static", _default(part, scope))
    elif op:
        value = None  # another operator, or a variable only known at run time
    if value is not None and value.kind == "array":
        first = value.items[0] if value.items else Field("")
        value = Value("static", first.text) if first.static else None
    if value is None or value.kind == "runtime":
        if env_refs and _IDENT.match(name) and not op:
            b.add("${" + name + "}", params=frozenset({name}))
        else:
            b.add(part.text, (part.text,))
        return
    if value.kind == "param" and refs:
        b.add("${" + name + "}", params=frozenset({name}))
        return
    fixed = (name,) if value.kind in ("param", "positional") else ()
    stored = value.items[0] if value.kind == "static" and value.items else Field(value.text)
    f = Field(stored.text, stored.runtime, stored.params, stored.fixed + fixed)
    if part.quoted or not split:
        b.add(f.text, f.runtime, f.params, f.fixed)
    else:
        b.split_add(f)


def _default(part: Part, scope: Scope) -> str:
    """``${NAME:-default}``'s default, expanded with what is known (unknown: as written)."""
    fields = expand(parse_word(part.arg), scope, split=False, params_as_refs=False)
    return fields[0].text if fields else ""


def default_value(part: Part, scope: Scope) -> Optional[str]:
    """A parameter's default when it is known text, else None (``$(pwd)/x``)."""
    fields = expand(parse_word(part.arg), scope, split=False, params_as_refs=False)
    if len(fields) > 1 or any(f.runtime for f in fields):
        return None
    return fields[0].text if fields else ""
