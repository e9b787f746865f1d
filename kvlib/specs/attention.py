"""Attention caches with heads: full, sliding-window and chunked-local layers."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from kvlib._validate import cdiv, require_int
from kvlib.dtypes import bytes_for
from kvlib.specs.base import CacheSpec, causal_pairs

__all__ = [
    "VLLM_PER_TOKEN_HEAD_DTYPES",
    "VLLM_SCALED_KV_DTYPES",
    "ChunkedLocal",
    "FullAttention",
    "SlidingWindow",
    "vllm_group_spec",
]

# vLLM's --kv-cache-dtype values whose pages carry their own scales
# (KVQuantMode in vllm/v1/kv_cache_interface.py): one float32 scale per token and
# KV head, or nvfp4's packed fp4 with an fp8 scale per 16 values.
VLLM_PER_TOKEN_HEAD_DTYPES = ("int8_per_token_head", "fp8_per_token_head")
VLLM_SCALED_KV_DTYPES = (*VLLM_PER_TOKEN_HEAD_DTYPES, "nvfp4")


@dataclass(frozen=True)
class _Heads(CacheSpec):
    """Keys and values of ``num_kv_heads`` heads of ``head_dim`` each, per token."""

    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        require_int(self.num_kv_heads, "num_kv_heads", 1)
        require_int(self.head_dim, "head_dim", 1)

    def bytes_per_token(self, dtype: str) -> int:
        """``2 x H_kv x d x b``: a key and a value per KV head (AttentionSpec in vLLM)."""
        return bytes_for(2 * self.num_kv_heads * self.head_dim, dtype)

    def page_bytes(self, block_size: int, dtype: str) -> int:
        """``2 x block_size x H_kv x d x b`` (vLLM ``AttentionSpec.real_page_size_bytes``)."""
        require_int(block_size, "block_size", 1)
        return bytes_for(2 * block_size * self.num_kv_heads * self.head_dim, dtype)

    def vllm_scaled_page_bytes(self, block_size: int, kv_cache_dtype: str) -> int:
        """A page of vLLM's scaled KV cache dtypes (``vllm/v1/kv_cache_interface.py``):

        - ``int8_per_token_head``, ``fp8_per_token_head``: one byte a value plus a
          float32 scale per token, per KV head, for keys and for values:
          ``2 x B x H_kv x d + 2 x B x H_kv x 4`` (``AttentionSpec.page_size_bytes``);
          +3.1% over plain fp8 at ``d = 128``.
        - ``nvfp4``: per head ``d // 2`` bytes of packed fp4 plus ``d // 16`` fp8 block
          scales, for keys and values: ``B x H_kv x 2 (d // 2 + d // 16)``
          (``FullAttentionSpec.real_page_size_bytes``): 4.5 bits a value.
        """
        require_int(block_size, "block_size", 1)
        tokens_heads = block_size * self.num_kv_heads
        if kv_cache_dtype in VLLM_PER_TOKEN_HEAD_DTYPES:
            scale_bytes = 4  # float32: get_dtype_size(torch.float32)
            return 2 * tokens_heads * self.head_dim + 2 * tokens_heads * scale_bytes
        if kv_cache_dtype == "nvfp4":
            return tokens_heads * 2 * (self.head_dim // 2 + self.head_dim // 16)
        raise ValueError(
            f"kv_cache_dtype must be one of {', '.join(VLLM_SCALED_KV_DTYPES)}, got "
            f"{kv_cache_dtype!r} (plain dtypes: page_bytes)"
        )

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads

    def tp_share(self, tp: int) -> Fraction:
        """``max(1, H_kv / tp) / H_kv``: heads split, one replicated per GPU past ``H_kv``."""
        return Fraction(max(1, self.num_kv_heads // tp), self.num_kv_heads)


@dataclass(frozen=True)
class FullAttention(_Heads):
    """Standard (MHA/GQA/MQA) attention: every token's key and value."""

    kind: ClassVar[str] = "full"

    @classmethod
    def vllm_group(cls, span_tokens: int | None) -> FullAttention:
        """One head standing for vLLM's group of full-attention (and MLA) layers: the
        group's block formulas are this layer's. A full group has no window."""
        return cls(1, 1)


@dataclass(frozen=True)
class SlidingWindow(_Heads):
    """A window of ``window`` tokens: the cache keeps the last ``window - 1``.

    The next token attends to itself and the ``W - 1`` before it, so older
    keys are dropped (transformers ``DynamicSlidingWindowLayer`` slices
    ``[-sliding_window + 1:]``).
    """

    window: int
    kind: ClassVar[str] = "sliding"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int(self.window, "window", 2)

    @property
    def cap_tokens(self) -> int:
        return self.window - 1

    def held_blocks(self, tokens: int, block_size: int) -> int:
        """The ``W - 1`` kept tokens straddle at most ``cdiv(W - 1, B) + 1`` blocks; vLLM
        frees the rest (``SlidingWindowManager.remove_skipped_blocks``)."""
        return min(super().held_blocks(tokens, block_size), cdiv(self.window - 1, block_size) + 1)

    def vllm_blocks_per_request(
        self, max_model_len: int, block_size: int, max_num_batched_tokens: int
    ) -> int:
        """``cdiv(min(W - 1 + batched, max_model_len), B) + 1`` (vLLM ``SlidingWindowSpec``:
        +1 because the window may start mid-block)."""
        tokens = min(self.window - 1 + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, block_size) + 1

    def vllm_page_type(self) -> tuple[str, int | None]:
        return ("sliding", self.window)

    @classmethod
    def vllm_group(cls, span_tokens: int | None) -> SlidingWindow:
        """One head standing for vLLM's group of sliding layers of window ``W``."""
        if span_tokens is None:
            raise ValueError("a sliding-window group needs its window W as span_tokens")
        return cls(1, 1, span_tokens)

    def layout_note(self, dtype: str) -> str:
        return (
            "windowed layers hold min(T, W - 1) tokens (transformers); a paged engine "
            "reserves whole blocks (vLLM budgets cdiv(W - 1 + batched tokens, block) + 1 "
            "blocks a sliding layer)"
        )


@dataclass(frozen=True)
class ChunkedLocal(_Heads):
    """Llama 4's chunked attention: transformers caches a chunk like a window of ``chunk``."""

    chunk: int
    kind: ClassVar[str] = "chunked"

    def __post_init__(self) -> None:
        super().__post_init__()
        require_int(self.chunk, "chunk", 2)

    @property
    def cap_tokens(self) -> int:
        return self.chunk - 1

    def attention_pairs(self, prompt_tokens: int) -> int:
        """Each query sees only its own chunk's earlier keys: whole chunks of ``C``
        contribute ``C (C + 1) / 2`` each, the last partial one ``r (r + 1) / 2``."""
        full, rest = divmod(require_int(prompt_tokens, "prompt_tokens"), self.chunk)
        return full * causal_pairs(self.chunk) + causal_pairs(rest)

    def held_blocks(self, tokens: int, block_size: int) -> int:
        """Only the current chunk's blocks: at most ``cdiv(C, B)``."""
        return min(super().held_blocks(tokens, block_size), cdiv(self.chunk, block_size))

    def vllm_blocks_per_request(
        self, max_model_len: int, block_size: int, max_num_batched_tokens: int
    ) -> int:
        """``cdiv(min(C + batched, max_model_len), B)`` (vLLM ``ChunkedLocalAttentionSpec``)."""
        tokens = min(self.chunk + max_num_batched_tokens, max_model_len)
        return cdiv(tokens, block_size)

    def vllm_page_type(self) -> tuple[str, int | None]:
        return ("chunked", self.chunk)

    @classmethod
    def vllm_group(cls, span_tokens: int | None) -> ChunkedLocal:
        """One head standing for vLLM's group of chunked-local layers of chunk ``C``."""
        if span_tokens is None:
            raise ValueError("a chunked-local group needs its chunk as span_tokens")
        return cls(1, 1, span_tokens)


_VLLM_GROUPS: dict[str, type[FullAttention] | type[SlidingWindow] | type[ChunkedLocal]] = {
    spec.kind: spec for spec in (FullAttention, SlidingWindow, ChunkedLocal)
}


def vllm_group_spec(kind: str, span_tokens: int | None) -> CacheSpec:
    """The inverse of ``vllm_page_type()``: a one-head layer of that page type, whose
    block formulas (``held_blocks``, ``vllm_blocks_per_request``) are its group's."""
    if kind not in _VLLM_GROUPS:
        raise ValueError(f"kind must be one of {', '.join(_VLLM_GROUPS)}, got {kind!r}")
    return _VLLM_GROUPS[kind].vllm_group(span_tokens)
