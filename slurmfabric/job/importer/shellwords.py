"""Read a bash script as commands and words, without running any of it (``slurmfabric import``).

``shlex`` splits words but forgets which characters were quoted, and an importer must know
that: ``'$HOME'`` is data, ``"$HOME"`` is an expansion. So this module keeps every word as
parts (literal text, ``$NAME``/``${NAME...}``, ``$(...)``, backticks, ``$((...))``) with the
quoting each part had, and groups physical lines into commands: ``\\`` continuations,
multi-line array assignments, ``if``/``for``/``while``/``case``/``{`` blocks and heredocs.
Quoting rules follow the bash manual, "Quoting" and "Shell Expansions"; anything it does not
model (process substitution, extglob, aliases) stays in the command's raw text, which the
importer keeps verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Union

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=")
_FD = re.compile(r"[0-9]+(?=[<>])")
_DUP_TARGET = re.compile(r"&?[0-9-]+")
_SIMPLE_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])(.*)\Z", re.S)
_BRACED_OP = re.compile(r"(\[[^\]]*\]|:-|:=|:\+|:\?|-|=|\+|\?|#|%|/|:)?(.*)\Z", re.S)
_OPERATORS = ("&&", "||", ";;", "|&", "|", ";", "&")
_REDIRECTS = ("<<<", "<<-", "<<", ">>", "&>>", "&>", ">&", "<&", "<>", ">|", ">", "<")
OPEN_BLOCK = frozenset({"if", "for", "while", "until", "case", "select", "{", "function"})
CLOSE_BLOCK = frozenset({"fi", "done", "esac", "}"})
_AFTER_KEYWORD = frozenset({"then", "do", "else", "elif", "!", "time"})


@dataclass(frozen=True)
class Part:
    """One piece of a word: ``lit`` (text after quote removal), ``param`` (``$NAME`` or
    ``${...}``: ``name``, ``op`` such as ``:-``/``:=``/``[@]``, ``arg``), ``cmd`` (``$(...)``
    or backticks), ``arith`` (``$((...))``). ``quoted``: inside double quotes."""

    kind: str
    text: str
    quoted: bool = False
    name: str = ""
    op: str = ""
    arg: str = ""


@dataclass
class Word:
    raw: str
    parts: list[Part] = field(default_factory=list)
    array: Optional[list[Word]] = None  # NAME=( ... ): the elements

    def literal(self) -> Optional[str]:
        """The word's text when it has no expansion at all, else None."""
        if self.array is not None or any(p.kind != "lit" for p in self.parts):
            return None
        return "".join(p.text for p in self.parts)

    def assignment(self) -> Optional[tuple[str, Word]]:
        """``NAME=value`` (unquoted NAME): the name and the value as a word."""
        match = _ASSIGN.match(self.raw)
        if not match or not self.parts or self.parts[0].kind != "lit" or self.parts[0].quoted \
                or not self.parts[0].text.startswith(match.group(0)):
            return None
        cut = len(match.group(0))
        first = self.parts[0]
        rest = ([Part("lit", first.text[cut:])] if first.text[cut:] else []) + self.parts[1:]
        value = Word(self.raw[cut:], rest, self.array)
        return match.group(1), value


@dataclass(frozen=True)
class Op:
    text: str  # an operator (| ; && ...) or a redirection (> 2>&1 <<EOF ...)
    redirect: bool = False
    target: str = ""  # a redirection's word, raw


Token = Union[Word, Op]


@dataclass
class Command:
    """One logical command: its first and last physical line (1-based) and its tokens."""

    line: int
    end: int
    raw: str
    tokens: list[Token]
    block: bool = False  # an if/for/while/case/{ ... } block: kept whole, never split
    heredoc: bool = False

    @property
    def words(self) -> list[Word]:
        return [t for t in self.tokens if isinstance(t, Word)]

    def simple(self) -> bool:
        """No operators and no redirections: one plain command."""
        return not self.block and not self.heredoc and \
            not any(isinstance(t, Op) for t in self.tokens)


class ShellSyntaxError(ValueError):
    """The script is not bash the reader understands (an unclosed quote, say)."""


class _Reader:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def take(self, n: int = 1) -> str:
        out = self.s[self.i:self.i + n]
        self.line += out.count("\n")
        self.i += n
        return out


def _balanced(r: _Reader, open_: str, close: str) -> str:
    """Raw text from the current opener to its matching closer (quotes respected)."""
    depth, start = 0, r.i
    while r.i < len(r.s):
        ch = r.peek()
        if ch == "\\":
            r.take(2)
            continue
        if ch == "'" and open_ != "{":
            end = r.s.find("'", r.i + 1)
            if end < 0:
                raise ShellSyntaxError(f"line {r.line}: unclosed single quote")
            r.take(end + 1 - r.i)
            continue
        if ch == '"':
            _double(r, [])
            continue
        if r.s.startswith(open_, r.i):
            depth += 1
            r.take(len(open_))
            continue
        if r.s.startswith(close, r.i):
            depth -= 1
            r.take(len(close))
            if depth == 0:
                return r.s[start:r.i]
            continue
        r.take()
    raise ShellSyntaxError(f"line {r.line}: unclosed {open_!r}")


