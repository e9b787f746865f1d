"""What the course times: a copy, a read, a matrix multiply, decode attention over a KV cache.

Each builder allocates its tensors on the device once and returns a :class:`Kernel`
with the bytes it moves and the FLOPs it does, counted by :mod:`kvlib.timing.roofline`,
and a reference for its output: :func:`check_output` compares the two before a time
is trusted (a fast kernel that computes the wrong thing is not a measurement).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlib.dtypes import require_dtype
from kvlib.timing import roofline
from kvlib.timing.devices import resolve_device

__all__ = [
    "DECODE_IMPLS",
    "TORCH_DTYPES",
    "Kernel",
    "OutputMismatch",
    "attention_reference",
    "check_output",
    "copy",
    "decode_attention",
    "matmul",
    "paged_decode_attention_flex",
    "read",
    "scaled_mm",
    "tolerance",
    "torch_dtype",
]

# kvlib dtype name -> torch dtype attribute, for the types these kernels run in.
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
DECODE_IMPLS = ("sdpa", "matmul")


@dataclass(frozen=True)
class Kernel:
    """A function to time, with the bytes it moves and the FLOPs it does per call.

    ``reference`` computes what ``fn()`` must return by another route (float32
    math, the contiguous cache), within ``atol + rtol x |reference|`` per
    element; None where there is nothing to compare.
    """

    name: str
    fn: Callable[[], object]
    bytes_moved: int
    flops: int
    description: str
    reference: Callable[[], object] | None = None
    atol: float = 0.0
    rtol: float = 0.0

    @property
    def intensity_flops_per_byte(self) -> float:
        """FLOPs per byte moved (0 for a copy or a read)."""
        return self.flops / self.bytes_moved


class OutputMismatch(ValueError):
    """A timed kernel's output differs from its reference: the time is not recorded."""


def check_output(kernel: Kernel) -> dict[str, Any]:
    """Run ``kernel.fn()`` once and compare it with ``kernel.reference()``.

    Passes when every element satisfies ``|out - ref| <= atol + rtol x |ref|``
    (``torch.allclose``'s rule), compared in float32; returns what was checked.
    Raises :class:`OutputMismatch` naming the worst element otherwise, and when
    the shapes differ.
    """
    import torch

    if kernel.reference is None:
        return {"checked": False, "reason": "no reference for this kernel"}
    out = torch.as_tensor(kernel.fn()).float()
    ref = torch.as_tensor(kernel.reference()).float().to(out.device)
    if out.shape != ref.shape:
        raise OutputMismatch(
            f"{kernel.name}: output shape {tuple(out.shape)} is not the reference's "
            f"{tuple(ref.shape)}"
        )
    error = (out - ref).abs()
    allowed = kernel.atol + kernel.rtol * ref.abs()
    excess = (error - allowed).nan_to_num(nan=math.inf)
    worst = int(excess.argmax()) if excess.numel() else 0
    max_error = float(error.max()) if error.numel() else 0.0
    if excess.numel() and float(excess.flatten()[worst]) > 0:
        raise OutputMismatch(
            f"{kernel.name}: output differs from its reference at element {worst} "
            f"(|out - ref| = {float(error.flatten()[worst]):.4g} > atol {kernel.atol:g} + "
            f"rtol {kernel.rtol:g} x |ref|); largest error {max_error:.4g}"
        )
    return {"checked": True, "max_abs_error": max_error, "atol": kernel.atol,
            "rtol": kernel.rtol, "elements": int(ref.numel())}


# Tolerances against a float32 reference: bf16 keeps 8 bits of mantissa (relative step
# 2**-8 = 0.0039), fp8 e4m3 three (0.0625); sums of many rounded terms need a few steps.
_TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (1e-2, 1e-2), "bf16": (3e-2, 3e-2),
              "fp8": (0.15, 0.15)}


def tolerance(dtype: str) -> tuple[float, float]:
    """``(atol, rtol)`` for outputs computed in ``dtype`` against a float32 reference."""
    return _TOLERANCE["fp8" if dtype.startswith("fp8") else require_dtype(dtype)]


