"""kvlib._validate: the argument checks every module shares, and cdiv."""

from __future__ import annotations

import enum
import math

import numpy as np
import pytest

from kvlib._validate import (
    WrongTypeError,
    are_non_negative_ints,
    cdiv,
    is_int,
    is_number,
    require_fraction,
    require_int,
    require_positive,
)


def test_require_int_accepts_ints_at_or_above_the_minimum() -> None:
    assert require_int(0, "tokens") == 0
    assert require_int(5, "batch", 1) == 5


@pytest.mark.parametrize("value", [-1, True, 2.0, "3", None])
def test_require_int_refuses_with_the_name(value: object) -> None:
    with pytest.raises(ValueError, match="tokens must be a non-negative integer"):
        require_int(value, "tokens")


def test_require_int_names_the_minimum() -> None:
    with pytest.raises(ValueError, match="batch must be a positive integer, got 0"):
        require_int(0, "batch", 1)
    with pytest.raises(ValueError, match="window must be an integer >= 2, got 1"):
        require_int(1, "window", 2)


@pytest.mark.parametrize("value", [2.0, True, "3"])
def test_a_wrong_type_is_a_type_error_and_a_value_error(value: object) -> None:
    with pytest.raises(TypeError, match="block_size must be a positive integer"):
        require_int(value, "block_size", 1)
    with pytest.raises(WrongTypeError):
        require_positive(value if value != 2.0 else "2", "capacity")


def test_a_wrong_value_is_only_a_value_error() -> None:
    with pytest.raises(ValueError) as info:
        require_int(0, "block_size", 1)
    assert not isinstance(info.value, TypeError)
    with pytest.raises(ValueError) as info:
        require_positive(-1.0, "capacity")
    assert not isinstance(info.value, TypeError)


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


def test_bools_are_neither_ints_nor_numbers() -> None:
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_number(3) and is_number(2.5) and not is_number(False) and not is_number("1")


@pytest.mark.parametrize(
    ("a", "b", "blocks"),
    [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2), (131_073, 16, 8_193)],
)
def test_cdiv_counts_whole_blocks(a: int, b: int, blocks: int) -> None:
    assert cdiv(a, b) == blocks


def test_cdiv_stays_exact_where_a_float_ceiling_does_not() -> None:
    a, b = 10**30 + 1, 10**15
    assert cdiv(a, b) == 10**15 + 1
    assert math.ceil(a / b) == 10**15  # the float quotient dropped the remainder


class _Token(enum.IntEnum):
    EOS = 2


@pytest.mark.parametrize(
    ("values", "valid"),
    [
        ([], True),
        ([0, 7, 2**40], True),
        ((5, 6), True),
        ([_Token.EOS, 3], True),  # an int subclass other than bool is an int
        ([1, -1], False),
        ([-3], False),
        ([1, True], False),
        ([False], False),
        ([1, 2.0], False),
        ([np.int64(4)], False),
        (["1"], False),
        ([1, None], False),
        ([_Token.EOS, -1], False),
    ],
)
def test_are_non_negative_ints(values: list[object], valid: bool) -> None:
    assert are_non_negative_ints(values) is valid
