"""What one layer caches: one frozen class per kind of cache.

Every class answers the same questions, so code that sums over layers never
asks which kind a layer is:

- ``bytes_per_token(dtype)``: bytes one more token adds while the layer still
  grows (under its window);
- ``tokens_held(context_tokens)``: tokens the layer keeps of a sequence;
- ``fixed_bytes(dtype)``: bytes that do not grow with the context (a
  linear-attention state), held once a sequence has a token;
- ``bytes_for_context(context_tokens, dtype)``: the two combined;
- ``page_bytes(block_size, dtype)``: the page vLLM allocates for
  ``block_size`` tokens of this layer (``vllm/v1/kv_cache_interface.py``);
- ``tp_share(tp)``: the fraction of the layer's cache each of ``tp``
  tensor-parallel GPUs holds; ``kv_heads``: the heads TP must split evenly.

The oracle for the byte counts is the cache Hugging Face ``transformers``
5.23 allocates (``tests/test_reference*.py``); for pages, vLLM's
``KVCacheSpec.page_size_bytes``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from kvlib.checks import require_int
from kvlib.dtypes import bytes_for, check_dtype

__all__ = [
    "CacheSpec",
    "ChunkedLocal",
    "DecompressedMLA",
    "FullAttention",
    "LinearState",
    "MLALatent",
    "SharedKV",
    "SlidingWindow",
    "DS_MLA_FP8_BYTES_PER_TOKEN",
    "INDEXER_FP8_SCALE_BLOCK",
]

# vLLM's "fp8_ds_mla" entry (vllm/v1/kv_cache_interface.py, MLAAttentionSpec:
# ``block_size * 656``; layout in vllm/v1/attention/backends/mla/flashmla_sparse.py):
# 512 fp8 latent values, four fp32 scales (one per 128 values), 64 bf16 RoPE values.
DS_MLA_FP8_BYTES_PER_TOKEN = 512 * 1 + 4 * 4 + 64 * 2
# vLLM's DeepSeek-V3.2 indexer cache stores fp8 keys with one fp32 scale per 128
# values (vllm/model_executor/models/deepseek_v2.py, DeepseekV32IndexerCache:
# ``head_dim + head_dim // quant_block_size * 4``, 132 B for 128-wide keys).
INDEXER_FP8_SCALE_BLOCK = 128


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
        check_dtype(dtype)
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


@dataclass(frozen=True)
class MLALatent(CacheSpec):
    """Multi-head Latent Attention: one latent of ``kv_lora_rank + qk_rope_head_dim``
    elements per token, no factor 2 (DeepSeek-V2 paper, section 2.1; vLLM
    ``MLAAttentionSpec`` with one head of that size), plus the sparse
    indexer's keys of ``indexer_head_dim`` when the model has one (DeepSeek-V3.2).

    At 16 and 32 bits the latent and the indexer keys are in the cache dtype,
    as transformers caches them. At fp8, the layout of vLLM's sparse-MLA
    kernels for indexed models (656 B of latent, 132 B of indexer key per
    128 dims) and plain fp8 (one byte an element, per-tensor scale) otherwise.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    num_heads: int
    qk_nope_head_dim: int
    v_head_dim: int
    indexer_head_dim: int = 0
    kind: ClassVar[str] = "mla"

    @property
    def latent_dim(self) -> int:
        """Elements cached per token: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def bytes_per_token(self, dtype: str) -> int:
        """Latent (+ indexer key) bytes of one token; see the class docstring for fp8."""
        if self.indexer_head_dim and check_dtype(dtype) == "fp8":
            if self.kv_lora_rank != 512 or self.qk_rope_head_dim != 64:
                raise ValueError(
                    "vLLM's fp8 sparse-MLA entry is defined for a 512 + 64 latent; this "
                    f"model's is {self.kv_lora_rank} + {self.qk_rope_head_dim}: size it in bf16"
                )
            scales = -(-self.indexer_head_dim // INDEXER_FP8_SCALE_BLOCK)
            return DS_MLA_FP8_BYTES_PER_TOKEN + self.indexer_head_dim + 4 * scales
        return bytes_for(self.latent_dim + self.indexer_head_dim, dtype)

    def layout_note(self, dtype: str) -> str | None:
        if not self.indexer_head_dim:
            return None
        if check_dtype(dtype) == "fp8":
            return (
                "MLA at fp8 as vLLM stores DeepSeek-V3.2: 656 B of latent (512 fp8, 4 fp32 "
                "scales, 64 bf16 RoPE) and 132 B of indexer key (128 fp8, 1 fp32 scale) a "
                "token a layer"
            )
        return (
            f"latent and indexer keys in {dtype}, as transformers caches them (vLLM "
            "keeps the indexer keys in fp8 with a scale: 132 B a token a layer)"
        )

    def decompressed(self) -> DecompressedMLA:
        """Per-head keys (nope + rope) and values for every query head (transformers 4.x)."""
        return DecompressedMLA(
            num_heads=self.num_heads,
            key_dim=self.qk_nope_head_dim + self.qk_rope_head_dim,
            value_dim=self.v_head_dim,
            extra_dim=self.indexer_head_dim,
        )


@dataclass(frozen=True)
class DecompressedMLA(CacheSpec):
    """An MLA layer whose per-head keys and values are kept decompressed."""

    num_heads: int
    key_dim: int
    value_dim: int
    extra_dim: int = 0
    kind: ClassVar[str] = "mla-decompressed"

    def bytes_per_token(self, dtype: str) -> int:
        """``H x (d_k + d_v) x b`` plus the indexer's keys."""
        return bytes_for(self.num_heads * (self.key_dim + self.value_dim) + self.extra_dim, dtype)


@dataclass(frozen=True)
class LinearState(CacheSpec):
    """A linear-attention layer: a fixed state whatever the context.

    ``conv_elements`` of short-convolution state in the cache dtype and
    ``recurrent_elements`` of recurrent state kept in fp32 (transformers'
    ``LinearAttentionLayer`` keeps it in fp32 whatever the model dtype).
    One page (vLLM ``MambaSpec``) holds a sequence's whole state.
    """

    conv_elements: int
    recurrent_elements: int
    kind: ClassVar[str] = "linear"

    def bytes_per_token(self, dtype: str) -> int:
        check_dtype(dtype)
        return 0

    def fixed_bytes(self, dtype: str) -> int:
        """``conv x b + recurrent x 4``."""
        return bytes_for(self.conv_elements, dtype) + 4 * self.recurrent_elements

    def page_bytes(self, block_size: int, dtype: str) -> int:
        """The whole state: vLLM gives a linear-attention sequence one page."""
        require_int(block_size, "block_size", 1)
        return self.fixed_bytes(dtype)

    def tp_share(self, tp: int) -> Fraction:
        """The state splits with its heads: ``1 / tp``."""
        return Fraction(1, tp)


@dataclass(frozen=True)
class SharedKV(CacheSpec):
    """A layer that reads an earlier layer's cache (Gemma 3n, Gemma 4): it holds nothing."""

    kind: ClassVar[str] = "shared"

    def bytes_per_token(self, dtype: str) -> int:
        check_dtype(dtype)
        return 0

    def tp_share(self, tp: int) -> Fraction:
        return Fraction(0)
