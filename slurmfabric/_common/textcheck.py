"""What text may hold, by field kind; one place for every value that reaches a shell or argv.

Two kinds (docs/launch.md, "Every value is data"):

* ``free``: program arguments, srun/mpirun argument lists, ``program.env`` values. Any
  Unicode text except NUL (no argv or environment entry can carry it: bash drops it, execve
  cuts the string there) and undecodable bytes (lone surrogates from a non-UTF-8 argv or
  environment: they cannot be written into a UTF-8 script unchanged).
* ``strict``: everything else (names, paths, executables, modules, mounts, images, #SBATCH
  values, NCCL values): printable text only, so additionally no control characters (newline,
  CR, tab, ESC, DEL, C1), no Unicode format characters (bidi overrides, zero-width) and no
  line or paragraph separators. Field validators add their own rules on top (a leading
  '-', a list separator).

Standard library only; ``one_line`` is also used by the hooks' error messages.
"""

from __future__ import annotations

_BAD_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")
# Characters a shell word needs no quotes for (the set shlex.quote leaves alone).
SAFE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")


def shell_word(value: str) -> str:
    """POSIX shell quoting, the same result as shlex.quote (which imports ``re``: too slow
    for every rank). The one quoting rule; render.q adds the script-only forms on top."""
    if value and all(c in SAFE_CHARS for c in value):
        return value
    return "'" + value.replace("'", "'\"'\"'") + "'"


def one_line(text: str, limit: int = 300) -> str:
    """``text`` for a one-line message: non-printable characters shown by their escapes."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)[:limit]


def _describe(ch: str) -> str:
    code = ord(ch)
    if 0xD800 <= code <= 0xDFFF:
        byte = code - 0xDC00 if 0xDC80 <= code <= 0xDCFF else None
        return (f"an undecodable byte ({byte:#04x})" if byte is not None
                else f"a lone surrogate (U+{code:04X})")
    if ch == "\x00":
        return "a NUL byte ('\\x00')"
    return f"'{repr(ch)[1:-1]}' (U+{code:04X})"


def problem(value: str, kind: str) -> str | None:
    """Why ``value`` may not be used as a ``kind`` ('free' or 'strict') value, or None."""
    import unicodedata

    for position, ch in enumerate(value):
        code = ord(ch)
        if ch == "\x00" or 0xD800 <= code <= 0xDFFF:
            return (f"contains {_describe(ch)} at position {position}, which no argument or "
                    "environment variable can carry unchanged; accepted: valid UTF-8 text "
                    "without NUL")
        if kind == "strict" and (not ch.isprintable() and ch != " "
                                 or unicodedata.category(ch) in _BAD_CATEGORIES):
            return (f"contains {_describe(ch)} at position {position}; accepted: printable "
                    "text without control, format or line-separator characters")
    return None


def split_args(text: str, what: str) -> list[str]:
    """Split an option value the way a shell would (``--ibdiag-args '-C mlx5_0'``); an
    unbalanced quote is a one-line UsageError naming the option, never a traceback."""
    import shlex

    from slurmfabric.errors import UsageError

    try:
        return shlex.split(text)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise UsageError(f"{what} {one_line(repr(text), 120)}: {exc}",
                         "quote it as you would in a shell, e.g. '-C mlx5_0 -P 1'") from None
