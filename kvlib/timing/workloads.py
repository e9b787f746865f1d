"""What the course times: a copy, a read, a matrix multiply, decode attention over a KV cache.

Each builder allocates its tensors on the device once and returns a :class:`Kernel`
with the bytes it moves and the FLOPs it does, counted by :mod:`kvlib.timing.roofline`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvlib.dtypes import check_dtype
from kvlib.timing import roofline
from kvlib.timing.devices import resolve_device

__all__ = [
    "DECODE_IMPLS",
    "TORCH_DTYPES",
    "Kernel",
    "copy",
    "decode_attention",
    "matmul",
    "read",
    "torch_dtype",
]

# kvlib dtype name -> torch dtype attribute, for the types these kernels run in.
TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
DECODE_IMPLS = ("sdpa", "matmul")


@dataclass(frozen=True)
class Kernel:
    """A function to time, with the bytes it moves and the FLOPs it does per call."""

    name: str
    fn: Callable[[], object]
    bytes_moved: int
    flops: int
    description: str

    @property
    def intensity_flops_per_byte(self) -> float:
        """FLOPs per byte moved (0 for a copy or a read)."""
        return self.flops / self.bytes_moved


def torch_dtype(dtype: str) -> Any:
    """The torch dtype for ``"bf16"``, ``"fp16"`` or ``"fp32"`` (aliases accepted)."""
    import torch

    name = check_dtype(dtype)
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
    src = torch.ones(n_bytes, dtype=torch.uint8, device=where)
    dst = torch.empty_like(src)
    return Kernel("copy", lambda: dst.copy_(src), moved, 0,
                    f"copy of {n_bytes:,} bytes (read + write: {moved:,} bytes moved)")


def read(n_bytes: int, device: str) -> Kernel:
    """``x.sum()`` over ``n_bytes`` of float32: a pure read, the other reference bandwidth."""
    import torch

    elements = max(1, n_bytes // 4)
    x = torch.ones(elements, dtype=torch.float32, device=resolve_device(device))
    moved = elements * 4
    return Kernel("read", lambda: x.sum(), moved, elements,
                    f"sum of {moved:,} bytes of float32 (read only)")


def matmul(m: int, n: int, k: int, dtype: str, device: str) -> Kernel:
    """``C = A @ B`` with A (m x k), B (k x n) into a preallocated C: ``2 m n k`` FLOPs."""
    import torch

    flops = roofline.matmul_flops(m, n, k)
    kind = torch_dtype(dtype)
    moved = roofline.matmul_bytes(m, n, k, int(kind.itemsize))
    where = resolve_device(device)
    a = torch.randn(m, k, dtype=kind, device=where)
    b = torch.randn(k, n, dtype=kind, device=where)
    c = torch.empty(m, n, dtype=kind, device=where)
    return Kernel("matmul", lambda: torch.mm(a, b, out=c), moved, flops,
                    f"matmul ({m} x {k}) @ ({k} x {n}) in {check_dtype(dtype)}")


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
    flops = roofline.decode_attention_flops(batch, heads, context_tokens, head_dim)
    kind = torch_dtype(dtype)
    moved = roofline.decode_attention_bytes(
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
        f"{heads} heads / {kv_heads} KV heads of {head_dim}, {check_dtype(dtype)}"
    )
    return Kernel("decode-attention", fn, moved, flops, text)
