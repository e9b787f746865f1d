"""Answer checks for the graded notebooks: right or wrong, and if wrong, why.

``expect(answer, expected, ...)`` passes silently when ``answer`` is within the
stated tolerance of ``expected``. Otherwise its ``AssertionError`` names the
most likely slip (:mod:`course.checks.slips`): a wrong value the challenge lists
in ``mistakes``, or a generic factor between the answer and the right value.
The message never contains ``expected`` (learners see it in their feedback),
only the learner's own answer and the name of the mistake.

``plausible(answer, ...)`` is the visible sanity check under an answer cell: it
accepts exactly what ``expect`` accepts (``real_value`` and the whole-number
rule), so it never refuses an answer the hidden test would grade right.

``numbers(challenge, **choices)`` gives each student their own numbers for a
challenge (:mod:`course.checks.draw`); ``sliding_config`` builds a student's
own ``config.json`` from them (:mod:`course.checks.configs`).

This module and the submodules it imports use nothing beyond the standard
library: graded notebooks import it, and grading must stay fast.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

from course.checks.configs import config_text, sliding_config
from course.checks.draw import (
    DEFAULT_STUDENT,
    STUDENT_ENV,
    Numbers,
    grading_student,
    numbers,
    student_id,
)
from course.checks.slips import Mistake, diagnose, named_slips

__all__ = [
    "DEFAULT_STUDENT",
    "HIDDEN_TEST_MODULES",
    "STUDENT_ENV",
    "Mistake",
    "Numbers",
    "config_text",
    "describe_type_problem",
    "diagnose",
    "expect",
    "grading_student",
    "is_whole",
    "numbers",
    "plausible",
    "real_value",
    "sliding_config",
    "student_id",
]

# What hidden tests may import from kvlib: modules of the standard library alone,
# loaded by the grader before any student kernel starts (course.apps.autograde).
HIDDEN_TEST_MODULES = (
    "course.checks",
    "kvlib.units",
    "kvlib.dtypes",
    "kvlib.hardware",
    "kvlib.specs",
    "kvlib.config",
    "kvlib.sizing",
    "kvlib.weights.params",
    "kvlib.bounds",
    "kvlib.paging.table",
)

# NumPy scalar types accepted as answers (looked up by identity in the loaded
# numpy module, never by name alone: a class can claim any __module__).
_NUMPY_REAL_TYPES = (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "longdouble",
)


def describe_type_problem(type_name: str, name: str = "answer", unit: str = "") -> str:
    """Why an answer of type ``type_name`` cannot be graded, and what to give instead."""
    want = f"a plain int or float{f' (in {unit})' if unit else ''}"
    if type_name in ("builtins.bool", "numpy.bool_", "numpy.bool"):
        return f"{name} is a bool (True/False); give {want}."
    if type_name == "builtins.str":
        return f"{name} is a string; give {want}, without quotes."
    if type_name == "builtins.NoneType":
        return f"{name} is None; assign your number to it."
    if type_name == "builtins.ellipsis":
        return f"{name} is still the placeholder `...`; assign your number to it."
    return f"{name} is of type {type_name}; give {want}, e.g. int(x) or float(x)."


def _numpy_real(value: object) -> float | int | None:
    """``value`` as a builtin number if it is a genuine NumPy real scalar, else None."""
    cls = type(value)
    numpy = sys.modules.get("numpy")
    if numpy is None or cls.__module__ != "numpy" or cls.__name__ not in _NUMPY_REAL_TYPES:
        return None
    if getattr(numpy, cls.__name__, None) is not cls:
        return None
    item = value.item()  # type: ignore[attr-defined]
    return item if type(item) in (int, float) else float(item)


def real_value(answer: object, name: str = "answer", unit: str = "") -> float | int:
    """``answer`` as a builtin int or float, or AssertionError saying why it is refused.

    Only an exact builtin ``int`` or ``float``, or a genuine NumPy real scalar:
    ``type(answer) is int`` rather than ``isinstance``, because subclasses
    (``bool`` among them) and objects with their own ``__eq__`` could claim to
    equal anything; they, strings, ``NaN`` and infinities are refused before
    any comparison.
    """
    value = answer if type(answer) is int or type(answer) is float else _numpy_real(answer)
    if value is None:
        kind = f"{type(answer).__module__}.{type(answer).__qualname__}"
        raise AssertionError(describe_type_problem(kind, name, unit))
    if isinstance(value, float) and not math.isfinite(value):
        raise AssertionError(f"{name} is {value!r}; give a finite number.")
    return value


def expect(
    answer: object,
    expected: float,
    *,
    rel: float = 1e-9,
    abs: float = 0.0,  # noqa: A002 - mirrors math.isclose / pytest.approx
    unit: str = "",
    name: str = "answer",
    integer: bool = False,
    mistakes: Mapping[str, float] | None = None,
    generic: bool = True,
    num_layers: int | None = None,
    num_attention_heads: int | None = None,
    num_kv_heads: int | None = None,
) -> None:
    """Pass if ``answer`` is within ``rel``/``abs`` of ``expected``; else say what went wrong.

    ``integer=True`` also requires a whole number (a count of bytes or seats).
    ``mistakes`` maps a hint to the wrong value that slip produces, computed by
    the test from the challenge's numbers. ``generic=False`` turns off the
    generic factor checks (for quantities where "forgot the 2 for K and V"
    would be a wrong diagnosis). ``num_layers`` and the head counts enable the
    per-layer and query-vs-KV-head checks.
    """
    if type(expected) not in (int, float) or not math.isfinite(expected):
        raise TypeError(f"expected must be a finite int or float, got {type(expected).__name__}")
    value = real_value(answer, name, unit)
    in_unit = f" (in {unit})" if unit else ""
    whole = not integer or is_whole(value)
    if whole and math.isclose(value, expected, rel_tol=rel, abs_tol=abs):
        return
    # The challenge's own slips first: 98.304 for 98,304 bytes gets the KB hint,
    # not "not a whole number".
    named = named_slips(value, expected, mistakes)
    if named:
        raise AssertionError(f"{name} = {value!r}{in_unit} is wrong: {named}")
    if not whole:
        raise AssertionError(_not_whole(name, value, in_unit))
    hint = diagnose(
        value,
        expected,
        None,
        num_layers=num_layers,
        num_attention_heads=num_attention_heads,
        num_kv_heads=num_kv_heads,
        generic=generic,
    )
    if hint is None:
        side = "too large" if value > expected else "too small"
        tolerance = f"within {rel * 100:.2g}%" if rel >= 1e-4 else "exactly"  # 0.1%, 2%
        hint = (
            f"it is {side}, and not {tolerance} right. Recheck each factor of the "
            f"formula and the unit{in_unit}."
        )
    raise AssertionError(f"{name} = {value!r}{in_unit} is wrong: {hint}")


def is_whole(value: float | int) -> bool:
    """Whether a (real, finite) value is a whole number: 98304 and 98304.0 are."""
    return value == int(value)


def _not_whole(name: str, value: float | int, in_unit: str) -> str:
    return (
        f"{name} = {value!r} is not a whole number{in_unit}: a count of bytes, seats or "
        "tokens has no fraction. If you divided, round down to what fits."
    )


def plausible(
    answer: object,
    name: str,
    unit: str,
    *,
    low: float,
    high: float,
    integer: bool = False,
) -> None:
    """The visible sanity check: a number ``expect`` would grade, between ``low`` and ``high``.

    Accepts what ``expect(..., integer=integer)`` accepts and nothing else, so
    it never contradicts the hidden test; the range only catches answers far
    off (a unit slip of 1000x), and says nothing about the value being right.
    Prints one line when the answer passes.
    """
    if answer is Ellipsis:  # the released notebook's placeholder: say so, run on
        print(f"{name} is not answered yet: replace the ... in the cell above with your "
              "answer.")
        return
    value = real_value(answer, name, unit)
    in_unit = f" (in {unit})" if unit else ""
    if integer and not is_whole(value):
        raise AssertionError(_not_whole(name, value, in_unit))
    if not low <= value <= high:
        raise AssertionError(
            f"{name} = {value!r}{in_unit} is not plausible here: expect between "
            f"{low:,g} and {high:,g}. Check the unit."
        )
    print(f"{name} is a plausible number{in_unit}; the hidden test checks its value.")
