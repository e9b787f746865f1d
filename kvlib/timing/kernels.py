"""Two short Triton kernels the GPU check times beside torch's: a streaming read, and
decode attention that reads a paged KV cache in place through its block table.

Triton is imported inside the functions, so this module imports on a machine
without it; :func:`triton_missing` says why a kernel cannot be built there.
Each builder returns a :class:`~kvlib.timing.workloads.Kernel` with a
reference, so no time is recorded before the output is checked.

- :func:`stream_read` sums a float32 buffer with wide loads: each program reads
  ``block x iters`` contiguous elements (``block`` per step, 16-byte vector
  loads per thread) and writes one partial sum. It is the read-bandwidth
  ceiling that ``torch.sum`` (a general reduction) may fall short of.
- :func:`paged_decode` is one decode step of grouped-query attention: one
  program per (sequence, KV head) reads that head's keys and values tile by
  tile (``TILE`` tokens), looking up each token's block in the table, with an
  online softmax (FlashAttention's running max and sum). The pool is vLLM's
  FlashAttention layout ``(num_blocks, block_size, H_kv, d)``
  (``get_kv_cache_shape``, ``vllm/v1/attention/backends/flash_attn.py``); a
  contiguous cache is the same layout with one block per sequence. fp8 (e4m3)
  K and V are read as stored and scaled by one factor per tensor, as vLLM's
  ``kv_cache_dtype="fp8"`` with ``k_scale`` and ``v_scale``.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from kvlib.timing import roofline
from kvlib.timing.devices import resolve_device
from kvlib.timing.workloads import Kernel, attention_reference, tolerance, torch_dtype

__all__ = ["STREAM_READ_CONFIGS", "paged_decode", "stream_read", "triton_missing"]

# (elements per step, steps per program, warps): 4096 float32 over 256 threads is four
# 16-byte loads per thread per step. Tried in turn; the check keeps the fastest.
STREAM_READ_CONFIGS = ((4096, 16, 8), (8192, 8, 8), (2048, 32, 4))
_TILE = 64  # tokens per step of the decode kernel
_GROUP_PAD = 16  # tl.dot needs at least 16 rows: the query heads of a group, padded


def triton_missing(device: str) -> str | None:
    """None when Triton kernels can run on ``device``, else the reason."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not importable ({exc})"
    if resolve_device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton kernels need a GPU (or TRITON_INTERPRET=1, its slow CPU interpreter)"
    return None