def _dollar(r: _Reader, quoted: bool) -> Part:
    """A ``$`` expansion starting at the reader (which points at ``$``)."""
    nxt = r.peek(1)
    if r.s.startswith("$((", r.i):
        start = r.i
        r.take(1)
        _balanced(r, "(", ")")
        text = r.s[start:r.i]
        return Part("arith", text, quoted)
    if nxt == "(":
        start = r.i
        r.take(1)
        _balanced(r, "(", ")")
        return Part("cmd", r.s[start:r.i], quoted)
    if nxt == "{":
        start = r.i
        r.take(1)
        body = _balanced(r, "{", "}")[1:-1]
        raw = r.s[start:r.i]
        match = _BRACED.match(body)
        if not match:
            return Part("param", raw, quoted, name="", op=body)
        rest = match.group(2)
        op_match = _BRACED_OP.match(rest)
        op = op_match.group(1) or "" if op_match else rest
        arg = op_match.group(2) if op_match else ""
        return Part("param", raw, quoted, name=match.group(1), op=op, arg=arg)
    match = _SIMPLE_PARAM.match(r.s, r.i + 1)
    if match:
        r.take(1 + len(match.group(0)))
        return Part("param", "$" + match.group(0), quoted, name=match.group(0))
    r.take()
    return Part("lit", "$", quoted)


def _double(r: _Reader, parts: list[Part]) -> None:
    r.take()  # the opening quote
    before = len(parts)
    buf: list[str] = []

    def flush() -> None:
        if buf:
            parts.append(Part("lit", "".join(buf), True))
            buf.clear()

    while True:
        ch = r.peek()
        if not ch:
            raise ShellSyntaxError(f"line {r.line}: unclosed double quote")
        if ch == '"':
            r.take()
            flush()
            if len(parts) == before:
                parts.append(Part("lit", "", True))  # "" is a word of its own
            return
        if ch == "\\":
            nxt = r.peek(1)
            if nxt in '$`"\\':
                buf.append(nxt)
                r.take(2)
            elif nxt == "\n":
                r.take(2)
            else:
                buf.append(ch)
                r.take()
            continue
        if ch == "$":
            flush()
            parts.append(_dollar(r, True))
            continue
        if ch == "`":
            flush()
            start = r.i
            end = r.s.find("`", r.i + 1)
            if end < 0:
                raise ShellSyntaxError(f"line {r.line}: unclosed backtick")
            r.take(end + 1 - start)
            parts.append(Part("cmd", r.s[start:r.i], True))
            continue
        buf.append(ch)
        r.take()


def _word(r: _Reader) -> Word:
    start = r.i
    parts: list[Part] = []
    buf: list[str] = []

    def flush() -> None:
        if buf:
            parts.append(Part("lit", "".join(buf)))
            buf.clear()

    while True:
        ch = r.peek()
        if not ch or ch in " \t\n;&|<>()":
            if ch == "(" and not parts and buf and _ASSIGN.fullmatch("".join(buf)):
                flush()
                word = Word(r.s[start:r.i], parts)
                word.array = _array(r)
                word.raw = r.s[start:r.i]
                return word
            break
        if ch == "\\":
            if r.peek(1) == "\n":
                r.take(2)
                continue
            buf.append(r.peek(1))
            r.take(2)
            continue
        if ch == "'":
            flush()
            end = r.s.find("'", r.i + 1)
            if end < 0:
                raise ShellSyntaxError(f"line {r.line}: unclosed single quote")
            parts.append(Part("lit", r.s[r.i + 1:end], True))
            r.take(end + 1 - r.i)
            continue
        if ch == '"':
            flush()
            _double(r, parts)
            continue
        if ch == "$":
            flush()
            if r.peek(1) == "'":  # $'...' (ANSI-C): kept as one literal, escapes unread
                end = r.s.find("'", r.i + 2)
                if end < 0:
                    raise ShellSyntaxError(f"line {r.line}: unclosed $'")
                parts.append(Part("cmd", r.s[r.i:end + 1]))
                r.take(end + 1 - r.i)
                continue
            parts.append(_dollar(r, False))
            continue
        if ch == "`":
            flush()
            s = r.i
            end = r.s.find("`", r.i + 1)
            if end < 0:
                raise ShellSyntaxError(f"line {r.line}: unclosed backtick")
            r.take(end + 1 - s)
            parts.append(Part("cmd", r.s[s:r.i]))
            continue
        buf.append(ch)
        r.take()
    flush()
    return Word(r.s[start:r.i], parts)


def _array(r: _Reader) -> list[Word]:
    """``NAME=( a b # comment \\n c )``: the elements (the reader is at ``(``)."""
    r.take()
    out: list[Word] = []
    while True:
        ch = r.peek()
        if not ch:
            raise ShellSyntaxError(f"line {r.line}: unclosed array '('")
        if ch in " \t\n":
            r.take()
        elif ch == "\\" and r.peek(1) == "\n":
            r.take(2)
        elif ch == "#":
            while r.peek() and r.peek() != "\n":
                r.take()
        elif ch == ")":
            r.take()
            return out
        else:
            out.append(_word(r))


