"""Quantized tensors: what they store, how they read back, and how far off they may be.

The formats (:mod:`kvlib.nn.quant_int`, :mod:`kvlib.nn.quant_fp8`) count their
**stored bytes** from the tensors they hold, never from a formula, so the
formulas of :mod:`kvlib.weights.params` can be checked against them; each states
an elementwise **error bound** derived from the format alone (half a step of the
integer grid; half a unit in the last place of fp8, plus any saturation), which
:func:`measure_error` checks a round trip against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = [
    "FLOAT_SLACK",
    "SMALLEST_SCALE",
    "QuantError",
    "Quantized",
    "ScaledCodes",
    "require_input",
    "measure_error",
    "tensor_bytes",
]

# Relative slack for the quantizer's own float32 arithmetic (x / s and q * s
# each round once): a few units in the last place of float32 (2**-23).
FLOAT_SLACK = 2.0**-20

# The smallest scale a quantizer computes: float32's smallest normal number, 2**-126.
# Below it a scale would be subnormal (a few significant bits, so x / s would be far off)
# or zero (x / s would be NaN). A tensor whose values are all tinier than the format's
# top code times this floor is quantized on the floor: a coarser grid than its range
# asks for, still within the half-step bound of that grid.
SMALLEST_SCALE = float(torch.finfo(torch.float32).tiny)

_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class Quantized(Protocol):
    """What every quantized tensor offers, whatever its format."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def stored_bytes(self) -> int:
        """Bytes of every tensor it holds: codes, scales and zero points."""
        ...

    def dequantize(self) -> torch.Tensor:
        """The float32 values the codes stand for."""
        ...

    def error_bound(self, x: torch.Tensor) -> torch.Tensor:
        """Elementwise bound on ``|dequantize() - x|`` for the ``x`` it was made from."""
        ...


@dataclass(frozen=True, eq=False)
class ScaledCodes:
    """Codes and the float32 scale that broadcasts over them: ``x_hat = codes * scale``."""

    codes: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    @property
    def stored_bytes(self) -> int:
        return tensor_bytes(self.codes, self.scale)

    def dequantize(self) -> torch.Tensor:
        return self.codes.to(torch.float32) * self.scale


@dataclass(frozen=True)
class QuantError:
    """How far a round trip landed from the original, against the format's bound.

    ``rel_rms = ||x_hat - x||_2 / ||x||_2``; ``max_abs = max |x_hat - x|``.
    The bounds come from the format (:meth:`Quantized.error_bound`), not from
    the data: ``rel_rms_bound = ||bound||_2 / ||x||_2``.
    """

    rel_rms: float
    max_abs: float
    rel_rms_bound: float
    max_abs_bound: float
    within_bound: bool
    saturated_fraction: float

    def __str__(self) -> str:
        return (
            f"relative RMS {self.rel_rms:.3%} (bound {self.rel_rms_bound:.3%}), "
            f"max |error| {self.max_abs:.3g} (bound {self.max_abs_bound:.3g})"
        )


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes the tensors occupy: ``numel x element_size``, summed (None counts 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def require_input(x: object, name: str = "x", *, min_rank: int = 1) -> torch.Tensor:
    """``x`` as float32, or a ValueError/TypeError naming ``name`` and the fix.

    Refuses non-tensors, non-float dtypes, too few dimensions, empty tensors and
    NaN or infinity (a scale computed from them would be NaN for the whole tensor).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in _INPUT_DTYPES)
        raise TypeError(
            f"{name} has dtype {x.dtype}; quantize a floating tensor ({allowed}), e.g. x.float()"
        )
    if x.dim() < min_rank:
        raise ValueError(
            f"{name} must have at least {min_rank} dimension(s), got shape {tuple(x.shape)}"
        )
    if x.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(x.shape)}): nothing to quantize")
    y = x.to(torch.float32)
    # amax and amin propagate NaN and infinity: two cheap reductions decide.
    if not (math.isfinite(float(y.amax())) and math.isfinite(float(y.amin()))):
        finite = torch.isfinite(y)
        bad = int((~finite).sum())
        first = tuple(int(i) for i in (~finite).nonzero()[0])
        beyond = " (beyond float32's range)" if bool(torch.isfinite(x).all()) else ""
        raise ValueError(
            f"{name} has {bad} NaN or infinite value(s){beyond}, the first at index {first}: "
            "a scale computed from them is meaningless; fix or mask them first"
        )
    return y


def measure_error(x: torch.Tensor, q: Quantized) -> QuantError:
    """Round-trip error of ``q`` (made from ``x``) against the format's own bound."""
    reference = require_input(x)
    if tuple(reference.shape) != tuple(q.shape):
        raise ValueError(f"x has shape {tuple(reference.shape)} but q holds shape {q.shape}")
    err = (q.dequantize() - reference).abs()
    bound = q.error_bound(reference)
    norm = float(reference.double().norm())
    saturated = getattr(q, "saturated", None)
    return QuantError(
        rel_rms=_ratio(float(err.double().norm()), norm),
        max_abs=float(err.max()),
        rel_rms_bound=_ratio(float(bound.double().norm()), norm),
        max_abs_bound=float(bound.max()),
        within_bound=bool((err <= bound).all()),
        saturated_fraction=0.0 if saturated is None else float(saturated(reference).float().mean()),
    )


def _ratio(num: float, den: float) -> float:
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den