@functools.cache
def _kernels() -> Any:
    """Compile-on-first-call Triton functions, defined once triton is known to import."""
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def read_sum(x_ptr, partial_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):  # type: ignore[no-untyped-def]
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * BLOCK * ITERS
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for i in range(ITERS):
            offs = start + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(partial_ptr + pid, tl.sum(acc, axis=0))

    @triton.jit  # type: ignore[untyped-decorator]
    def decode(  # type: ignore[no-untyped-def]
        q_ptr, k_ptr, v_ptr, table_ptr, out_ptr,
        scale, k_scale, v_scale, table_stride, s_block, s_token, CONTEXT: tl.constexpr,
        H_KV: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        D: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, FP8: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D)
        rows = (b * H_KV * GROUP + kvh * GROUP + g)[:, None] * D + d[None, :]
        live = (g < GROUP)[:, None]
        q = tl.load(q_ptr + rows, mask=live, other=0.0)  # (GROUP_PAD, D)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        total = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
        for start in range(0, CONTEXT, TILE):
            n = start + tl.arange(0, TILE)
            inside = n < CONTEXT
            block = tl.load(table_ptr + b * table_stride + n // BLOCK_SIZE, mask=inside, other=0)
            at = block.to(tl.int64) * s_block + (n % BLOCK_SIZE) * s_token + kvh * D
            k = tl.load(k_ptr + at[:, None] + d[None, :], mask=inside[:, None], other=0.0)
            v = tl.load(v_ptr + at[:, None] + d[None, :], mask=inside[:, None], other=0.0)
            if FP8:
                k = (k.to(tl.float32) * k_scale).to(q.dtype)
                v = (v.to(tl.float32) * v_scale).to(q.dtype)
            s = tl.dot(q, tl.trans(k)) * scale  # (GROUP_PAD, TILE), float32
            s = tl.where(inside[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            shrink = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            total = total * shrink + tl.sum(p, 1)
            acc = acc * shrink[:, None] + tl.dot(p.to(q.dtype), v)
            m = m_new
        out = acc / total[:, None]
        tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=live)

    return read_sum, decode


def stream_read(n_bytes: int, device: str, config: tuple[int, int, int]) -> Kernel:
    """Sum ``n_bytes`` of float32 ones with the Triton read kernel at ``config``
    (elements per step, steps per program, warps): ``N`` bytes moved, read only.

    Reference: the element count (the sum of ones), exact in each float32 partial.
    """
    import torch

    read_sum, _ = _kernels()
    block, iters, warps = config
    elements = max(1, n_bytes // 4)
    where = resolve_device(device)
    x = torch.ones(elements, dtype=torch.float32, device=where)
    programs = -(-elements // (block * iters))
    partial = torch.empty(programs, dtype=torch.float32, device=where)

    def fn() -> object:
        read_sum[(programs,)](x, partial, elements, BLOCK=block, ITERS=iters, num_warps=warps)
        return partial

    return Kernel(
        "read-triton", fn, elements * 4, elements,
        f"Triton streaming read of {elements * 4:,} bytes of float32 ({block} elements x "
        f"{iters} steps per program, {warps} warps)",
        reference=lambda: _partials_of_ones(elements, block * iters, where), rtol=1e-6,
    )


def _partials_of_ones(elements: int, per_program: int, where: Any) -> Any:
    """What each program of the read kernel must return on a buffer of ones: its count."""
    import torch

    counts = torch.full((-(-elements // per_program),), float(per_program), device=where)
    counts[-1] = elements - per_program * (counts.numel() - 1)
    return counts


def paged_decode(
    batch: int,
    context_tokens: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: str,
    block_size: int | None,
    device: str,
    query_dtype: str = "bf16",
) -> Kernel:
    """One decode step over a KV cache of ``context_tokens`` per sequence, read in place
    by the Triton kernel through a block table of ``block_size``-token blocks drawn at
    random from the pool (``block_size=None``: one block per sequence, a contiguous cache).

    ``dtype`` is the cache's: ``"bf16"`` or ``"fp8"`` (e4m3, per-tensor scales,
    queries and output in ``query_dtype``). Bytes: the cache once at its own
    width, q and the output at theirs, the block table (int32). Reference: the dequantised
    cache, contiguous, in float32.
    """
    import torch

    _, decode = _kernels()
    size = context_tokens if block_size is None else block_size
    if context_tokens % size:
        raise ValueError(
            f"context_tokens ({context_tokens}) must be a multiple of "
            f"block_size ({size}) for whole blocks"
        )
    if heads % kv_heads or heads // kv_heads > _GROUP_PAD:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads}), at "
                         f"most {_GROUP_PAD} query heads per KV head")
    fp8 = dtype.startswith("fp8")
    kind = torch_dtype(query_dtype if fp8 else dtype)
    where = resolve_device(device)
    per_seq = context_tokens // size
    blocks = batch * per_seq
    k32 = torch.randn(blocks, size, kv_heads, head_dim, device=where)
    v32 = torch.randn_like(k32)  # (num_blocks, B_s, H_kv, d)
    if fp8:
        k_scale, v_scale = float(k32.abs().max()) / 448, float(v32.abs().max()) / 448
        k_pool = (k32 / k_scale).to(torch.float8_e4m3fn)
        v_pool = (v32 / v_scale).to(torch.float8_e4m3fn)
    else:
        k_scale = v_scale = 1.0
        k_pool, v_pool = k32.to(kind), v32.to(kind)
    del k32, v32
    order = torch.randperm(blocks, device=where) if block_size else torch.arange(blocks)
    table = order.to(device=where, dtype=torch.int32).view(batch, per_seq)  # (B, blocks)
    q = torch.randn(batch, heads, head_dim, dtype=kind, device=where)  # (B, H, d)
    out = torch.empty_like(q)
    group = heads // kv_heads

    def fn() -> object:
        decode[(batch, kv_heads)](
            q, k_pool, v_pool, table, out,
            head_dim**-0.5, k_scale, v_scale, table.stride(0),
            k_pool.stride(0), k_pool.stride(1), CONTEXT=context_tokens,
            H_KV=kv_heads, GROUP=group, GROUP_PAD=_GROUP_PAD, D=head_dim,
            BLOCK_SIZE=size, TILE=_TILE, FP8=fp8, num_warps=4,
        )
        return out.view(batch, heads, 1, head_dim)

    def reference() -> object:
        logical_k = (k_pool[table.long()].float() * k_scale).view(
            batch, context_tokens, kv_heads, head_dim).transpose(1, 2)
        logical_v = (v_pool[table.long()].float() * v_scale).view(
            batch, context_tokens, kv_heads, head_dim).transpose(1, 2)
        return attention_reference(q.view(batch, heads, 1, head_dim), logical_k, logical_v)

    element = 1 if fp8 else int(kind.itemsize)
    moved = (
        roofline.decode_kernel_bytes(batch, heads, kv_heads, context_tokens, head_dim, element)
        - 2 * batch * heads * head_dim * element  # q and the output: not the cache's width
        + 2 * batch * heads * head_dim * int(kind.itemsize)
        + table.numel() * 4
    )
    flops = roofline.decode_kernel_flops(batch, heads, context_tokens, head_dim)
    layout = "contiguous" if block_size is None else f"blocks of {block_size}"
    text = (
        f"decode attention (Triton, block table read in place, {layout}): batch {batch}, "
        f"{context_tokens:,} cached tokens, {heads} heads / {kv_heads} KV heads of {head_dim}, "
        f"{f'fp8 e4m3 cache, {query_dtype} queries' if fp8 else dtype}"
    )
    # The reference dequantises the same fp8 values: only the queries' rounding is left.
    atol, rtol = tolerance(query_dtype if fp8 else dtype)
    return Kernel("paged-decode-attention-triton", fn, moved, flops, text,
                  reference=reference, atol=atol, rtol=rtol)
