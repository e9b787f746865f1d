"""The base of every cache spec: what one layer caches, and the questions each kind answers.

See :mod:`kvlib.specs` for the kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from fractions import Fraction
from typing import ClassVar

from kvlib._validate import cdiv, require_int
from kvlib.dtypes import require_dtype

__all__ = ["CacheSpec", "causal_pairs"]


def causal_pairs(tokens: int, cap: int | None = None) -> int:
    """(query, key) pairs a causal layer scores over ``T`` tokens when query ``t``
    (1-based) sees ``min(t, cap)`` keys: ``T (T + 1) / 2`` uncapped, else
    ``cap (cap + 1) / 2 + (T - cap) cap``. The one place the sum is written."""
    t = require_int(tokens, "tokens")
    if cap is None or cap >= t:
        return t * (t + 1) // 2
    return cap * (cap + 1) // 2 + (t - cap) * cap


class CacheSpec(ABC):
    """The cache of one layer. Subclasses are frozen dataclasses."""

    kind: ClassVar[str]

    @abstractmethod
    def bytes_per_token(self, dtype: str) -> int:
        """Bytes one more token adds to this layer while it still grows."""

    @property
    def cap_tokens(self) -> int | None:
        """Most tokens the layer keeps, or None when it keeps every token."""
        return None

    @property
    def kv_heads(self) -> int | None:
        """KV heads tensor parallelism must split or replicate; None if it has none."""
        return None

    def tokens_held(self, context_tokens: int) -> int:
        """Tokens kept of a sequence of ``context_tokens``: ``min(T, cap)``."""
        require_int(context_tokens, "context_tokens")
        cap = self.cap_tokens
        return context_tokens if cap is None else min(context_tokens, cap)

    def fixed_bytes(self, dtype: str) -> int:
        """Bytes held per sequence whatever its length (0 for attention caches)."""
        require_dtype(dtype)
        return 0

    def bytes_for_context(self, context_tokens: int, dtype: str) -> int:
        """``tokens_held(T) x bytes_per_token + fixed_bytes`` (the fixed part once T > 0)."""
        grown = self.tokens_held(context_tokens) * self.bytes_per_token(dtype)
        return grown + (self.fixed_bytes(dtype) if context_tokens else 0)

    def page_bytes(self, block_size: int, dtype: str) -> int:
        """vLLM's page for ``block_size`` tokens: ``block_size x bytes_per_token``."""
        require_int(block_size, "block_size", 1)
        return block_size * self.bytes_per_token(dtype)

    def tp_share(self, tp: int) -> Fraction:
        """Fraction of this layer's cache on each of ``tp`` GPUs (whole by default)."""
        return Fraction(1)

    def decompressed(self) -> CacheSpec:
        """The same layer with any compressed cache expanded (only MLA differs)."""
        return self

    def layout_note(self, dtype: str) -> str | None:
        """What this layer's figures assume where engines differ, or None."""
        return None

    def attention_pairs(self, prompt_tokens: int) -> int:
        """(query, key) pairs causal attention scores over a prompt of ``T`` tokens.

        Query ``i`` (1-based) sees ``i`` keys: ``T (T + 1) / 2`` in all; in a
        window of ``W`` keys (itself and the ``W - 1`` the cache keeps) ``min(i, W)``.
        """
        t = require_int(prompt_tokens, "prompt_tokens")
        return causal_pairs(t, None if self.cap_tokens is None else self.cap_tokens + 1)

    def attention_flops_per_pair(self, num_heads: int, head_dim: int) -> int:
        """FLOPs of one (query, key) pair over all heads: ``H x 2 (d_k + d_v)`` (QK^T, AV)."""
        return num_heads * 2 * (2 * head_dim)

    def decode_flops_per_key(self, num_heads: int, head_dim: int) -> int:
        """FLOPs one decode query spends on one cached key, over all heads."""
        return self.attention_flops_per_pair(num_heads, head_dim)

    def held_blocks(self, tokens: int, block_size: int) -> int:
        """Blocks of ``block_size`` a paged engine holds for a sequence of ``tokens``:
        ``cdiv(T, B)`` when the layer keeps every token."""
        require_int(block_size, "block_size", 1)
        return cdiv(require_int(tokens, "tokens"), block_size)

    def vllm_blocks_per_request(
        self, max_model_len: int, block_size: int, max_num_batched_tokens: int
    ) -> int:
        """Blocks vLLM budgets one request of ``max_model_len`` tokens in this layer
        (``max_memory_usage_bytes / page_size_bytes``): ``cdiv(max_model_len, B)``."""
        return self.held_blocks(max_model_len, block_size)

    def vllm_page_type(self) -> tuple[str, int | None] | None:
        """vLLM's spec type for grouping layers, or None when the layer has no pages."""
        return ("full", None)
