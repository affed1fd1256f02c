"""Checked values from a user's JSON document (placement and scheduling instances): the right
type, finite, in range — or a PhazeError naming the field. ``True`` is not a number here, and a
count must be a whole number (``2.0`` is, ``2.5`` is not)."""

from __future__ import annotations

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
