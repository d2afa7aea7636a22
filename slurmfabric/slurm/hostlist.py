"""Slurm hostlists, expanded and compressed exactly as Slurm's own ``hostlist.c`` does.

Every launcher that hand-rolls this gets some corner wrong (``linux[1`` as MASTER_ADDR,
lost zero padding, sorted or de-duplicated lists), and this code runs on every rank, so it
is exact, standard library only, and fast. The rules below were observed with
``scontrol show hostnames`` / ``scontrol show hostlist`` (Slurm 22.05) and are checked
against the installed scontrol by ``tests/unit/test_hostlist_scontrol.py``:

* Items are separated by ``,``, space or tab outside brackets; empty items vanish. A
  newline is *not* a separator for Slurm (``x\n[1-2]`` gives the names ``x\n1 x\n2``):
  we reject it instead of making names with newlines in them.
* Order and duplicates are kept; nothing is sorted.
* ``[lo-hi]`` pads every number to the width of ``lo`` as written: ``n[098-101]`` gives
  ``n098 .. n101`` and ``n[9-11]`` gives ``n9 n10 n11``.
* With several bracket groups Slurm's order is not row-major: the last group varies
  fastest, then the first, second, ... up to the last-but-one, which varies slowest
  (``a[1-2]b[3-4]c[5-6]``: a1b3c5 a1b3c6 a2b3c5 a2b3c6 a1b4c5 ...).
* Text after the last bracket (``n[1-2]-ib``) is an error before Slurm 23.02.5 and valid
  since; we accept it (suffix repeated on every name).
* One range may hold at most 65,536 names (Slurm's limit); ``expand`` also refuses more
  than ``max_hosts`` names in total so that a typo cannot eat the node's memory.

We are stricter than Slurm on malformed input that it half-accepts (``n[1-]``,
``n[+1]``, ``n[1, 2]``, a stray ``]``): those raise :class:`HostlistError` with the position.
"""

from __future__ import annotations

from slurmfabric.errors import UsageError

TYPE_CHECKING = False  # typing is not imported at run time: this module is on every rank
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    # A parsed item: a literal name, or (texts, groups) where texts has len(groups)+1
    # entries and each group is a tuple of (lo, hi, width) ranges.
    Range = tuple[int, int, int]
    Pattern = tuple[tuple[str, ...], tuple[tuple[Range, ...], ...]]

MAX_RANGE = 65536  # names in one lo-hi range; Slurm rejects n[1-65537] ("Too many hosts")
MAX_HOSTS = 1 << 20  # default guard for a whole expansion
_DIGITS = "0123456789"

_SEPARATORS = frozenset(", \t")
# An item: characters other than ',', whitespace and brackets, and [...] groups
ITEM_REGEX = r"(?:[^,\s\[\]]|\[[^\[\]]*\])+"
_item_pattern = None  # compiled on first use: ``re`` costs milliseconds to import
SCAN_LIMIT = 4096  # up to this length _items scans by hand (a job's node list on a rank)


class HostlistError(UsageError):
    """A hostlist expression Slurm would not accept; the message shows where."""

    def __init__(self, expr: str, pos: int, problem: str, hint: str | None = None) -> None:
        shown = expr if len(expr) <= 80 else expr[:77] + "..."
        super().__init__(
            f"invalid hostlist {shown!r}: {problem} at position {pos}",
            hint or "write names like n[1-4,7],gpu[01-16] (ranges go up, brackets not nested)",
        )
        self.expr = expr
        self.pos = pos


