"""Argument checks shared by every module, and ``cdiv``.

A bad argument is named, with what it must be. A leaf module (standard library
only), so that the arithmetic modules raise the same clear error for the same
mistake instead of failing deep inside.

An argument of the wrong type raises :class:`WrongTypeError`, both a ``TypeError``
(what Python raises for a wrong type) and a ``ValueError`` (what every other bad
argument raises), so a caller catching either sees it. ``bool`` is never a number
here: ``True`` passed as a count is a slip, not 1.

One verb across kvlib: ``require_*`` raises on a bad value and returns the value
(converted where it says so, e.g. :func:`kvlib.dtypes.require_dtype`); ``check_*``
raises on bad input and returns nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeGuard, cast

__all__ = [
    "WrongTypeError",
    "are_non_negative_ints",
    "cdiv",
    "is_int",
    "is_number",
    "require_fraction",
    "require_int",
    "require_positive",
]


class WrongTypeError(TypeError, ValueError):
    """An argument of the wrong type (e.g. a float where a count is expected)."""


def is_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def are_non_negative_ints(values: Sequence[object]) -> bool:
    """True when every value is an ``int`` (not a bool) of at least 0: token ids, context
    lengths. A list of plain ints, the usual case, is checked by ``type`` and ``min`` at C
    speed (a simulation checks millions); anything else item by item."""
    if set(map(type, values)) <= {int}:
        return min(cast("Sequence[int]", values), default=0) >= 0
    return all(is_int(v) and v >= 0 for v in values)


def is_number(value: object) -> TypeGuard[int | float]:
    """True for an ``int`` or ``float`` that is not a ``bool`` (NaN and inf included)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` in integers: whole blocks (or groups) holding ``a`` items, ``b`` a block.

    vLLM's ``vllm.utils.cdiv`` is ``-(a // -b)``: exact for ints of any size, where
    ``math.ceil(a / b)`` rounds through a float.
    """
    return -(a // -b)


_INT_WORDS = {0: "a non-negative integer", 1: "a positive integer"}


def require_int(value: object, name: str, minimum: int = 0) -> int:
    """``value`` if it is an ``int`` (not a bool) of at least ``minimum``, else an error."""
    if is_int(value) and value >= minimum:
        return value
    words = _INT_WORDS.get(minimum, f"an integer >= {minimum}")
    error = ValueError if is_int(value) else WrongTypeError
    raise error(f"{name} must be {words}, got {value!r}")


def require_positive(value: object, name: str) -> float:
    """``value`` as a float if it is a finite number above zero, else an error naming it."""
    if not is_number(value):
        raise WrongTypeError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def require_fraction(value: object, name: str) -> float:
    """``value`` if it is a number in (0, 1], else ValueError (vLLM's memory fractions)."""
    number = require_positive(value, name)
    if number > 1:
        raise ValueError(f"{name} must be in (0, 1], e.g. 0.92, got {value!r}")
    return number
