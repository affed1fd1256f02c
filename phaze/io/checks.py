"""Checked values from a user's JSON document (placement and scheduling instances): the right
type, finite, in range — or a PhazeError naming the field. ``True`` is not a number here, and a
count must be a whole number (``2.0`` is, ``2.5`` is not)."""

from __future__ import annotations

import argparse
import math

from phaze.errors import PhazeError


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def number(value, what: str, low: float = 0.0, strict: bool = False) -> float:
    """A finite real >= ``low`` (> ``low`` when ``strict``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PhazeError(f"{what} must be a number, got {_type_name(value)} {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < low or (strict and v == low):
        raise PhazeError(
            f"{what} must be finite and {'>' if strict else '>='} {low:g}, got {value!r}"
        )
    return v


def integer(value, what: str, low: int | None = None, high: int | None = None) -> int:
    """A whole number in [``low``, ``high``] (either bound may be None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PhazeError(f"{what} must be an integer, got {_type_name(value)} {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise PhazeError(f"{what} must be an integer, got {value!r}")
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        if high is None:
            span = f">= {low}"
        elif low is None:
            span = f"<= {high}"
        else:
            span = f"in {low}..{high}"
        raise PhazeError(f"{what} must be {span}, got {value!r}")
    return v


def boolean(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise PhazeError(f"{what} must be true or false, got {_type_name(value)} {value!r}")
    return value


def mapping(value, what: str) -> dict:
    return _of_type(value, what, dict, "an object")


def sequence(value, what: str) -> list:
    return _of_type(value, what, list, "a list")


def _of_type(value, what: str, kind: type, name: str):
    if not isinstance(value, kind):
        raise PhazeError(f"{what} must be {name}, got {_type_name(value)}")
    return value


# --- command-line numbers (argparse types: a bad one is a usage error, one line, exit 2) --------
#: the largest count the models represent: ranks, batch sizes and sizes are 64-bit integers
MAX_COUNT = 2**63 - 1


def count(text: str) -> int:
    """An integer argument within the 64-bit range the stages compute in; its sign and range are
    the stage's to check (a message naming the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if abs(value) > MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"{text} is too large to represent (at most 2^63 - 1 = {MAX_COUNT}: ranks, batch "
            "sizes and sizes are 64-bit integers)"
        )
    return value


def finite(text: str) -> float:
    """A finite real argument (not nan, inf, or beyond the float64 range such as 1e400)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value
