"""kvlib.units: binary and decimal units are never mixed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlib.units import GB, GiB, KiB, MiB, format_bytes, format_flops, format_rate, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80 GB", 80 * 10**9),
        ("80GB", 80 * 10**9),
        ("9 GiB", 9 * 2**30),
        ("160 KiB", 163_840),
        ("163,840", 163_840),
        ("0.5 MiB", 2**19),
        ("6.25 GiB", 6_710_886_400),
        ("1 tB", 10**12),
    ],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "ten GB", "9 Gb", "9 Gib", "9 GIBS", "-1 GB"])
def test_parse_bytes_rejects_with_a_fix(text: str) -> None:
    with pytest.raises(ValueError, match="GB|GiB|unit"):
        parse_bytes(text)


def test_gib_is_not_gb() -> None:
    # 7.4 % apart: the reason names carry their unit.
    assert GiB / GB == pytest.approx(1.073741824)
    assert parse_bytes("1 GiB") != parse_bytes("1 GB")


@pytest.mark.parametrize(
    ("n_bytes", "kwargs", "expected"),
    [
        (163_840, {}, "160 KiB"),
        (640 * MiB, {}, "640 MiB"),
        (6_710_886_400, {}, "6.25 GiB"),
        # "6,250 MiB" for ten 640 MiB seats is a classic slip: it is 6,400.
        (10 * 640 * MiB, {"unit": "MiB"}, "6,400 MiB"),
        (80 * GB, {"binary": False}, "80 GB"),
        (512, {}, "512 B"),
        (1536, {"unit": "KiB"}, "1.5 KiB"),
    ],
)
def test_format_bytes(n_bytes: int, kwargs: dict[str, object], expected: str) -> None:
    assert format_bytes(n_bytes, **kwargs) == expected  # type: ignore[arg-type]


def test_format_bytes_refuses_floats_and_unknown_units() -> None:
    with pytest.raises(TypeError):
        format_bytes(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown unit"):
        format_bytes(10, unit="GiBs")


def test_rates_are_decimal() -> None:
    assert format_rate(3.35e12) == "3.35 TB/s"
    assert format_rate(1_008e9) == "1.01 TB/s"
    assert format_flops(989.4e12) == "989.4 TFLOP/s"


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["KiB", "MiB", "GiB", "B"]))
def test_format_then_parse_round_trips_within_rounding(n_bytes: int, unit: str) -> None:
    text = format_bytes(n_bytes, unit=unit, digits=6)
    size = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB}[unit]
    assert abs(parse_bytes(text) - n_bytes) <= size * 1e-6