def _items(expr: str) -> Iterator[tuple[int, str]]:
    """Yield (offset, item) lazily, checking that only separators lie between items.

    Items are what ``re.finditer(ITEM_REGEX, expr)`` finds. Up to SCAN_LIMIT characters they
    are found by a plain scan: every MPI rank calls index() on its job's node list, and
    ``import re`` costs ~8 ms there; longer lists (the hostlist command) use the compiled
    regex, ~3x faster per character. tests/unit/test_hostlist.py keeps the two equal."""
    if len(expr) > SCAN_LIMIT:
        yield from _items_regex(expr)
        return
    pos = index = 0
    end = len(expr)
    while index < end:
        stop = index
        while stop < end:
            char = expr[stop]
            if char == "[":
                close = stop + 1
                while close < end and expr[close] not in "[]":
                    close += 1
                if close == end or expr[close] == "[":
                    break  # not a group: the item (if any) ends before this '['
                stop = close + 1
            elif char == "," or char == "]" or char.isspace():  # re's \s is str.isspace
                break
            else:
                stop += 1
        if stop == index:
            index += 1
            continue
        _check_gap(expr, pos, index)
        yield index, expr[index:stop]
        pos = index = stop
    _check_gap(expr, pos, end)


def _items_regex(expr: str) -> Iterator[tuple[int, str]]:
    global _item_pattern
    if _item_pattern is None:
        import re

        _item_pattern = re.compile(ITEM_REGEX)
    pos = 0
    for match in _item_pattern.finditer(expr):
        _check_gap(expr, pos, match.start())
        pos = match.end()
        yield match.start(), match.group()
    _check_gap(expr, pos, len(expr))


def _check_gap(expr: str, start: int, end: int) -> None:
    for i in range(start, end):
        char = expr[i]
        if char in _SEPARATORS:
            continue
        if char == "[":
            problem = "'[' without a matching ']'" if "]" not in expr[i:] else "nested '['"
        elif char == "]":
            problem = "']' without a matching '['"
        else:  # whitespace Slurm does not treat as a separator (\r, \v, \f)
            problem = f"unexpected character {char!r}"
        raise HostlistError(expr, i, problem)


def _parse_item(expr: str, offset: int, item: str) -> str | Pattern:
    if "[" not in item:
        return item
    texts: list[str] = []
    groups: list[tuple[Range, ...]] = []
    pos = 0
    while True:
        open_ = item.find("[", pos)
        if open_ < 0:
            texts.append(item[pos:])
            return tuple(texts), tuple(groups)
        close = item.index("]", open_)  # the item regex guarantees a match
        texts.append(item[pos:open_])
        groups.append(_parse_group(expr, offset + open_ + 1, item[open_ + 1 : close]))
        pos = close + 1


def _parse_group(expr: str, offset: int, body: str) -> tuple[Range, ...]:
    if not body:
        raise HostlistError(expr, offset, "empty brackets")
    ranges = []
    pos = 0
    for part in body.split(","):
        lo_text, dash, hi_text = part.partition("-")
        if not (_is_number(lo_text) and (not dash or _is_number(hi_text))):
            raise HostlistError(
                expr, offset + pos, f"bad range {part!r} (want N or N-M with digits only)"
            )
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if hi < lo:
            raise HostlistError(
                expr, offset + pos, f"range {part!r} goes down", f"write {hi_text}-{lo_text}"
            )
        if hi - lo + 1 > MAX_RANGE:
            raise HostlistError(
                expr,
                offset + pos,
                f"range {part!r} has more than {MAX_RANGE} names (Slurm's limit)",
            )
        ranges.append((lo, hi, len(lo_text)))
        pos += len(part) + 1
    return tuple(ranges)


def _is_number(text: str) -> bool:
    return text.isdigit() and text.isascii()


def parse(expr: str) -> list[str | Pattern]:
    """Parse the whole expression (validates every item) without expanding it."""
    return [_parse_item(expr, offset, item) for offset, item in _items(expr)]


def _group_values(group: tuple[Range, ...]) -> list[str]:
    values: list[str] = []
    for lo, hi, width in group:
        if width <= len(str(lo)):  # no padding needed: map(str) runs in C
            values.extend(map(str, range(lo, hi + 1)))
        else:
            values.extend(_numbered("", lo, hi + 1, width))
    return values


def _group_size(group: tuple[Range, ...]) -> int:
    return sum(hi - lo + 1 for lo, hi, _ in group)


def _pattern_size(pattern: Pattern) -> int:
    size = 1
    for group in pattern[1]:
        size *= _group_size(group)
    return size