def _tokens(r: _Reader) -> list[Token]:
    """The tokens up to the end of the logical line (an unquoted newline)."""
    tokens: list[Token] = []
    while True:
        ch = r.peek()
        if not ch:
            return tokens
        if ch == "\n":
            r.take()
            return tokens
        if ch in " \t":
            r.take()
            continue
        if ch == "\\" and r.peek(1) == "\n":
            r.take(2)
            continue
        if ch == "#":
            while r.peek() and r.peek() != "\n":
                r.take()
            continue
        digits = _FD.match(r.s, r.i) if ch.isdigit() else None
        redirect = next((op for op in _REDIRECTS if r.s.startswith(op, r.i + (
            len(digits.group(0)) if digits else 0))), None)
        if redirect:
            text = (digits.group(0) if digits else "") + redirect
            r.take(len(text))
            if r.s.startswith(("&-", "&"), r.i) and redirect in (">&", "<&") or \
                    (redirect in (">", "<") and r.peek() == "&"):
                target = _DUP_TARGET.match(r.s, r.i)
                if target:
                    text += target.group(0)
                    r.take(len(target.group(0)))
                    tokens.append(Op(text, redirect=True))
                    continue
            while r.peek() in (" ", "\t"):
                r.take()
            target_word = _word(r)
            tokens.append(Op(text, redirect=True, target=target_word.raw))
            continue
        op = next((o for o in _OPERATORS if r.s.startswith(o, r.i)), None)
        if op:
            r.take(len(op))
            tokens.append(Op(op))
            continue
        if ch in "()":
            r.take()
            tokens.append(Op(ch))
            continue
        tokens.append(_word(r))


def _starts(tokens: list[Token]) -> list[str]:
    """The words in command position (first word, after an operator or a keyword)."""
    out: list[str] = []
    start = True
    for tok in tokens:
        if isinstance(tok, Op):
            start = not tok.redirect
            continue
        if start:
            text = tok.literal() or ""
            out.append(text)
            # after then/do/if/while/{ (and an assignment) a command follows; after
            # for/case/select a name or word does.
            start = (text in _AFTER_KEYWORD or text in ("if", "while", "until", "{")
                     or tok.assignment() is not None)
    return out


def heredoc_ends(tokens: list[Token]) -> list[tuple[str, bool]]:
    return [(t.target.strip("'\""), t.text.endswith("-")) for t in tokens
            if isinstance(t, Op) and t.redirect and t.text.lstrip("0123456789") in ("<<", "<<-")]


def commands(text: str) -> list[Command]:
    """The script as logical commands, blocks and heredocs kept whole, comments dropped."""
    r = _Reader(text)
    out: list[Command] = []
    depth = 0
    pending: Optional[Command] = None
    while r.i < len(r.s):
        first_line, start = r.line, r.i
        tokens = _tokens(r)
        raw = r.s[start:r.i].rstrip("\n")
        while tokens and isinstance(tokens[-1], Op) and tokens[-1].text == ";":
            tokens.pop()  # "set -ex;": a terminator, not a list
        cmd = Command(first_line, max(first_line, r.line - 1), raw, tokens)
        for end, strip_tabs in heredoc_ends(tokens):
            cmd.heredoc = True
            while r.i < len(r.s):
                line_start = r.i
                nl = r.s.find("\n", r.i)
                stop = len(r.s) if nl < 0 else nl + 1
                body = r.s[line_start:stop].rstrip("\n")
                r.take(stop - line_start)
                if (body.lstrip("\t") if strip_tabs else body) == end:
                    break
            cmd.raw = r.s[start:r.i].rstrip("\n")
            cmd.end = max(first_line, r.line - 1)
        if not tokens and not cmd.heredoc:
            if pending is not None and raw.strip():
                pending.raw += "\n" + raw
            continue
        starts = _starts(tokens)
        opened = sum(1 for w in starts if w in OPEN_BLOCK and w != "function") \
            + sum(1 for t in tokens if isinstance(t, Word) and t.raw.endswith("()")) \
            + (1 if starts and starts[0] == "function" else 0)
        closed = sum(1 for w in starts if w in CLOSE_BLOCK)
        if pending is not None:
            pending.raw += "\n" + cmd.raw
            pending.end = cmd.end
            pending.tokens += [Op(";"), *tokens]
            depth += opened - closed
            if depth <= 0:
                out.append(pending)
                pending, depth = None, 0
            continue
        if opened > closed:
            depth = opened - closed
            cmd.block = True
            pending = cmd
            continue
        if opened:
            cmd.block = True
        out.append(cmd)
    if pending is not None:
        raise ShellSyntaxError(f"line {pending.line}: block not closed")
    return out


def parse_word(text: str) -> Word:
    """One word from its source text (``${NAME:-"default"}``'s default, say)."""
    r = _Reader(text)
    word = _word(r)
    if r.i != len(text):
        return Word(text, [Part("cmd", text)])  # not one word: treat as opaque
    return word
