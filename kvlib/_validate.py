"""Argument checks shared by every module: a bad argument is named, with what it must be.

A leaf module (standard library only), so that the arithmetic modules raise the
same clear ``ValueError`` for the same mistake instead of failing deep inside.
"""

from __future__ import annotations

import math

__all__ = ["require_fraction", "require_int", "require_positive"]


def require_int(value: object, name: str, minimum: int = 0) -> int:
    """``value`` if it is an ``int`` (not a bool) of at least ``minimum``, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return value


def require_positive(value: object, name: str) -> float:
    """``value`` as a float if it is a finite number above zero, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def require_fraction(value: object, name: str) -> float:
    """``value`` if it is a number in (0, 1], else ValueError (vLLM's memory fractions)."""
    number = require_positive(value, name)
    if number > 1:
        raise ValueError(f"{name} must be in (0, 1], e.g. 0.9, got {value!r}")
    return number
