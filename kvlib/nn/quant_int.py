"""Integer quantization: int8 per channel (symmetric) and int4 in groups (asymmetric).

int8, one scale per channel (weights: per output row, ``axis=0``; keys as
KIVI and KVQuant quantize them: per head-dim channel, ``axis=-1``)::

    s_c = max_c |x| / 127,   q = clamp(round(x / s_c), -127, 127),   x_hat = q * s_c

int4, one scale and one zero point per group of ``group_size`` consecutive
elements of a row, as AWQ-style checkpoints store them (``zero_point: true``)::

    lo = min(min(x_g), 0),  hi = max(max(x_g), 0)        # the range holds 0 exactly
    s_g = (hi - lo) / 15,   z_g = round(-lo / s_g)         # z_g is a code in 0..15
    q = clamp(round(x / s_g) + z_g, 0, 15),   x_hat = (q - z_g) * s_g

Both grids are uniform, so every element in range lands within half a step of
the original: ``|x_hat - x| <= s / 2``. Keeping 0 inside the int4 range (as
GPTQ's quantizer does) makes the zero point a valid code and 0 exact.
Scales are stored in ``scale_dtype`` (fp16 by default for int4, as GPTQ and
AWQ checkpoints do; fp32 for int8), rounded *up* so the range is still covered,
and never below :data:`kvlib.nn.quant.SMALLEST_SCALE` (float32's smallest normal
number), so a range of subnormal values never gets a zero or inexact scale.
Codes and zero points are packed two per byte (:func:`pack_int4`).

llama.cpp's ``q4_0`` (a 4-bit KV cache with ``--cache-type-k q4_0``): blocks of
32 consecutive values, one fp16 scale each and no zero point; the scale maps the
block's largest-magnitude value ``m`` (with its sign) to code 0 (ggml
``quantize_row_q4_0_ref`` in ``ggml-quants.c``)::

    d = m / -8,   q = min(15, floor(x / d + 8.5)),   x_hat = (q - 8) * d

18 bytes per 32 values: 4.5 bits a value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlib._validate import is_int, require_int
from kvlib.nn.quant import FLOAT_SLACK, SMALLEST_SCALE, ScaledCodes, require_input, tensor_bytes

__all__ = [
    "Int4Grouped",
    "Int8PerChannel",
    "Q4_0Blocks",
    "pack_int4",
    "quantize_int4",
    "quantize_int8",
    "quantize_q4_0",
    "unpack_int4",
]

Q4_0_BLOCK = 32  # ggml's QK4_0

_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True, eq=False)
class Int8PerChannel(ScaledCodes):
    """int8 codes (the shape of x) with one float32 scale per index along ``axis``
    (the scale has x's size along axis, 1 elsewhere)."""

    axis: int

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Half a step of the channel's grid: ``s_c / 2``."""
        return self.scale / 2 + FLOAT_SLACK * x.abs()


def quantize_int8(x: torch.Tensor, *, axis: int = 0) -> Int8PerChannel:
    """Symmetric int8 with one scale per index along ``axis`` (0: rows of a weight)."""
    x = require_input(x, min_rank=2)
    if not is_int(axis) or not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis must be an int in [{-x.dim()}, {x.dim()}), got {axis!r}")
    axis %= x.dim()
    others = [d for d in range(x.dim()) if d != axis]
    amax = x.abs().amax(dim=others, keepdim=True)
    scale = torch.where(amax > 0, (amax / 127).clamp(min=SMALLEST_SCALE), torch.ones_like(amax))
    codes = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
    return Int8PerChannel(codes=codes, scale=scale, axis=axis)


@dataclass(frozen=True, eq=False)
class Int4Grouped:
    """Packed int4 codes of a (rows, cols) matrix, a scale and a zero point per group."""

    packed: torch.Tensor  # uint8 (rows, ceil(cols / 2)): two codes a byte
    scale: torch.Tensor  # scale_dtype (rows, cols / group_size)
    packed_zeros: torch.Tensor  # uint8 (rows, ceil(groups / 2)): two zero points a byte
    cols: int
    group_size: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.packed.shape[0], self.cols)

    @property
    def groups(self) -> int:
        return self.cols // self.group_size

    @property
    def stored_bytes(self) -> int:
        return tensor_bytes(self.packed, self.scale, self.packed_zeros)

    def codes(self) -> torch.Tensor:
        """The 4-bit codes, unpacked: uint8 in 0..15, shape (rows, cols)."""
        return unpack_int4(self.packed, self.cols)

    def zeros(self) -> torch.Tensor:
        """The zero points, unpacked: uint8 in 0..15, shape (rows, groups)."""
        return unpack_int4(self.packed_zeros, self.groups)

    def dequantize(self) -> torch.Tensor:
        rows = self.packed.shape[0]
        codes = self.codes().view(rows, self.groups, self.group_size).to(torch.float32)
        zeros = self.zeros().to(torch.float32).unsqueeze(-1)
        values = (codes - zeros) * self.scale.to(torch.float32).unsqueeze(-1)
        return values.view(rows, self.cols)

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Half a step of each group's grid: ``s_g / 2``."""
        half_step = (self.scale.to(torch.float32) / 2).repeat_interleave(self.group_size, dim=1)
        return half_step + FLOAT_SLACK * x.abs()


