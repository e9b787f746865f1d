"""A small Llama-style decoder with random weights that reads and writes a paged KV cache.

The serving engine (:mod:`kvlib.engine.core`) runs it. The architecture is Llama's
(``LlamaForCausalLM`` in transformers): RMSNorm, grouped-query attention with
rotary position embeddings (rotate-half, ``theta = 10000``), a SwiGLU MLP, an
untied LM head; ``tests/unit/test_nn_decoder.py`` loads the same weights into
transformers' model and checks that both give the same logits. Weights are
seeded, in float64 by default so that batching many sequences together gives
the same greedy tokens as running each alone (a float32 matmul may round a
row differently when the batch changes shape).

A batch is a list of sequences, each bringing its new tokens (a whole prompt
in prefill, one token in decode) and the cache slots of all its tokens. The
matrix products run once over all new tokens of the batch (``N = sum n_i``
rows), and so does the write of their keys and values into the cache. Attention
reads each sequence's own cached keys and values: the sequences with one new token
(decodes) in one batched product, their keys gathered into ``(B, T_max)`` with the
slots past a sequence's length masked out; a sequence with several new tokens (a
prompt or a chunk of one) on its own, in blocks of queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kvlib.config import ModelConfig
from kvlib.nn.mla import rope_angles, rotate_half_split
from kvlib.specs import FullAttention

__all__ = ["PagedKV", "SeqInput", "TinyDecoder", "tiny_config"]

ROPE_THETA = 10_000.0
RMS_EPS = 1e-5
QUERY_BLOCK = 256  # queries of a long prompt attended at a time (:func:`_query_blocks`)


def tiny_config(
    layers: int = 4,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 512,
    intermediate: int = 256,
    max_positions: int = 2048,
) -> dict[str, Any]:
    """A Llama ``config.json`` small enough to run a serving workload on a CPU."""
    return {
        "model_type": "llama",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "intermediate_size": intermediate,
        "max_position_embeddings": max_positions,
        "rope_theta": ROPE_THETA,
        "rms_norm_eps": RMS_EPS,
        "tie_word_embeddings": False,
        "_name_or_path": "tiny-llama",
    }


@dataclass(frozen=True)
class SeqInput:
    """One sequence in a forward pass: its new tokens and where its tokens live.

    ``start`` tokens are already cached; the new tokens take positions
    ``start .. start + len(new_tokens) - 1``. ``slots[p]`` is the cache slot of
    position ``p`` (``block_table[p // B] x B + p % B``) for every position up
    to the last new one.
    """

    new_tokens: Sequence[int]
    start: int
    slots: Sequence[int]


class PagedKV:
    """Keys and values of every layer, one row per cache slot: ``(blocks x B, H_kv, d)``."""

    def __init__(
        self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype
    ) -> None:
        slots = num_blocks * block_size
        shape = (slots, cfg.num_key_value_heads, cfg.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.num_hidden_layers)]

    @property
    def nbytes(self) -> int:
        """Bytes the cache tensors hold."""
        return sum(t.nbytes for t in self.keys + self.values)


@dataclass(frozen=True)
class _Block:
    """Queries ``first .. end - 1`` of a sequence's new tokens and the keys they read:
    cache rows ``0 .. seen - 1``; ``mask`` says which of those each query sees (None: all)."""

    first: int
    end: int
    seen: int
    mask: torch.Tensor | None


@dataclass(frozen=True)
class _Rows:
    """One sequence's part of a forward pass, the same in every layer: its rows of the
    batch, the slots attention reads (all of its tokens), and its queries in blocks
    (:data:`QUERY_BLOCK`)."""

    first: int
    count: int
    read: torch.Tensor
    blocks: tuple[_Block, ...]


@dataclass(frozen=True)
class _Decodes:
    """The sequences of a pass with one new token each, attended together: their rows of
    the batch ``(B,)``, the slots of each one's tokens ``(B, T_max)`` (a shorter sequence's
    row padded with its own first slot), and ``padded``, ``(B, 1, 1, T_max)``, true
    where a slot is padding (None when every sequence has ``T_max`` tokens)."""

    rows: torch.Tensor
    read: torch.Tensor
    padded: torch.Tensor | None


@dataclass(frozen=True)
class _Pass:
    """What every layer of one forward pass shares: the rotary angles' cosines and sines
    at each new token's position, ``(N, 1, d/2)``, the cache slot of each new token
    ``(N,)``, the sequences with several new tokens (:class:`_Rows`) and those with one
    (:class:`_Decodes`). Made once per pass, not once per layer."""

    cos: torch.Tensor
    sin: torch.Tensor
    write: torch.Tensor
    rows: tuple[_Rows, ...]
    decodes: _Decodes | None


def _rotary(positions: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles at ``positions`` (N,) (:func:`rope_angles`, in
    float64), shaped ``(N, 1, d/2)`` to broadcast over the heads."""
    cos, sin = rope_angles(positions, d, ROPE_THETA, dtype=torch.float64)
    return cos[:, None, :], sin[:, None, :]


def _query_blocks(start: int, new: int) -> tuple[_Block, ...]:
    """A sequence's ``new`` queries after ``start`` cached tokens, in blocks of at most
    :data:`QUERY_BLOCK`. Query ``j`` sits at position ``start + j`` and sees keys
    ``0 .. start + j``, so a block ending at query ``e`` reads only the first ``start + e``
    keys: a long prompt's causal attention skips most of the keys its early queries never
    see. A single new token (a decode) sees every key and needs no mask."""
    blocks = []
    for first in range(0, new, QUERY_BLOCK):
        end = min(new, first + QUERY_BLOCK)
        seen = start + end
        mask = None if end - first == 1 else torch.ones(end - first, seen, dtype=torch.bool).tril(
            diagonal=start + first)
        blocks.append(_Block(first, end, seen, mask))
    return tuple(blocks)


def _sequence_rows(batch: Sequence[SeqInput]) -> tuple[tuple[_Rows, ...], _Decodes | None]:
    """The sequences with several new tokens, each with its rows, and those with one."""
    rows, first = [], 0
    decode_rows: list[int] = []
    decode_slots: list[Sequence[int]] = []
    for seq in batch:
        new, total = len(seq.new_tokens), seq.start + len(seq.new_tokens)
        if new == 1:
            decode_rows.append(first)
            decode_slots.append(seq.slots[:total])
        else:
            rows.append(_Rows(first, new, torch.tensor(seq.slots[:total]),
                              _query_blocks(seq.start, new)))
        first += new
    return tuple(rows), _decodes(decode_rows, decode_slots)


def _decodes(rows: list[int], slots: list[Sequence[int]]) -> _Decodes | None:
    if not rows:
        return None
    longest = max(len(s) for s in slots)
    # Padding reads a slot the sequence owns (its first): a real row, masked out.
    read = torch.tensor([[*s, *[s[0]] * (longest - len(s))] for s in slots])
    lengths = torch.tensor([len(s) for s in slots])
    padded = None
    if int(lengths.min()) < longest:
        padded = (torch.arange(longest) >= lengths[:, None])[:, None, None, :]
    return _Decodes(torch.tensor(rows), read, padded)


def _attend_decodes(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    decodes: _Decodes, kv_heads: int) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` for B sequences of one new token each, together:
    ``q`` is ``(B, H, d)``, ``keys`` and ``values`` the layer's cache ``(slots, H_kv, d)``;
    returns ``(B, H, d)``. Query head h reads KV head h // G, as in :func:`_attend`; a
    padded slot scores ``-inf`` and so weighs exactly 0."""
    b, heads, d = q.shape
    # One query a sequence: the G query heads of a KV head are the rows of its product.
    q = q.view(b, kv_heads, heads // kv_heads, d)
    k = keys[decodes.read].permute(0, 2, 1, 3)  # (B, H_kv, T_max, d)
    v = values[decodes.read].permute(0, 2, 1, 3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * d**-0.5  # (B, H_kv, G, T_max)
    if decodes.padded is not None:
        scores.masked_fill_(decodes.padded, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).reshape(b, heads, d)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            blocks: Sequence[_Block]) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + causal mask) v`` for one sequence, with grouped-query
    heads: ``q`` is ``(H_kv, G, n, d)`` (the ``G = H / H_kv`` query heads that share each KV
    head), ``k`` and ``v`` are ``(H_kv, T, d)``; returns ``(H_kv, G, n, d)``. The G query
    heads of a KV head read its keys as one batch, with no copy of the keys per head."""
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5
    for block in blocks:
        keys = k[:, None, : block.seen]  # (H_kv, 1, seen, d): broadcast over the G heads
        scores = torch.matmul(q[:, :, block.first : block.end], keys.transpose(-1, -2)) * scale
        if block.mask is not None:
            scores.masked_fill_(~block.mask, float("-inf"))
        out[:, :, block.first : block.end] = torch.matmul(
            torch.softmax(scores, dim=-1), v[:, None, : block.seen])
    return out


class _RMSNorm(nn.Module):
    def __init__(self, size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + RMS_EPS))


class _Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False, dtype=dtype)
        width = cfg.intermediate_size
        self.gate_proj = nn.Linear(h, width, bias=False, dtype=dtype)
        self.up_proj = nn.Linear(h, width, bias=False, dtype=dtype)
        self.down_proj = nn.Linear(width, h, bias=False, dtype=dtype)
        self.input_layernorm = _RMSNorm(h, dtype)
        self.post_attention_layernorm = _RMSNorm(h, dtype)

    def forward(
        self, x: torch.Tensor, shared: _Pass, keys: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        n = x.shape[0]
        normed = self.input_layernorm(x)
        q = self.q_proj(normed).view(n, self.heads, self.head_dim)  # (N, H, d)
        q = rotate_half_split(q, shared.cos, shared.sin)
        k = self.k_proj(normed).view(n, self.kv_heads, self.head_dim)
        k = rotate_half_split(k, shared.cos, shared.sin)
        v = self.v_proj(normed).view(n, self.kv_heads, self.head_dim)  # (N, H_kv, d)
        keys[shared.write], values[shared.write] = k, v
        out = torch.empty_like(q)
        groups = self.heads // self.kv_heads
        if shared.decodes is not None:
            out[shared.decodes.rows] = _attend_decodes(
                q[shared.decodes.rows], keys, values, shared.decodes, self.kv_heads)
        for seq in shared.rows:
            end = seq.first + seq.count
            # (n, H, d) -> (H_kv, G, n, d): query head h reads KV head h // G, as in
            # transformers' repeat_kv.
            seq_q = q[seq.first : end].view(seq.count, self.kv_heads, groups, self.head_dim)
            attn = _attend(seq_q.permute(1, 2, 0, 3), keys[seq.read].transpose(0, 1),
                           values[seq.read].transpose(0, 1), seq.blocks)
            out[seq.first : end] = attn.permute(2, 0, 1, 3).reshape(
                seq.count, self.heads, self.head_dim)
        x = x + self.o_proj(out.reshape(n, -1))
        normed = self.post_attention_layernorm(x)
        gated = nn.functional.silu(self.gate_proj(normed)) * self.up_proj(normed)
        result: torch.Tensor = x + self.down_proj(gated)
        return result


class TinyDecoder(nn.Module):
    """A random-weight Llama-style decoder for a config of full-attention layers."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float64):
        super().__init__()
        if cfg.mla is not None or not all(isinstance(s, FullAttention) for s in cfg.layers):
            raise ValueError(
                f"{cfg.name}: the tiny decoder runs full-attention (Llama-style) layers only"
            )
        if cfg.vocab_size is None:
            raise ValueError(f"{cfg.name}: the tiny decoder needs 'vocab_size'")
        self.cfg, self.dtype = cfg, dtype
        generator = torch.Generator().manual_seed(seed)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(_Layer(cfg, dtype) for _ in range(cfg.num_hidden_layers))
        self.norm = _RMSNorm(cfg.hidden_size, dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "norm" not in name:
                    p.copy_(torch.randn(p.shape, generator=generator, dtype=dtype) * 0.05)
        self.eval()

    @torch.no_grad()
    def forward_batch(self, batch: Sequence[SeqInput], kv: PagedKV) -> torch.Tensor:
        """Write the new tokens' keys and values; return each sequence's last-token logits."""
        tokens = torch.tensor([t for seq in batch for t in seq.new_tokens])
        positions = torch.tensor(
            [seq.start + j for seq in batch for j in range(len(seq.new_tokens))]
        )
        cos, sin = _rotary(positions, self.cfg.head_dim)
        write = torch.tensor([slot for seq in batch
                              for slot in seq.slots[seq.start : seq.start + len(seq.new_tokens)]])
        shared = _Pass(cos, sin, write, *_sequence_rows(batch))
        x = self.embed_tokens(tokens)  # (N, h)
        for layer, keys, values in zip(self.layers, kv.keys, kv.values, strict=True):
            x = layer(x, shared, keys, values)
        ends = torch.tensor([len(seq.new_tokens) for seq in batch]).cumsum(0) - 1
        logits: torch.Tensor = self.lm_head(self.norm(x[ends]))  # (sequences, vocab)
        return logits
