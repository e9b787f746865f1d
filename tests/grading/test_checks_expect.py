"""course.checks: which answers pass, which are refused, and the mistake each wrong one names."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from course.checks import describe_type_problem, diagnose, expect, plausible, real_value

# Chapter 1's worked example: 40 layers, 8 KV heads,
# 128 dims, 2 bytes -> 163,840 bytes per token. Written out, not from kvlib.
EXAMPLE_BYTES = 2 * 40 * 8 * 128 * 2


def failure(answer: object, expected: float, **kwargs: object) -> str:
    """The AssertionError message ``expect`` raises (fails the test if it passes)."""
    with pytest.raises(AssertionError) as info:
        expect(answer, expected, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


class TestAccepts:
    def test_exact_int(self) -> None:
        expect(EXAMPLE_BYTES, EXAMPLE_BYTES, rel=0)

    def test_float_within_rel(self) -> None:
        expect(1.005, 1.0, rel=0.01)

    def test_float_outside_rel_fails(self) -> None:
        failure(1.02, 1.0, rel=0.01)

    def test_abs_tolerance(self) -> None:
        expect(0.0004, 0.0, abs=1e-3)

    def test_integral_float_for_integer_answer(self) -> None:
        expect(float(EXAMPLE_BYTES), EXAMPLE_BYTES, rel=0, integer=True)

    @pytest.mark.parametrize("kind", [np.int32, np.int64, np.uint64, np.float32, np.float64])
    def test_numpy_scalars(self, kind: type) -> None:
        expect(kind(4096), 4096, rel=0)

    def test_returns_none(self) -> None:
        # A value as a test cell's last expression would be read by nbgrader as partial credit.
        assert expect(3, 3) is None  # type: ignore[func-returns-value]


class AlwaysEqual:
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = object.__hash__


class IntThatEqualsAll(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class FloatSubclass(float):
    pass


FakeNumpy = type("float64", (), {"__module__": "numpy", "__eq__": lambda self, other: True})


class TestRefuses:
    @pytest.mark.parametrize(
        ("answer", "phrase"),
        [
            (True, "bool"),
            (np.bool_(True), "bool"),
            ("163840", "string"),
            (None, "None"),
            (..., "placeholder"),
            (AlwaysEqual(), "AlwaysEqual"),
            (IntThatEqualsAll(EXAMPLE_BYTES), "IntThatEqualsAll"),
            (FloatSubclass(EXAMPLE_BYTES), "FloatSubclass"),
            (FakeNumpy(), "numpy.float64"),
            (Fraction(EXAMPLE_BYTES), "Fraction"),
            ([EXAMPLE_BYTES], "list"),
        ],
    )
    def test_non_numbers(self, answer: object, phrase: str) -> None:
        message = failure(answer, EXAMPLE_BYTES, name="bytes_per_token")
        assert phrase in message
        assert "bytes_per_token" in message

    @pytest.mark.parametrize("answer", [math.nan, math.inf, -math.inf, np.float64("nan")])
    def test_non_finite(self, answer: float) -> None:
        assert "finite" in failure(answer, 1.0)

    def test_fraction_for_integer_answer(self) -> None:
        message = failure(14.06, 14, rel=0.1, integer=True, name="seats")
        assert "whole number" in message

    def test_bad_expected_is_a_test_bug(self) -> None:
        with pytest.raises(TypeError, match="expected"):
            expect(1, math.nan)
        with pytest.raises(TypeError, match="expected"):
            expect(1, True)  # type: ignore[arg-type]

    def test_real_value_converts_numpy(self) -> None:
        value = real_value(np.int64(7))
        assert value == 7 and type(value) is int


class TestGenericMistakes:
    """Each generic slip, applied to chapter 1's example, is named."""

    @pytest.mark.parametrize(
        ("answer", "phrase"),
        [
            (EXAMPLE_BYTES // 2, "factor 2 for keys and values"),
            (EXAMPLE_BYTES * 2, "twice"),
            (EXAMPLE_BYTES * 8, "bits"),
            (EXAMPLE_BYTES // 8, "bytes as bits"),
            (EXAMPLE_BYTES // 40, "multiply by all 40 layers"),
            (EXAMPLE_BYTES * 4, "32 attention (query) heads instead of the 8 KV heads"),
            (EXAMPLE_BYTES * 16, "two slips"),
        ],
    )
    def test_factor(self, answer: int, phrase: str) -> None:
        message = failure(
            answer, EXAMPLE_BYTES, rel=0, num_layers=40, num_attention_heads=32, num_kv_heads=8
        )
        assert phrase in message

    @pytest.mark.parametrize(("power", "unit"), [(1, "KiB"), (2, "MiB"), (3, "GiB")])
    def test_binary_vs_decimal(self, power: int, unit: str) -> None:
        # 9 GiB read as 9 GB and the reverse (chapter 1's free memory).
        right = 9 * 1024**power
        assert unit in failure(9 * 1000**power, right, rel=0)
        assert unit in failure(9 * 1024**power * 1.024**power, right, rel=0)

    def test_layer_and_head_checks_need_their_numbers(self) -> None:
        message = failure(EXAMPLE_BYTES // 40, EXAMPLE_BYTES, rel=0)
        assert "layers" not in message

    def test_unknown_factor_says_direction_only(self) -> None:
        message = failure(EXAMPLE_BYTES * 3 + 1, EXAMPLE_BYTES, rel=0, unit="bytes")
        assert "too large" in message
        assert "(in bytes)" in message

    def test_generic_off(self) -> None:
        assert diagnose(7.0, 14.0, generic=False) is None
        assert diagnose(7.0, 14.0) is not None


class TestSpecificMistakes:
    def test_named_mistake_before_whole_number_rule(self) -> None:
        """98.304 for 98,304 bytes is the KB slip, not a rounding problem."""
        right = 98_304
        hints = {"you gave KB (1000 bytes); the answer is asked in bytes": right / 1000}
        message = failure(98.304, right, rel=0, integer=True, mistakes=hints, name="b")
        assert "you gave KB" in message
        assert "whole number" not in message and "round" not in message

    def test_fraction_that_is_no_named_mistake_is_not_whole(self) -> None:
        message = failure(98.5, 98_304, rel=0, integer=True, mistakes={"KB": 98.304})
        assert "whole number" in message

    def test_specific_wins_over_generic(self) -> None:
        hint = "you used 16-bit elements; this cache is 8-bit"
        wrong = 2 * EXAMPLE_BYTES
        message = failure(wrong, EXAMPLE_BYTES, rel=0, mistakes={hint: wrong})
        assert hint in message
        assert "twice" not in message

    def test_two_scaling_slips_made_together_are_both_named(self) -> None:
        """A per-minute rate used per second (x60) and milliseconds for seconds (x1000)."""
        slips = {"the rate is per minute": 60 * 0.5, "you gave milliseconds": 1000 * 0.5}
        message = failure(60_000 * 0.5, 0.5, rel=0.01, mistakes=slips)
        assert message.endswith(
            "two slips at once: the rate is per minute; and you gave milliseconds"
        )
        # One slip alone is named alone, without "or".
        assert failure(30.0, 0.5, rel=0.01, mistakes=slips).endswith("the rate is per minute")
        # A value neither slip nor their product explains gets no named slip.
        assert "two slips" not in failure(7.0, 0.5, rel=0.01, mistakes=slips, generic=False)

    def test_mistake_equal_to_right_value_is_ignored(self) -> None:
        # A wrong formula that happens to give the right number must not fail the answer.
        expect(14, 14, mistakes={"rounded up": 14})

    def test_matched_within_tiny_tolerance(self) -> None:
        hint = "you gave milliseconds"
        assert hint in failure(960.0000001, 0.96, rel=0.01, mistakes={hint: 960.0})

    def test_slips_giving_the_same_value_are_all_named(self) -> None:
        """Query heads twice the KV heads and 4-byte elements both double the bytes."""
        slips = {
            "you used the 8 attention heads": 2 * EXAMPLE_BYTES,
            "you used 4 bytes per element": 2 * EXAMPLE_BYTES,
            "you gave KiB": 160.0,
        }
        message = failure(2 * EXAMPLE_BYTES, EXAMPLE_BYTES, rel=0, mistakes=slips)
        assert message.endswith("you used the 8 attention heads; or you used 4 bytes per element")
        assert diagnose(2 * EXAMPLE_BYTES, EXAMPLE_BYTES, slips) == message.split("wrong: ")[1]


class TestMessagesHideTheAnswer:
    @given(
        expected=st.integers(min_value=10, max_value=10**12),
        # From 2 up: for an answer of 1, "about Nx too small" is the expected value
        # itself, as any hint that names the factor must be.
        answer=st.integers(min_value=2, max_value=10**13),
        layers=st.integers(min_value=1, max_value=128),
    )
    def test_expected_never_in_message(self, expected: int, answer: int, layers: int) -> None:
        # The layer count is part of the prompt; the message may repeat it.
        assume(answer != expected and layers != expected)
        message = failure(answer, expected, rel=0, num_layers=layers, unit="bytes")
        own = message.split(" is wrong", 1)[-1]  # drop the echo of the student's answer
        numbers = {n.replace(",", "").replace("_", "") for n in re.findall(r"[\d,_]+", own)}
        assert str(expected) not in numbers

    def test_float_expected_never_in_message(self) -> None:
        message = failure(0.5, 0.96, rel=0.01, unit="seconds")
        assert "0.96" not in message


# Candidate answers of every kind a learner might leave in an answer variable.
CANDIDATES: list[object] = [
    98_304, 98_304.0, 98_304.5, 98.304, 0, -3, 1e300, np.int64(98_304), np.float32(98_304),
    np.float64(0.96), np.uint8(7), True, np.bool_(False), "98304", None, ..., [98_304],
    Fraction(3, 2), IntThatEqualsAll(98_304), FloatSubclass(98_304), AlwaysEqual(), math.nan,
    math.inf, complex(1, 0),
]
# The placeholder ``...`` of a released answer cell is said, not refused, by the visible
# check (test_placeholder_is_said_not_refused); every other candidate gets one verdict.
GRADED = [c for c in CANDIDATES if c is not Ellipsis]


class TestPlausibleAgreesWithExpect:
    """The visible sanity check refuses exactly the answers expect refuses for type or form."""

    @staticmethod
    def refused_by_expect(answer: object, integer: bool) -> bool:
        # Expected value chosen so that only type/form decides: a value it equals passes.
        try:
            value = real_value(answer)
        except AssertionError:
            return True
        try:
            expect(answer, value if not integer or value == int(value) else 1, rel=0,
                   integer=integer)
        except AssertionError:
            return True
        return False

    @staticmethod
    def refused_by_plausible(answer: object, integer: bool) -> bool:
        try:
            plausible(answer, "x", "bytes", low=-math.inf, high=math.inf, integer=integer)
        except AssertionError:
            return True
        return False

    @pytest.mark.parametrize("integer", [True, False])
    @pytest.mark.parametrize(
        "answer", GRADED, ids=[f"{i}-{type(c).__name__}" for i, c in enumerate(GRADED)]
    )
    def test_same_verdict(self, answer: object, integer: bool) -> None:
        assert self.refused_by_plausible(answer, integer) == self.refused_by_expect(answer, integer)

    def test_placeholder_is_said_not_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A released answer cell holds ``x = ...``: its check says so without raising (Run
        All goes on to the next challenge), and the hidden test still scores it nothing."""
        plausible(..., "x", "bytes", low=0, high=1)
        assert capsys.readouterr().out == (
            "x is not answered yet: replace the ... in the cell above with your answer.\n")
        with pytest.raises(AssertionError, match="still the placeholder"):
            expect(..., 1.0, name="x")

    def test_integral_float_passes_both(self, capsys: pytest.CaptureFixture[str]) -> None:
        """98304.0 bytes: the hidden test accepts it, so the visible check must too."""
        plausible(98_304.0, "b", "bytes", low=1024, high=2**20, integer=True)
        assert "plausible" in capsys.readouterr().out
        expect(98_304.0, 98_304, rel=0, integer=True)

    def test_range_says_unit(self) -> None:
        with pytest.raises(AssertionError, match="Check the unit"):
            plausible(98_304 * 8, "b", "bytes", low=1024, high=2**19)


def test_describe_type_problem_mentions_unit() -> None:
    assert "(in bytes)" in describe_type_problem("__main__.Foo", "x", "bytes")


def test_import_is_light() -> None:
    """Graded notebooks import course.checks: it must not pull in torch or numpy."""
    code = "import sys, course.checks; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("rel", "said"), [(0.001, "within 0.1%"), (0.02, "within 2%"),
                                           (0.25, "within 25%"), (1e-9, "exactly")])
def test_the_hint_states_the_tolerance_it_applied(rel: float, said: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(f"not {said} right")):
        expect(1.5, 1.0, rel=rel, name="x", generic=False)
