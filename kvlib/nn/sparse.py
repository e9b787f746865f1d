"""Top-k sparse attention with a lightning indexer (DeepSeek Sparse Attention, DeepSeek-V3.2).

A small indexer scores every cached token for each query, and attention then
reads only the ``top_k`` best-scored tokens (2,048 in DeepSeek-V3.2). The score of
cached token ``t`` for query ``s`` is

    I[s, t] = sum_j  w[s, j] * ReLU(q[s, j] . k[t])

over ``H_I`` indexer heads ``j`` (64 of width ``d_I`` = 128), with one key ``k[t]``
per token shared by all heads: the indexer's own small cache. The module names
and scalings are those of transformers' ``DeepseekV32Indexer`` (``wq_b``, ``wk``,
``k_norm``, ``weights_proj``; ``d_I ** -0.5`` on the logits, ``H_I ** -0.5`` on the
weights), which ``tests/unit/test_nn_sparse.py`` uses as the oracle.

Attention over the selected tokens is MQA over shared rows, the absorbed MLA
path: ``keys`` is the latent (``d_c + d_r``) and ``values`` its first ``d_c``
elements. Selecting every token gives dense attention bit for bit. The indexer
narrows what attention reads, not what the cache holds: every token's latent
and indexer key stay cached (:func:`kvlib.mla.latent_read_cost` counts both).
"""

from __future__ import annotations

import torch
from torch import nn

from kvlib._validate import require_int
from kvlib.nn.mla import rotate_half_split

__all__ = ["LightningIndexer", "attend_dense", "attend_selected", "select_top_k"]


class LightningIndexer(nn.Module):
    """Scores cached tokens for each query with ``num_heads`` small ReLU heads."""

    def __init__(
        self,
        hidden_size: int,
        query_input_size: int,
        num_heads: int,
        head_dim: int,
        rope_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if rope_dim % 2 or not 0 < rope_dim <= head_dim:
            raise ValueError(
                f"rope_dim must be even and at most head_dim ({head_dim}), got {rope_dim}"
            )
        self.num_heads, self.head_dim, self.rope_dim = num_heads, head_dim, rope_dim
        # Queries come from MLA's compressed query (q_lora_rank wide), keys from the hidden state.
        self.wq_b = nn.Linear(query_input_size, num_heads * head_dim, bias=False, dtype=dtype)
        self.wk = nn.Linear(hidden_size, head_dim, bias=False, dtype=dtype)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6, dtype=dtype)
        self.weights_proj = nn.Linear(hidden_size, num_heads, bias=False, dtype=dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rotated, rest = torch.split(x, [self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
        return torch.cat([rotate_half_split(rotated, cos, sin), rest], dim=-1)

    def keys(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The indexer key each token caches: ``(B, T, d_I)`` from ``hidden`` ``(B, T, D)``.

        ``cos``/``sin`` are ``(T, rope_dim / 2)`` for the tokens' positions.
        """
        return self._rope(self.k_norm(self.wk(hidden)), cos, sin)

    def scores(
        self,
        hidden: torch.Tensor,
        query_input: torch.Tensor,
        keys: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """``I[b, s, t]`` in fp32, ``(B, S, T)``, for queries ``(B, S, D)`` against ``keys``."""
        batch, new = hidden.shape[:2]
        q = self.wq_b(query_input).view(batch, new, self.num_heads, self.head_dim)
        q = self._rope(q.transpose(1, 2), cos, sin)  # (B, H_I, S, d_I): RoPE over positions S
        logits = torch.einsum("bjsd,btd->bjst", q.float(), keys.float()) * self.head_dim**-0.5
        weights = self.weights_proj(hidden).float() * self.num_heads**-0.5  # (B, S, H_I)
        return torch.einsum("bsj,bjst->bst", weights, logits.relu())


def select_top_k(
    scores: torch.Tensor, top_k: int, query_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``min(top_k, T)`` best-scored tokens per query, in cache order, and which are visible.

    ``scores`` ``(B, S, T)``; query ``s`` sits at ``query_positions[s]`` and may only
    see tokens at or before it. Returns ``indices`` ``(B, S, k)`` sorted ascending and
    ``valid`` ``(B, S, k)``: False where a query has fewer than ``k`` visible tokens
    and the pick is a masked one.
    """
    require_int(top_k, "top_k", 1)
    tokens = scores.shape[-1]
    future = torch.arange(tokens, device=scores.device)[None, :] > query_positions[:, None]
    masked = scores.masked_fill(future, float("-inf"))  # (B, S, T)
    picked = masked.topk(min(top_k, tokens), dim=-1).indices
    indices = picked.sort(dim=-1).values  # cache order: with k = T, exactly 0 .. T-1
    return indices, indices <= query_positions[None, :, None]


def _attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention of ``q`` ``(B, H, S, d_k)`` over per-query rows ``(B, S, N, d)``."""
    scores = torch.einsum("bhsd,bsnd->bhsn", q, keys) * scale  # (B, H, S, N)
    scores = scores.masked_fill(~valid[:, None], float("-inf"))
    probs = torch.softmax(
        scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)
    ).to(values.dtype)
    return torch.einsum("bhsn,bsnv->bhsv", probs, values)  # (B, H, S, d_v)


def attend_selected(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention over the selected rows only: reads ``k`` of the ``T`` cached rows per query.

    ``q`` ``(B, H, S, d_k)``; ``keys`` ``(B, T, d_k)`` and ``values`` ``(B, T, d_v)``
    shared by all heads; ``indices``/``valid`` from :func:`select_top_k`.
    """
    batch, new, chosen = indices.shape
    flat = indices.reshape(batch, new * chosen, 1)
    rows_k = keys.gather(1, flat.expand(-1, -1, keys.shape[-1])).view(batch, new, chosen, -1)
    rows_v = values.gather(1, flat.expand(-1, -1, values.shape[-1])).view(batch, new, chosen, -1)
    return _attend(q, rows_k, rows_v, valid, scale)


def attend_dense(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    query_positions: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Dense causal attention (``keys`` ``(B, T, d_k)``, values ``(B, T, d_v)``)."""
    batch, tokens = keys.shape[:2]
    new = q.shape[2]
    valid = torch.arange(tokens, device=q.device)[None, :] <= query_positions[:, None]  # (S, T)
    # Every query's rows laid out as the selected path lays them out (a copy per query:
    # this is the reference path), so the two compute with the same kernels.
    rows_k = keys[:, None].expand(batch, new, tokens, keys.shape[-1]).contiguous()
    rows_v = values[:, None].expand(batch, new, tokens, values.shape[-1]).contiguous()
    return _attend(q, rows_k, rows_v, valid[None].expand(batch, -1, -1), scale)