def torch_dtype(dtype: str) -> Any:
    """The torch dtype for ``"bf16"``, ``"fp16"`` or ``"fp32"`` (aliases accepted)."""
    import torch

    name = require_dtype(dtype)
    if name not in TORCH_DTYPES:
        raise ValueError(
            f"dtype {dtype!r} cannot be timed here: use one of {', '.join(TORCH_DTYPES)}"
        )
    return getattr(torch, TORCH_DTYPES[name])


def copy(n_bytes: int, device: str) -> Kernel:
    """``dst.copy_(src)`` of ``n_bytes`` on one device: ``2 N`` bytes moved (read + write)."""
    import torch

    moved = roofline.copy_bytes_moved(n_bytes)
    where = resolve_device(device)
    # A random 1 MiB tile, repeated: the check still sees a pattern that a skipped copy's
    # uninitialised destination cannot match, at a fraction of torch.randint's time over
    # every byte (0.5 s for 64 MiB on a CPU).
    tile = torch.randint(0, 256, (min(n_bytes, 1 << 20),), dtype=torch.uint8, device=where)
    src = tile.repeat(-(-n_bytes // tile.numel()))[:n_bytes]
    dst = torch.empty_like(src)
    return Kernel("copy", lambda: dst.copy_(src), moved, 0,
                  f"copy of {n_bytes:,} bytes (read + write: {moved:,} bytes moved)",
                  reference=lambda: src)


def read(n_bytes: int, device: str) -> Kernel:
    """``x.sum()`` over ``n_bytes`` of float32: a pure read, the other reference bandwidth."""
    import torch

    elements = max(1, n_bytes // 4)
    x = torch.ones(elements, dtype=torch.float32, device=resolve_device(device))
    moved = elements * 4
    # Ones: the sum is the element count, exact in float32 up to 2**24 per partial sum.
    return Kernel("read", lambda: x.sum(), moved, elements,
                  f"sum of {moved:,} bytes of float32 (read only)",
                  reference=lambda: torch.tensor(float(elements)), rtol=1e-6)


def matmul(m: int, n: int, k: int, dtype: str, device: str, layers: int = 1) -> Kernel:
    """``C_i = A @ B_i`` for ``layers`` weight matrices B_i (k x n), A (m x k):
    ``2 m n k`` FLOPs and ``matmul_bytes`` per layer.

    Several layers, as a model's stacked weights, make a decode-shaped matmul
    (small m) move more than the cold-cache rule's bytes without changing its
    shape. The reference is layer 0 in float32.
    """
    import torch

    if not (isinstance(layers, int) and layers >= 1):
        raise ValueError(f"layers must be an int >= 1, got {layers!r}")
    flops = layers * roofline.matmul_flops(m, n, k)
    kind = torch_dtype(dtype)
    moved = layers * roofline.matmul_bytes(m, n, k, int(kind.itemsize))
    where = resolve_device(device)
    a = torch.randn(m, k, dtype=kind, device=where)
    bs = [torch.randn(k, n, dtype=kind, device=where) for _ in range(layers)]
    cs = [torch.empty(m, n, dtype=kind, device=where) for _ in range(layers)]

    def fn() -> object:
        for b, c in zip(bs, cs, strict=True):
            torch.mm(a, b, out=c)
        return cs[0]

    stacked = f", {layers} layers" if layers > 1 else ""
    atol, rtol = tolerance(dtype)
    return Kernel("matmul", fn, moved, flops,
                  f"matmul ({m} x {k}) @ ({k} x {n}) in {require_dtype(dtype)}{stacked}",
                  reference=lambda: a.float() @ bs[0].float(), atol=atol, rtol=rtol)


def scaled_mm(m: int, n: int, k: int, device: str) -> Kernel:
    """An fp8 (e4m3) matmul by ``torch._scaled_mm`` with per-tensor scales, bf16 out.

    ``torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=...)`` wants ``a``
    row-major (m x k) and ``b`` column-major (k x n), each dimension a multiple
    of 16, and float32 scales (``aten/src/ATen/native/cuda/Blas.cpp``). Bytes:
    one per fp8 element in, two per bf16 element out. Reference: the same fp8
    values, dequantised, multiplied in float32.
    """
    import torch

    where = resolve_device(device)
    fp8 = torch.float8_e4m3fn
    a32 = torch.randn(m, k, device=where)
    w32 = torch.randn(n, k, device=where)
    scale_a = (a32.abs().max() / 448).float()  # 448: e4m3's largest finite value
    scale_b = (w32.abs().max() / 448).float()
    a = (a32 / scale_a).to(fp8)
    b = (w32 / scale_b).to(fp8).t()  # (k, n), column-major
    flops = roofline.matmul_flops(m, n, k)
    moved = m * k + k * n + 2 * m * n

    def fn() -> object:
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)

    def reference() -> object:
        return (a.float() * scale_a) @ (b.float() * scale_b)

    return Kernel("scaled-mm", fn, moved, flops,
                  f"fp8 e4m3 matmul ({m} x {k}) @ ({k} x {n}), torch._scaled_mm, bf16 out",
                  reference=reference, atol=0.05 * k**0.5, rtol=0.05)


def decode_attention(
    batch: int,
    context_tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: str,
    device: str,
    impl: str = "sdpa",
) -> Kernel:
    """One decode step of attention: ``B`` new queries over a cache of ``T`` tokens each.

    Shapes: q (B, H, 1, d); cached K and V (B, H_kv, T, d). ``impl="sdpa"``
    calls ``scaled_dot_product_attention`` (``enable_gqa`` when H > H_kv);
    ``impl="matmul"`` groups the ``H / H_kv`` query heads of each KV head into
    one batched matrix product, so each KV head is read once by one kernel.
    """
    import torch
    import torch.nn.functional as F

    if impl not in DECODE_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(DECODE_IMPLS)}, got {impl!r}")
    flops = roofline.decode_kernel_flops(batch, heads, context_tokens, head_dim)
    kind = torch_dtype(dtype)
    moved = roofline.decode_kernel_bytes(
        batch, heads, kv_heads, context_tokens, head_dim, int(kind.itemsize)
    )
    where = resolve_device(device)
    q = torch.randn(batch, heads, 1, head_dim, dtype=kind, device=where)  # (B, H, 1, d)
    k = torch.randn(batch, kv_heads, context_tokens, head_dim, dtype=kind, device=where)
    v = torch.randn_like(k)  # (B, H_kv, T, d)
    group = heads // kv_heads
    fn: Callable[[], object]
    if impl == "sdpa":
        gqa = group > 1
        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)  # noqa: E731
    else:
        qg = q.view(batch, kv_heads, group, head_dim)  # query head h uses KV head h // group
        scale = head_dim**-0.5

        def fn() -> object:
            # Scale q (B H d values), not the scores (B H T); softmax accumulates in fp32.
            scores = torch.matmul(qg * scale, k.transpose(-1, -2))  # (B, H_kv, G, T)
            probs = torch.softmax(scores, dim=-1)
            return torch.matmul(probs, v).view(batch, heads, 1, head_dim)

    text = (
        f"decode attention ({impl}): batch {batch}, {context_tokens:,} cached tokens, "
        f"{heads} heads / {kv_heads} KV heads of {head_dim}, {require_dtype(dtype)}"
    )
    atol, rtol = tolerance(dtype)
    return Kernel("decode-attention", fn, moved, flops, text,
                  reference=lambda: attention_reference(q, k, v), atol=atol, rtol=rtol)


