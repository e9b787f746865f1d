"""Element types of weights and caches, by their width in bits."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kvlib._validate import cdiv

__all__ = ["DTYPE_BITS", "bytes_for", "canonical_dtype", "require_dtype"]

DTYPE_BITS: Mapping[str, int] = MappingProxyType(
    {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4}
)

# Common spellings (torch, config.json's torch_dtype, vLLM's --kv-cache-dtype) of the
# same widths: the one alias table.
_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "4bit": "int4",
    "fp4": "int4",
}


def require_dtype(name: str) -> str:
    """The canonical name of a dtype (``"bfloat16"`` -> ``"bf16"``); a ValueError lists them."""
    canonical = _ALIASES.get(name, name) if isinstance(name, str) else name
    if canonical not in DTYPE_BITS:
        raise ValueError(f"unknown dtype {name!r}: use one of {', '.join(DTYPE_BITS)}")
    return str(canonical)


def canonical_dtype(name: object) -> str | None:
    """:func:`require_dtype`'s name for ``name``, or None where it names no dtype kvlib knows
    (a ``torch_dtype`` of "auto", a missing field)."""
    if not isinstance(name, str):
        return None
    canonical = _ALIASES.get(name, name)
    return canonical if canonical in DTYPE_BITS else None


def bytes_for(elements: int, dtype: str) -> int:
    """Bytes of ``elements`` values of ``dtype``: ``ceil(elements x bits / 8)``.

    Sub-byte types pack two 4-bit values in a byte; an odd count rounds up.
    """
    return cdiv(elements * DTYPE_BITS[require_dtype(dtype)], 8)