def quantize_int4(
    x: torch.Tensor, *, group_size: int = 128, scale_dtype: torch.dtype = torch.float16
) -> Int4Grouped:
    """Asymmetric int4 in groups of ``group_size`` along each row of a 2-D ``x``."""
    x = require_input(x, min_rank=2)
    if x.dim() != 2:
        raise ValueError(
            f"x must be 2-D (rows, columns), got shape {tuple(x.shape)}: "
            "reshape it, e.g. x.reshape(-1, x.shape[-1])"
        )
    rows, cols = x.shape
    require_int(group_size, "group_size", 1)
    if cols % group_size:
        divisors = [g for g in (32, 64, 128, 256) if cols % g == 0] or [cols]
        raise ValueError(
            f"group_size={group_size} does not divide the {cols} columns of x: "
            f"use a divisor of {cols}, e.g. {divisors[-1]}"
        )
    if scale_dtype not in _SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {_SCALE_DTYPES}, got {scale_dtype!r}")
    grouped = x.reshape(rows, cols // group_size, group_size)  # (rows, groups, group_size)
    lo = grouped.amin(dim=-1).clamp(max=0)
    hi = grouped.amax(dim=-1).clamp(min=0)
    span = hi - lo
    # An all-zero group has range 0: scale 1, every code the zero point.
    scale = _round_up(torch.where(span > 0, (span / 15).clamp(min=SMALLEST_SCALE), 1), scale_dtype)
    step = scale.to(torch.float32)
    zeros = torch.round(-lo / step).clamp(0, 15)
    codes = torch.round(grouped / step.unsqueeze(-1) + zeros.unsqueeze(-1)).clamp(0, 15)
    return Int4Grouped(
        packed=pack_int4(codes.view(rows, cols).to(torch.uint8)),
        scale=scale,
        packed_zeros=pack_int4(zeros.to(torch.uint8)),
        cols=cols,
        group_size=group_size,
    )


def _round_up(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``scale`` in ``dtype``, never below the float32 value (so the range stays covered)."""
    stored = scale.to(dtype)
    up = torch.nextafter(stored, torch.full_like(stored, float("inf")))
    stored = torch.where(stored.to(torch.float32) < scale, up, stored)
    if not bool(torch.isfinite(stored).all()):
        raise ValueError(
            f"a group's scale ({float(scale.max()):.3g}) overflows {dtype}: "
            "pass scale_dtype=torch.float32"
        )
    return stored


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dimension: index ``2j`` low, ``2j + 1`` high.

    An odd length is padded with one zero nibble.
    """
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes must be uint8, got {codes.dtype}")
    if bool((codes > 15).any()):
        raise ValueError("codes must be in 0..15 to fit in 4 bits")
    if codes.shape[-1] % 2:
        codes = torch.nn.functional.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor, length: int) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: ``length`` codes along the last dimension."""
    both = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(start_dim=-2)  # low first
    return both[..., :length]


@dataclass(frozen=True, eq=False)
class Q4_0Blocks:
    """llama.cpp ``q4_0``: packed 4-bit codes, one fp16 scale per 32 values of a row."""

    packed: torch.Tensor  # uint8 (rows, cols / 2)
    scale: torch.Tensor  # float16 (rows, cols / 32)
    cols: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.packed.shape[0], self.cols)

    @property
    def stored_bytes(self) -> int:
        return tensor_bytes(self.packed, self.scale)

    def dequantize(self) -> torch.Tensor:
        rows = self.packed.shape[0]
        codes = unpack_int4(self.packed, self.cols).to(torch.float32)
        blocks = codes.view(rows, self.cols // Q4_0_BLOCK, Q4_0_BLOCK) - 8
        return (blocks * self.scale.to(torch.float32).unsqueeze(-1)).view(rows, self.cols)


def quantize_q4_0(x: torch.Tensor) -> Q4_0Blocks:
    """``x`` (rows, cols) in llama.cpp's ``q4_0``, blocks of 32 along each row.

    ``d = m / -8`` for the block's largest-magnitude value ``m``; codes
    ``min(15, floor(x / d + 8.5))``. The value ``m`` itself is exact (code 0)
    and the opposite extreme clips to code 15, ``-7 d``.
    """
    x = require_input(x, min_rank=2)
    if x.dim() != 2 or x.shape[1] % Q4_0_BLOCK:
        raise ValueError(
            f"x must be 2-D with a multiple of {Q4_0_BLOCK} columns (q4_0 blocks), "
            f"got shape {tuple(x.shape)}"
        )
    rows, cols = x.shape
    blocks = x.to(torch.float32).view(rows, cols // Q4_0_BLOCK, Q4_0_BLOCK)
    where = blocks.abs().argmax(dim=-1, keepdim=True)
    extreme = blocks.gather(-1, where).squeeze(-1)  # the signed value of largest magnitude
    d = extreme / -8  # codes use the float32 scale, the block stores it as fp16 (as ggml)
    inv = torch.where(d != 0, 1 / d, torch.zeros_like(d))
    codes = torch.floor(blocks * inv.unsqueeze(-1) + 8.5).clamp(0, 15)
    packed = pack_int4(codes.view(rows, cols).to(torch.uint8))
    return Q4_0Blocks(packed, d.to(torch.float16), cols)
