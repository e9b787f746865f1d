"""kvlib._validate: the argument checks every module shares."""

from __future__ import annotations

import math

import pytest

from kvlib._validate import require_fraction, require_int, require_positive


def test_require_int_accepts_ints_at_or_above_the_minimum() -> None:
    assert require_int(0, "tokens") == 0
    assert require_int(5, "batch", 1) == 5


@pytest.mark.parametrize("value", [-1, True, 2.0, "3", None])
def test_require_int_refuses_with_the_name(value: object) -> None:
    with pytest.raises(ValueError, match="tokens must be a non-negative integer"):
        require_int(value, "tokens")


def test_require_int_names_the_minimum() -> None:
    with pytest.raises(ValueError, match="batch must be an integer >= 1, got 0"):
        require_int(0, "batch", 1)


@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, True, "1"])
def test_require_positive_refuses(value: object) -> None:
    with pytest.raises(ValueError, match="flops_per_s"):
        require_positive(value, "flops_per_s")


def test_require_fraction() -> None:
    assert require_fraction(0.9, "u") == 0.9
    assert require_fraction(1, "u") == 1.0
    for bad in (0, 1.01, -0.5):
        with pytest.raises(ValueError, match="u must"):
            require_fraction(bad, "u")
