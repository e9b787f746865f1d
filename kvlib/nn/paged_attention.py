"""Decode attention that reads keys and values through a block table.

The cache is a pool of physical blocks, laid out as vLLM's FlashAttention
backend lays out one layer's keys (or values):
``(num_blocks, block_size, num_kv_heads, head_dim)``. A sequence's tokens live
in the blocks its block table lists, in order; token ``p`` of a sequence sits
in block ``table[p // B]`` at offset ``p % B``, i.e. in slot
``table[p // B] * B + p % B`` of the flattened pool (vLLM's ``slot_mapping``).

:func:`paged_decode_attention` gathers each sequence's blocks, masks the
slots past its length and computes softmax attention for one new query per
sequence, with grouped-query attention (``H`` query heads sharing ``H_kv``
key/value heads). It is checked against
``torch.nn.functional.scaled_dot_product_attention`` on the same keys and
values stored contiguously (``tests/unit/test_nn_paged_attention.py``). It is a
reference for correctness, not a fused kernel: the gather copies the keys and
values, which a real kernel avoids by reading the blocks in place (FlashAttention's
``block_table`` argument, which vLLM's v1 engine uses on Hopper; torch's
``PagedAttention`` on ``flex_attention``; vLLM's older ``paged_attention_v1``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["block_tables_tensor", "paged_decode_attention", "write_to_cache"]


def block_tables_tensor(tables: list[list[int]], device: str = "cpu") -> torch.Tensor:
    """Pad ragged block tables into one ``(batch, max_blocks)`` int64 tensor (padding 0).

    The padding is never read: slots past a sequence's length are masked.
    """
    import torch

    width = max((len(t) for t in tables), default=0)
    out = torch.zeros(len(tables), max(width, 1), dtype=torch.long, device=device)
    for i, table in enumerate(tables):
        out[i, : len(table)] = torch.tensor(table, dtype=torch.long)
    return out


def write_to_cache(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slots: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``(n, H_kv, d)`` in ``slots`` ``(n,)`` of the
    ``(num_blocks, B, H_kv, d)`` caches, in place (vLLM's ``reshape_and_cache``)."""
    num_blocks, block_size, heads, dim = key_cache.shape
    for cache, new in ((key_cache, key), (value_cache, value)):
        cache.view(num_blocks * block_size, heads, dim)[slots] = new.to(cache.dtype)


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """One decode step: each sequence's single query attends to its cached tokens.

    Shapes: ``query`` (batch, H, d); ``key_cache``, ``value_cache``
    (num_blocks, B, H_kv, d); ``block_tables`` (batch, max_blocks) int64;
    ``context_lens`` (batch,) int64, each at least 1. ``H`` must be a multiple
    of ``H_kv``. Scores and softmax are computed in float32 whatever the
    cache dtype (as vLLM's kernels accumulate); the result has ``query``'s
    dtype, shape (batch, H, d). ``scale`` defaults to ``1 / sqrt(d)``.
    """
    import torch

    batch, heads, dim = query.shape
    num_blocks, block_size, kv_heads, kv_dim = key_cache.shape
    if kv_dim != dim or value_cache.shape != key_cache.shape:
        raise ValueError(
            f"caches must be (num_blocks, B, H_kv, {dim}) like the query's head dim; "
            f"got keys {tuple(key_cache.shape)} and values {tuple(value_cache.shape)}"
        )
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    if block_tables.shape[0] != batch or context_lens.shape != (batch,):
        raise ValueError("block_tables (batch, max_blocks) and context_lens (batch,) must match")
    max_blocks = block_tables.shape[1]
    if int(context_lens.min()) < 1 or int(context_lens.max()) > max_blocks * block_size:
        raise ValueError("context_lens must be >= 1 and fit in the block tables' blocks")
    scale = 1.0 / math.sqrt(dim) if scale is None else scale

    # Gather each sequence's blocks and lay its slots out in token order, heads first.
    tokens = max_blocks * block_size
    keys = key_cache[block_tables]  # (batch, max_blocks, B, H_kv, d): a copy
    keys = keys.reshape(batch, tokens, kv_heads, dim).transpose(1, 2)  # (batch, H_kv, T, d)
    values = value_cache[block_tables].reshape(batch, tokens, kv_heads, dim).transpose(1, 2)
    keys, values = keys.float().contiguous(), values.float().contiguous()

    # Query head h reads KV head h // group: split H into (H_kv, group).
    q = query.float().reshape(batch, kv_heads, heads // kv_heads, dim)  # (batch, H_kv, G, d)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale  # (batch, H_kv, G, T)
    past_end = torch.arange(tokens, device=query.device)[None, :] >= context_lens[:, None]
    scores = scores.masked_fill(past_end[:, None, None, :], float("-inf"))  # (batch, T) mask
    weights = torch.softmax(scores, dim=-1)  # (batch, H_kv, G, T)
    # Slots past the end may hold stale data, even NaN: 0 x NaN would still be NaN.
    values = values.masked_fill(past_end[:, None, :, None], 0.0)
    out = torch.matmul(weights, values)  # (batch, H_kv, G, d)
    return out.reshape(batch, heads, dim).to(query.dtype)
