"""fp8 e4m3 (``torch.float8_e4m3fn``) with a float32 scale per tensor or per token.

Quantize as vLLM's cache kernels do (``scaled_vec_conversion`` in
``csrc/quantization/fp8/nvidia/quant_utils.cuh``:
``__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3)``): divide by
the scale, round to the nearest e4m3 value, saturate at +-448; dequantize as
``code * scale``.

e4m3 has 3 mantissa bits: within a binade ``[2^e, 2^(e+1))`` the step is
``2^(e-3)``, so rounding to nearest moves a normal value by at most
``2^-4`` of itself; below ``2^-6`` the subnormal step is ``2^-9``. With
``y = x / s`` the elementwise bound is::

    |x_hat - x| <= s * max(2^-4 |y|, 2^-10, |y| - 448)

the last term being saturation, which a scale of ``max|x| / 448`` never
causes and a static scale calibrated too small does.

- ``granularity="tensor"``: one scale; ``max|x| / 448`` unless a static
  ``scale`` is given (vLLM's ``k_scale`` / ``v_scale``, calibrated or 1.0).
- ``granularity="token"``: one scale per vector along the last dimension,
  computed as it is written; on a (tokens, heads, head_dim) cache that is
  one scale per token and head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from kvlib._validate import is_number
from kvlib.nn.quant import FLOAT_SLACK, SMALLEST_SCALE, ScaledCodes, require_input

__all__ = ["FP8_MAX", "Fp8Scaled", "Granularity", "quantize_fp8"]

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
_HALF_ULP = 2.0**-4  # relative, normal range (3 mantissa bits)
_HALF_SUBNORMAL_STEP = 2.0**-10  # absolute, in units of the scale

Granularity = Literal["tensor", "token"]


@dataclass(frozen=True, eq=False)
class Fp8Scaled(ScaledCodes):
    """fp8 e4m3 codes (the shape of x) and float32 scale(s): shape () per tensor,
    ``x.shape[:-1] + (1,)`` per token."""

    granularity: Granularity

    def saturated(self, x: torch.Tensor) -> torch.Tensor:
        """Where ``|x / s|`` exceeded 448 and was clipped (only a static scale can do this).

        A dynamic scale puts the largest value at 448 up to float32 rounding of
        ``x / s``, which is not counted.
        """
        return (x / self.scale).abs() > FP8_MAX * (1 + FLOAT_SLACK)

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        """``s * max(2^-4 |y|, 2^-10, |y| - 448)`` with ``y = x / s`` (see the module doc)."""
        y = (x / self.scale).abs()
        rounding = torch.maximum(_HALF_ULP * y, torch.full_like(y, _HALF_SUBNORMAL_STEP))
        bound = torch.maximum(rounding, y - FP8_MAX) * self.scale
        return bound + FLOAT_SLACK * x.abs()


def quantize_fp8(
    x: torch.Tensor,
    *,
    granularity: Granularity = "tensor",
    scale: float | torch.Tensor | None = None,
) -> Fp8Scaled:
    """fp8 e4m3 codes of ``x``: per-tensor (dynamic or static ``scale``) or per-token."""
    if granularity == "tensor":
        x = require_input(x)
        step = _from_amax(x.abs().amax()) if scale is None else _static_scale(scale)
    elif granularity == "token":
        x = require_input(x, min_rank=2)
        if scale is not None:
            raise ValueError(
                "scale is for granularity='tensor' (one static scale); per-token scales "
                "are computed from each token as it is written: leave scale=None"
            )
        step = _from_amax(x.abs().amax(dim=-1, keepdim=True))
    else:
        raise ValueError(f"granularity must be 'tensor' or 'token', got {granularity!r}")
    codes = (x / step).clamp_(-FP8_MAX, FP8_MAX).to(FP8)  # round to nearest, saturating
    return Fp8Scaled(codes=codes, scale=step, granularity=granularity)


def _from_amax(amax: torch.Tensor) -> torch.Tensor:
    """``max|x| / 448``, at least ``SMALLEST_SCALE`` (1 for an all-zero x): max|x| lands on 448."""
    scale = (amax / FP8_MAX).clamp(min=SMALLEST_SCALE)
    return torch.where(amax > 0, scale, torch.ones_like(amax))


def _static_scale(scale: float | torch.Tensor) -> torch.Tensor:
    if isinstance(scale, torch.Tensor) and scale.numel() != 1:
        raise ValueError(
            f"scale must be one number for granularity='tensor', got shape {tuple(scale.shape)}"
        )
    if not isinstance(scale, torch.Tensor) and not is_number(scale):
        raise TypeError(f"scale must be a float or a one-element tensor, got {scale!r}")
    value = float(scale)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    return torch.tensor(value, dtype=torch.float32)