def _slurm_order(ngroups: int) -> list[int]:
    """Group indices from slowest- to fastest-varying, as Slurm's expansion nests them."""
    return [*range(ngroups - 2, -1, -1), ngroups - 1]


def _expand_pattern(pattern: Pattern) -> list[str]:
    texts, groups = pattern
    last = _group_values(groups[-1])
    if texts[-1]:
        last = [v + texts[-1] for v in last]
    if len(groups) == 1:
        return list(map(texts[0].__add__, last)) if texts[0] else last
    # Outer groups in Slurm's nesting order build a head; the last group varies fastest.
    order = _slurm_order(len(groups))[:-1]
    slots = {g: i for i, g in enumerate(order)}
    outer = [_group_values(groups[g]) for g in order]
    from itertools import product  # only here: the per-rank path never gets this far

    names: list[str] = []
    for combo in product(*outer):
        head = texts[0] + "".join(combo[slots[g]] + texts[g + 1] for g in range(len(groups) - 1))
        names.extend(map(head.__add__, last))
    return names


def expand(expr: str, max_hosts: int = MAX_HOSTS) -> list[str]:
    """All names of ``expr`` in Slurm's order, duplicates kept."""
    items = parse(expr)
    total = sum(1 if isinstance(it, str) else _pattern_size(it) for it in items)
    if total > max_hosts:
        raise HostlistError(
            expr, 0, f"expands to {total} names, more than the limit of {max_hosts}"
        )
    names: list[str] = []
    for item in items:
        if isinstance(item, str):
            names.append(item)
        else:
            names.extend(_expand_pattern(item))
    return names


def iter_hosts(expr: str) -> Iterator[str]:
    """Names one item at a time; an error in a later item surfaces only when reached."""
    for offset, text in _items(expr):
        item = _parse_item(expr, offset, text)
        if isinstance(item, str):
            yield item
        else:
            yield from _expand_pattern(item)


def count(expr: str) -> int:
    """Number of names (duplicates counted), without expanding."""
    return sum(1 if isinstance(it, str) else _pattern_size(it) for it in parse(expr))


