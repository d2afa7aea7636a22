"""argparse value types that refuse what makes no sense: NaN, infinities, negatives, zero
counts and absurd magnitudes get argparse's usual one-line error and exit 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number(low: float | None = None, high: float | None = None, *, integer: bool = False,
           low_open: bool = False) -> Callable[[str], float]:
    """A type for ``add_argument(type=...)``: a finite number in [low, high] ((low, high]
    with ``low_open``); ``integer`` for counts."""

    def parse(text: str) -> float:
        try:
            value: float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'a whole number' if integer else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            lo = "-inf" if low is None else f"{low:g}"
            hi = "inf" if high is None else f"{high:g}"
            raise argparse.ArgumentTypeError(
                f"{text} is outside {'(' if low_open else '['}{lo}, {hi}]")
        return value

    parse.__name__ = "integer" if integer else "number"  # argparse names the type in errors
    return parse


def rates(text: str) -> list[float]:
    """``400,400,200``: NIC port rates in Gb/s, each finite and in (0, 10000]."""
    one = number(0, 10000, low_open=True)
    values = [one(part.strip()) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("no rate given; expected e.g. 400,400")
    return values
