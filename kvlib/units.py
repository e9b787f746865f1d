"""Byte and rate units, with binary (KiB = 1024 B) and decimal (KB = 1000 B) kept apart.

Memory capacities in this course are reported in binary units (a "9 GiB free"
cache pool), vendor datasheets quote decimal ones (an "80 GB" card, "3.35 TB/s"
of bandwidth). Mixing the two silently is a 7.4 % error at the GiB scale, so
every function here says which one it uses.
"""

from __future__ import annotations

import re

from kvlib._validate import is_int

__all__ = [
    "BINARY_UNITS",
    "DECIMAL_UNITS",
    "GB",
    "GiB",
    "KB",
    "KiB",
    "MB",
    "MiB",
    "TB",
    "TiB",
    "format_bytes",
    "format_flops",
    "format_rate",
    "parse_bytes",
]

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4

BINARY_UNITS: dict[str, int] = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}
DECIMAL_UNITS: dict[str, int] = {"B": 1, "KB": KB, "MB": MB, "GB": GB, "TB": TB}
_ALL_UNITS: dict[str, int] = {**DECIMAL_UNITS, **BINARY_UNITS}
_UNIT_BY_LOWER: dict[str, str] = {u.lower(): u for u in _ALL_UNITS}

_QUANTITY = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Parse ``"80 GB"``, ``"9GiB"`` or ``"163840"`` into an integer number of bytes.

    ``KB/MB/GB/TB`` are decimal (powers of 1000), ``KiB/MiB/GiB/TiB`` binary
    (powers of 1024); a bare number is bytes. The prefix's case is ignored
    ("gB" is GB), but a unit ending in a lower-case "b" ("Gb", "Gib") is a
    bit unit and is refused.
    The result is rounded to the nearest byte.
    """
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(
            f"cannot read {text!r} as a size: write a number and a unit such as "
            "'80 GB' (decimal) or '9 GiB' (binary)"
        )
    number, unit = match.groups()
    unit = unit or "B"
    if unit.endswith("b"):
        # A lower-case b is a bit (Gb, Mib): eight times smaller than a byte.
        raise ValueError(f"{text!r} is in bits ({unit}); give bytes, e.g. 'GB' or 'GiB'")
    canonical = _UNIT_BY_LOWER.get(unit.lower())
    if canonical is None:
        raise ValueError(f"unknown unit {unit!r} in {text!r}: use one of {', '.join(_ALL_UNITS)}")
    return round(float(number.replace(",", "").replace("_", "")) * _ALL_UNITS[canonical])


def _pick_unit(n_bytes: int, binary: bool) -> str:
    """The largest unit in which ``n_bytes`` is at least 1."""
    table = BINARY_UNITS if binary else DECIMAL_UNITS
    return next((name for name, size in reversed(table.items()) if abs(n_bytes) >= size), "B")


def format_bytes(
    n_bytes: int, *, unit: str | None = None, binary: bool = True, digits: int = 2
) -> str:
    """Format a byte count: ``format_bytes(163840) == "160 KiB"``.

    ``unit`` forces one unit (``"MiB"`` gives ``"6,400 MiB"``); otherwise the
    largest binary unit (or decimal one with ``binary=False``) is used.
    Trailing zeros are dropped and thousands are separated by commas.
    """
    if not is_int(n_bytes):
        raise TypeError(f"n_bytes must be an int number of bytes, got {type(n_bytes).__name__}")
    chosen = unit if unit is not None else _pick_unit(n_bytes, binary)
    if chosen not in _ALL_UNITS:
        raise ValueError(f"unknown unit {chosen!r}: use one of {', '.join(_ALL_UNITS)}")
    return f"{_format_number(n_bytes / _ALL_UNITS[chosen], digits)} {chosen}"


def format_rate(bytes_per_s: float, *, digits: int = 2) -> str:
    """Format a bandwidth in decimal units, the way datasheets quote it: ``"3.35 TB/s"``."""
    chosen = _pick_unit(int(bytes_per_s), binary=False)
    return f"{_format_number(bytes_per_s / DECIMAL_UNITS[chosen], digits)} {chosen}/s"


def format_flops(flops_per_s: float, *, digits: int = 2) -> str:
    """Format a compute rate in decimal units: ``format_flops(989e12) == "989 TFLOP/s"``."""
    for name, size in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9)):
        if flops_per_s >= size:
            return f"{_format_number(flops_per_s / size, digits)} {name}"
    return f"{_format_number(flops_per_s, digits)} FLOP/s"


def _format_number(value: float, digits: int) -> str:
    """Comma-grouped, at most ``digits`` decimals, trailing zeros removed."""
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
