"""The slips a wrong answer reveals, and the hint that names them.

A slip is known by the ratio it produces between a wrong answer and the right
value: the factor 2 for keys and values, 8 for bits and bytes, 1.024 per step
for KiB and KB, ``L`` for one layer and all, ``H / H_kv`` for query and KV
heads. A hint never contains the right value (learners see it in their
feedback), only the ratio and the name of the slip.

This module imports nothing beyond the standard library: :mod:`course.checks`,
which graded notebooks import, uses it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["Mistake", "diagnose", "named_slips"]

# Tolerance used to recognise a slip: the wrong value it produces is computed
# exactly, so a close match is a confident diagnosis.
_MISTAKE_REL = 1e-6


class Mistake(NamedTuple):
    """A slip a learner can make, and the ratio (answer / right value) it produces."""

    hint: str
    factor: float


def _generic_mistakes(
    num_layers: int | None, num_attention_heads: int | None, num_kv_heads: int | None
) -> list[Mistake]:
    """Generic slips, as factors of the right value, most common first."""
    found = [
        Mistake("did you leave out the factor 2 for keys and values (one K and one V "
                "per head)?", 0.5),
        Mistake("did you count keys and values twice, or use 2 bytes where the element "
                "is 1 byte?", 2.0),
        Mistake("did you give bits where bytes were asked? (1 byte = 8 bits)", 8.0),
        Mistake("did you divide by 8 once too often, treating bytes as bits?", 1 / 8),
    ]
    for power, (binary, decimal) in enumerate((("KiB", "KB"), ("MiB", "MB"), ("GiB", "GB")), 1):
        factor = 1.024**power
        in_binary, in_decimal = f"{binary} (1024^{power} bytes)", f"{decimal} (1000^{power} bytes)"
        off = f"The answer is off by exactly 1.024^{power}."
        found.append(Mistake(f"did you mix {in_binary} with {in_decimal}? {off}", factor))
        found.append(Mistake(f"did you mix {in_decimal} with {in_binary}? {off}", 1 / factor))
    if num_layers is not None and num_layers > 1:
        found.append(Mistake(f"this is one layer's share: multiply by all {num_layers} layers.",
                             1 / num_layers))
        found.append(Mistake(f"did you multiply by the {num_layers} layers twice, or give a "
                             "total where one layer's value was asked?", float(num_layers)))
    if num_attention_heads and num_kv_heads and num_attention_heads != num_kv_heads:
        ratio = num_attention_heads / num_kv_heads
        found.append(Mistake(
            f"did you use the {num_attention_heads} attention (query) heads instead of the "
            f"{num_kv_heads} KV heads? Only KV heads are cached.", ratio))
    return found


def _ratio_text(ratio: float) -> str:
    if ratio >= 1:
        return f"about {ratio:.3g}x too large"
    return f"about {1 / ratio:.3g}x too small"


def named_slips(value: float, expected: float, mistakes: Mapping[str, float] | None) -> str:
    """The hints of the listed slips that give ``value``.

    Every slip that gives ``value`` exactly is named: two slips can give the same
    number (query heads twice the KV heads, and 4-byte elements), the value cannot
    tell them apart, and naming only one would send a learner after the wrong one.
    When no single slip matches, two slips made together are tried: where each
    scales the answer by a factor (a per-minute rate used per second, milliseconds
    for seconds), the two factors multiply, and both are named.
    """
    found = [(hint, wrong) for hint, wrong in (mistakes or {}).items()
             if wrong != expected and math.isfinite(wrong)]
    hints = [hint for hint, wrong in found if math.isclose(value, wrong, rel_tol=_MISTAKE_REL)]
    if len(hints) == 1:
        return hints[0]
    if hints:
        return "this value comes from either of two slips: " + "; or ".join(hints)
    if expected == 0:
        return ""
    for (first, wrong_a), (second, wrong_b) in itertools.combinations(found, 2):
        combined = wrong_a / expected * wrong_b / expected * expected
        if wrong_a and wrong_b and math.isclose(value, combined, rel_tol=_MISTAKE_REL):
            return f"two slips at once: {first}; and {second}"
    return ""


def diagnose(
    value: float,
    expected: float,
    mistakes: Mapping[str, float] | None = None,
    *,
    num_layers: int | None = None,
    num_attention_heads: int | None = None,
    num_kv_heads: int | None = None,
    generic: bool = True,
) -> str | None:
    """The hint for the first known slip that produces ``value``, or None.

    Challenge-specific ``mistakes`` (exact wrong values) are tried first, then
    the generic factors one at a time, then pairs of them (two slips at once).
    """
    named = named_slips(value, expected, mistakes)
    if named:
        return named
    if not generic or expected == 0 or value == 0:
        return None
    ratio = value / expected
    slips = _generic_mistakes(num_layers, num_attention_heads, num_kv_heads)
    for slip in slips:
        if math.isclose(ratio, slip.factor, rel_tol=_MISTAKE_REL):
            return f"{_ratio_text(ratio)}: {slip.hint}"
    for first, second in itertools.combinations(slips, 2):
        if math.isclose(ratio, first.factor * second.factor, rel_tol=_MISTAKE_REL):
            return f"{_ratio_text(ratio)}, two slips: {first.hint} And {second.hint}"
    return None