def _first_item(expr: str) -> tuple[int, str] | None:
    """The first item by a plain scan (no regex): it never reads past that item."""
    start = 0
    end = len(expr)
    while start < end and expr[start] in _SEPARATORS:
        start += 1
    if start == end:
        return None
    depth = 0
    pos = start
    while pos < end:
        char = expr[pos]
        if char == "[":
            if depth:
                raise HostlistError(expr, pos, "nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise HostlistError(expr, pos, "']' without a matching '['")
            depth = 0
        elif depth == 0 and char in _SEPARATORS:
            break
        elif char in "\n\r\v\f":
            raise HostlistError(expr, pos, f"unexpected character {char!r}")
        pos += 1
    if depth:
        raise HostlistError(expr, expr.rindex("[", start, pos), "'[' without a matching ']'")
    return start, expr[start:pos]


def first(expr: str) -> str:
    """The first name, reading only the first item: O(1) in the length of the list."""
    found = _first_item(expr)
    if found is not None:
        item = _parse_item(expr, *found)
        if isinstance(item, str):
            return item
        texts, groups = item
        parts = [texts[0]]
        for group, text_after in zip(groups, texts[1:]):
            lo, _, width = group[0]
            parts.append(f"{lo:0{width}d}")
            parts.append(text_after)
        return "".join(parts)
    raise HostlistError(expr, 0, "no names in the hostlist", "check the node list variable")


def index(expr: str, name: str) -> int:
    """Position of the first occurrence of ``name``; HostlistError if absent."""
    position = 0
    for offset, text in _items(expr):
        item = _parse_item(expr, offset, text)
        if isinstance(item, str):
            if item == name:
                return position
            position += 1
            continue
        size = _pattern_size(item)
        if _may_contain(item, name):
            if size > MAX_HOSTS:  # a4[1-65536]b[1-65536]: 4 billion names to look through
                raise HostlistError(expr, offset, f"an item of {size} names is more than the "
                                    f"limit of {MAX_HOSTS} to search")
            names = _expand_pattern(item)
            if name in names:
                return position + names.index(name)
        position += size
    raise HostlistError(expr, 0, f"{name!r} is not in the hostlist", "check the node name")


def _may_contain(pattern: Pattern, name: str) -> bool:
    texts = pattern[0]
    return name.startswith(texts[0]) and name.endswith(texts[-1])


# --- compression -----------------------------------------------------------------------


def _pad(num: int, width: int) -> int:
    """How many zeros ``num`` gets when printed with ``width``."""
    return max(0, width - len(str(num)))


def _widths_join(lo0: int, width0: int, lo1: int, width1: int) -> int | None:
    """Width of the joined range when two adjacent ranges may merge, else None.

    Slurm merges ``n9`` (width 1) with ``n10`` (width 2) because neither rendering changes
    under the other width, but never ``n9`` with ``n010``: a range may adopt the other's
    width only if the numbers that bound them look the same either way.
    """
    if width0 == width1:
        return width0
    first_changes = _pad(lo0, width0) != _pad(lo0, width1)
    second_changes = _pad(lo1, width1) != _pad(lo1, width0)
    if first_changes and second_changes:
        return None
    return width0 if first_changes else width1


def compress(names: Iterable[str]) -> str:
    """The ranged string ``scontrol show hostlist`` prints for these names, in order.

    Adjacent names with the same prefix and consecutive numbers join into one range;
    adjacent ranges with the same prefix share one bracket. Order and duplicates are
    kept (``n[3,2,1]``, ``n[1,1]``), exactly like Slurm; sort first if you want n[1-3].
    """
    names = names if isinstance(names, list) else list(names)
    suffixes: dict[tuple[int, int, int], tuple[list[str], list[int]]] = {}  # see _is_run
    # Each range: [prefix, lo, hi, width]; lo is None for a name without a number.
    ranges: list[list] = []
    prefix = None
    lo = hi = width = None
    i, total = 0, len(names)
    while i < total:
        name = names[i]
        i += 1
        stem = name.rstrip(_DIGITS)
        if len(stem) == len(name):
            if prefix is not None:
                ranges.append([prefix, lo, hi, width])
            prefix, lo, hi, width = name, None, None, 0
            continue
        digits = name[len(stem) :]
        num = int(digits)
        if stem == prefix and lo is not None and num == hi + 1:
            if len(digits) != width:
                joined = _widths_join(lo, width, num, len(digits))
                if joined is None:
                    ranges.append([prefix, lo, hi, width])
                    prefix, lo, hi, width = stem, num, num, len(digits)
                    continue
                width = joined
            hi = num
            if hi - lo == 2:  # a run: compare whole blocks in C instead of name by name
                hi, i = _gallop(names, i, stem, hi, width, suffixes)
            continue
        if prefix is not None:
            ranges.append([prefix, lo, hi, width])
        prefix, lo, hi, width = stem, num, num, len(digits)
    if prefix is not None:
        ranges.append([prefix, lo, hi, width])
    return _ranged_string(ranges)


def _numbered(stem: str, lo: int, stop: int, width: int) -> list[str]:
    """stem + zero-padded numbers, built by C-level maps (2x faster than str.format)."""
    # [width] * n, not itertools.repeat: itertools stays off the per-rank import path
    return list(map(stem.__add__, map(str.zfill, map(str, range(lo, stop)), [width] * (stop - lo))))


def _is_run(
    block: list[str],
    stem: str,
    lo: int,
    width: int,
    suffixes: dict[tuple[int, int, int], tuple[list[str], list[int]]],
) -> bool:
    """``block == _numbered(stem, lo, lo + len(block), width)``, without building names.

    Equal lengths name by name plus equal concatenations mean equal names. The numbers'
    text is the same for every rack (``001``..``100``), so it is made once per compress
    call; only a C-level join with the rack's stem is left per run.
    """
    key = (lo, len(block), width)
    known = suffixes.get(key)
    if known is None and len(block) > 1024:  # one long run: nothing to reuse, compare names
        return block == _numbered(stem, lo, lo + len(block), width)
    if known is None:
        digits = list(map(str.zfill, map(str, range(lo, lo + len(block))), [width] * len(block)))
        known = suffixes[key] = (digits, list(map(len, digits)))
    digits, lengths = known
    if "".join(block) != stem + stem.join(digits):
        return False
    return list(map(len(stem).__rsub__, map(len, block))) == lengths


def _gallop(
    names: list[str],
    i: int,
    stem: str,
    hi: int,
    width: int,
    suffixes: dict[tuple[int, int, int], tuple[list[str], list[int]]] | None = None,
) -> tuple[int, int]:
    """Extend a run while the next names are exactly stem + the next numbers.

    Within a run the width cannot change: a longer number is never zero padded under
    either width, so Slurm keeps the run's width (see _widths_join).

    First guess the run's end from single names (exponential then binary search on
    ``names[i + k - 1]``: a few string compares per run), then check the whole block at
    C level (``_is_run``). A wrong guess (a name that happens to fit the pattern past a
    break) fails that check and falls back to growing block by block, so the result never
    depends on the guess; it only makes runs of ~100 names (one rack) cheap.
    """
    total = len(names)
    good, k = 0, 8
    while i + k <= total and names[i + k - 1] == stem + str(hi + k).zfill(width):
        good, k = k, k * 2
    bad = min(k, total - i + 1)  # the smallest k known (or assumed) not to fit
    while bad - good > 1:
        mid = (good + bad) // 2
        if names[i + mid - 1] == stem + str(hi + mid).zfill(width):
            good = mid
        else:
            bad = mid
    block = names[i : i + good]
    if good and _is_run(block, stem, hi + 1, width, {} if suffixes is None else suffixes):
        return hi + good, i + good
    return _gallop_blocks(names, i, stem, hi, width)


def _gallop_blocks(
    names: list[str], i: int, stem: str, hi: int, width: int
) -> tuple[int, int]:
    """Grow the run block by block (8, 16, ...), then halve down to its end."""
    block, grow, total = 8, True, len(names)
    while block >= 4:  # grow while it matches, then halve down to the run's end
        if i + block <= total and names[i : i + block] == _numbered(
            stem, hi + 1, hi + 1 + block, width
        ):
            hi += block
            i += block
            if grow:
                block *= 2
        else:
            grow = False
            block //= 2
    return hi, i


def _ranged_string(ranges: list[list]) -> str:
    out: list[str] = []
    i = 0
    n = len(ranges)
    while i < n:
        prefix, lo, hi, width = ranges[i]
        if lo is None:
            out.append(prefix)
            i += 1
            continue
        j = i + 1
        while j < n and ranges[j][0] == prefix and ranges[j][1] is not None:
            j += 1
        if j == i + 1 and lo == hi:
            out.append(f"{prefix}{lo:0{width}d}")
        else:
            body = ",".join(_range_text(r) for r in ranges[i:j])
            out.append(f"{prefix}[{body}]")
        i = j
    return ",".join(out)


def _range_text(rng: list) -> str:
    _, lo, hi, width = rng
    if lo == hi:
        return f"{lo:0{width}d}"
    return f"{lo:0{width}d}-{hi:0{width}d}"


# --- SLURM_TASKS_PER_NODE / SLURM_JOB_CPUS_PER_NODE ------------------------------------


def _count_items(spec: str) -> Iterator[tuple[int, int]]:
    pos = 0
    for part in spec.split(","):
        value, _, repeat = part.partition("(x")
        if repeat:
            repeat = repeat[:-1] if repeat.endswith(")") else ""
        if (
            not _is_number(value)
            or (repeat != "" and not _is_number(repeat))
            or ("(x" in part and not repeat)
        ):
            raise UsageError(
                f"invalid count list {spec!r}: bad item {part!r} at position {pos}",
                "expected Slurm's form like 2(x3),1",
            )
        yield int(value), int(repeat) if repeat else 1
        pos += len(part) + 1


def expand_counts(spec: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1] (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE)."""
    out: list[int] = []
    for value, times in _count_items(spec):
        out.extend([value] * times)
    return out
