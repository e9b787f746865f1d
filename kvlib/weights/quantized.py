"""Bytes of weights stored in a quantized checkpoint format, tensor by tensor.

Formats, each with the source of its layout:

- ``fp8`` with ``weight_block_size`` (DeepSeek-V3, Qwen3 FP8): one byte per
  weight and one fp32 scale per block (``weight_scale_inv`` of shape
  ``(ceil(out / b0), ceil(in / b1))``; DeepSeek-V3 technical report, section
  3.3.2; transformers ``FineGrainedFP8``); without a block size, one fp32
  scale per matrix. Linear layers only: embeddings, norms and routers stay.
- ``mxfp4`` (gpt-oss): experts only, two 4-bit values a byte plus one 8-bit
  (E8M0) scale per 32 values along the input dimension (OCP Microscaling
  Formats spec v1.0; gpt-oss model card, section 2.3).
- ``gptq`` / ``awq`` with ``bits`` and ``group_size``: packed ``bits``-bit
  weights, an fp16 scale and a ``bits``-bit zero point per group of
  ``group_size`` inputs per output; GPTQ also stores an int32 ``g_idx`` per
  input (AutoGPTQ ``QuantLinear``; AutoAWQ ``WQLinear_GEMM``). The LM head
  stays unquantized.

Anything else is reported as not modelled rather than guessed.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from kvlib._validate import cdiv
from kvlib.config import QuantizationConfig
from kvlib.dtypes import bytes_for
from kvlib.weights.layouts import WeightGroup

__all__ = ["MODELLED_METHODS", "ShippedWeights", "shipped_bytes"]

MODELLED_METHODS = ("fp8", "mxfp4", "gptq", "awq")
_MX_BLOCK = 32  # MXFP4: one shared E8M0 scale per 32 elements


@dataclass(frozen=True)
class ShippedWeights:
    """The weights as the checkpoint stores them: bytes, the format, and any caveat."""

    bytes: int | None
    format: str
    note: str = ""


def _skipped(module: str, patterns: Sequence[str]) -> bool:
    """Whether ``module`` (a parameter's name) falls under a ``modules_to_not_convert`` entry."""
    owner = module.rsplit(".", 1)[0]
    return any(
        fnmatch.fnmatchcase(owner, pattern)
        or fnmatch.fnmatchcase(owner, f"{pattern}.*")
        or fnmatch.fnmatchcase(owner, f"*.{pattern}")
        for pattern in patterns
    )


def _quantizes(group: WeightGroup, q: QuantizationConfig) -> bool:
    """mxfp4 quantizes the experts only; the others every linear layer (not the LM head)."""
    if q.method == "mxfp4":
        return group.role == "expert"
    return group.role in ("linear", "expert")


def _matrix_bytes(out: int, inp: int, q: QuantizationConfig) -> int:
    """Stored bytes of one ``(out, in)`` weight matrix in format ``q``."""
    if q.method == "fp8":
        if q.block_shape is None:
            return out * inp + 4
        b0, b1 = q.block_shape
        return out * inp + 4 * cdiv(out, b0) * cdiv(inp, b1)
    if q.method == "mxfp4":
        return bytes_for(out * inp, "int4") + out * cdiv(inp, _MX_BLOCK)
    bits = q.bits or 4
    group = inp if q.group_size in (None, -1) else q.group_size
    groups = cdiv(inp, group)
    packed = cdiv(out * inp * bits, 8) + cdiv(groups * out * bits, 8) + 2 * groups * out
    return packed + (4 * inp if q.method == "gptq" else 0)


def shipped_bytes(
    groups: Sequence[WeightGroup], q: QuantizationConfig, base_dtype: str
) -> ShippedWeights:
    """Bytes of ``groups`` stored as ``q`` says, unquantized tensors in ``base_dtype``."""
    if q.method not in MODELLED_METHODS:
        return ShippedWeights(
            None,
            q.method,
            f"quant_method {q.method!r} is not modelled (kvlib sizes "
            f"{', '.join(MODELLED_METHODS)}): give the weight precision explicitly",
        )
    total = 0
    for group in groups:
        for name in group.module_names():
            if _quantizes(group, q) and not _skipped(name, q.modules_to_not_convert):
                out, inp = group.shape
                each = _matrix_bytes(out, inp, q)
            else:
                each = bytes_for(group.elements, base_dtype)
            total += group.copies_per_layer * each
    return ShippedWeights(total, _label(q))


def _label(q: QuantizationConfig) -> str:
    if q.method == "fp8" and q.block_shape:
        return f"fp8 ({q.block_shape[0]}x{q.block_shape[1]} blocks)"
    if q.method in ("gptq", "awq"):
        return f"{q.method} int{q.bits or 4} (group {q.group_size})"
    return q.method