def attention_reference(q: Any, k: Any, v: Any) -> Any:
    """Decode attention in float32 by the textbook formula, softmax(q K^T / sqrt(d)) V.

    q (B, H, 1, d); k, v (B, H_kv, T, d); query head h reads KV head h // (H / H_kv).
    No SDPA backend is involved, so it checks every backend.
    """
    import torch

    batch, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    qg = q.float().view(batch, kv_heads, heads // kv_heads, head_dim)  # (B, H_kv, G, d)
    scores = qg @ k.float().transpose(-1, -2) * head_dim**-0.5  # (B, H_kv, G, T)
    out = torch.softmax(scores, dim=-1) @ v.float()  # (B, H_kv, G, d)
    return out.view(batch, heads, 1, head_dim)


def paged_decode_attention_flex(
    batch: int,
    context_tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: str,
    block_size: int,
    device: str,
    compile: bool = True,
) -> Kernel:
    """Decode attention reading K and V in place through a block table: torch's
    ``PagedAttention`` on ``flex_attention``.

    ``torch.nn.attention.experimental._paged_attention.PagedAttention`` keeps
    the pool as ``(1, H_kv, pages x block_size, d)`` and a page table per
    sequence; ``convert_logical_block_mask`` turns a decode block mask over
    logical positions into one over the pool's pages, which ``flex_attention``
    reads where they lie (no gather). Pages are handed out in a shuffled order,
    as a pool in use scatters them. ``compile=True`` runs
    ``torch.compile(flex_attention)``, the fused kernel (the eager call, used
    on a CPU, materialises the scores). Bytes: the cache once, q and the output,
    the page table (int64) as the kernel reads it. Reference: the same K and V
    laid out contiguously, in float32.
    """
    import random

    import torch
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention, noop_mask

    if context_tokens % block_size:
        raise ValueError(
            f"context_tokens ({context_tokens}) must be a multiple of "
            f"block_size ({block_size}) for whole blocks"
        )
    kind = torch_dtype(dtype)
    where = resolve_device(device)
    pages = batch * context_tokens // block_size
    paged = PagedAttention(pages, block_size, batch, device=str(where))
    random.Random(0).shuffle(paged.empty_pages)
    for b in range(batch):
        paged.reserve(torch.tensor(b, device=where), torch.tensor(context_tokens, device=where))
    k_pool = torch.zeros(1, kv_heads, pages * block_size, head_dim, dtype=kind, device=where)
    v_pool = torch.zeros_like(k_pool)  # (1, H_kv, pages x B_s, d)
    k = torch.randn(batch, kv_heads, context_tokens, head_dim, dtype=kind, device=where)
    v = torch.randn_like(k)  # (B, H_kv, T, d): the logical cache, kept for the reference
    positions = torch.arange(context_tokens, device=where).expand(batch, context_tokens)
    paged.assign(torch.arange(batch, device=where), positions, k, v, k_pool, v_pool)
    q = torch.randn(batch, heads, 1, head_dim, dtype=kind, device=where)  # (B, H, 1, d)
    logical = create_block_mask(
        noop_mask, batch, None, 1, context_tokens, device=str(where), BLOCK_SIZE=(1, block_size)
    )
    mask = paged.convert_logical_block_mask(logical)
    attend = torch.compile(flex_attention) if compile else flex_attention

    def fn() -> object:
        with warnings.catch_warnings():
            # Eager flex_attention warns that it materialises the scores: asked for here.
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            return attend(q, k_pool, v_pool, block_mask=mask, enable_gqa=heads > kv_heads)

    moved = roofline.decode_kernel_bytes(
        batch, heads, kv_heads, context_tokens, head_dim, int(kind.itemsize)
    ) + batch * (context_tokens // block_size) * 8
    flops = roofline.decode_kernel_flops(batch, heads, context_tokens, head_dim)
    text = (
        f"paged decode attention (flex_attention + PagedAttention, read in place"
        f"{', compiled' if compile else ', eager'}): batch {batch}, {context_tokens:,} cached "
        f"tokens in blocks of {block_size}, {heads} heads / {kv_heads} KV heads of {head_dim}, "
        f"{require_dtype(dtype)}"
    )
    atol, rtol = tolerance(dtype)
    return Kernel("paged-decode-attention", fn, moved, flops, text,
                  reference=lambda: attention_reference(q, k, v), atol=atol, rtol=rtol)
