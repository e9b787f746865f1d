"""Multi-head Latent Attention caches: the latent, and its decompressed per-head form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

from kvlib._validate import cdiv
from kvlib.dtypes import bytes_for, require_dtype
from kvlib.specs.base import CacheSpec


class _MLAWidths(Protocol):
    """What an MLA layer reads of :class:`kvlib.config.MLAShape` (the one class holding
    the widths; kvlib.config builds its layers from kvlib.specs, so it is not imported)."""

    @property
    def num_heads(self) -> int: ...
    @property
    def kv_lora_rank(self) -> int: ...
    @property
    def qk_rope_head_dim(self) -> int: ...
    @property
    def qk_nope_head_dim(self) -> int: ...
    @property
    def v_head_dim(self) -> int: ...
    @property
    def latent_dim(self) -> int: ...
    @property
    def qk_head_dim(self) -> int: ...

__all__ = [
    "DS_MLA_FP8_BYTES_PER_TOKEN",
    "INDEXER_FP8_SCALE_BLOCK",
    "DecompressedMLA",
    "MLALatent",
    "absorbed_flops_per_key",
    "naive_flops_per_key",
]

# vLLM's "fp8_ds_mla" entry (vllm/v1/kv_cache_interface.py, MLAAttentionSpec:
# ``block_size * 656``; layout in vllm/v1/attention/backends/mla/flashmla_sparse.py):
# 512 fp8 latent values, four fp32 scales (one per 128 values), 64 bf16 RoPE values.
DS_MLA_FP8_BYTES_PER_TOKEN = 512 * 1 + 4 * 4 + 64 * 2
# vLLM's DeepSeek-V3.2 indexer cache stores fp8 keys with one fp32 scale per 128
# values (vllm/model_executor/models/deepseek_v2.py, DeepseekV32IndexerCache:
# ``head_dim + head_dim // quant_block_size * 4``, 132 B for 128-wide keys).
INDEXER_FP8_SCALE_BLOCK = 128


def absorbed_flops_per_key(num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int) -> int:
    """FLOPs one query spends on one cached latent on MLA's absorbed path:
    ``2 H (2 d_c + d_r)``: for each of the ``H`` heads, a dot product with a key of
    ``d_c + d_r`` (the latent and the rotary key) and a value of ``d_c`` weighted into
    the output (``W_UK`` folded into the query and ``W_UV`` into the output, as
    ``vllm/v1/attention/backends/mla/common.py`` runs MQA over the latent; counted
    against :mod:`kvlib.nn.mla` with ``FlopCounterMode``)."""
    return 2 * num_heads * (2 * kv_lora_rank + qk_rope_head_dim)


def naive_flops_per_key(
    num_heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int
) -> int:
    """FLOPs one query spends on one decompressed key and value on MLA's naive path:
    ``2 H (d_n + d_r + d_v)`` (keys of ``d_n + d_r``, values of ``d_v``, each head)."""
    return 2 * num_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)


@dataclass(frozen=True)
class MLALatent(CacheSpec):
    """Multi-head Latent Attention: one latent of ``kv_lora_rank + qk_rope_head_dim``
    elements per token, no factor 2 (DeepSeek-V2 paper, section 2.1; vLLM
    ``MLAAttentionSpec`` with one head of that size), plus the sparse
    indexer's keys of ``indexer_head_dim`` when the model has one (DeepSeek-V3.2).

    At 16 and 32 bits the latent and the indexer keys are in the cache dtype,
    as transformers caches them. At fp8, the layout of vLLM's sparse-MLA
    kernels for indexed models (:data:`DS_MLA_FP8_BYTES_PER_TOKEN` of latent, 132 B of
    indexer key per 128 dims) and plain fp8 (one byte an element, per-tensor scale) otherwise.

    The layer's widths are the model's :class:`kvlib.config.MLAShape` (one class
    holds them); this spec adds only what differs layer to layer, the indexer.
    """

    shape: _MLAWidths  # the model's kvlib.config.MLAShape
    indexer_head_dim: int = 0
    kind: ClassVar[str] = "mla"

    @property
    def latent_dim(self) -> int:
        """Elements cached per token: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.shape.latent_dim

    def bytes_per_token(self, dtype: str) -> int:
        """Latent (+ indexer key) bytes of one token; see the class docstring for fp8."""
        if self.indexer_head_dim and require_dtype(dtype) == "fp8":
            m = self.shape
            if m.kv_lora_rank != 512 or m.qk_rope_head_dim != 64:
                raise ValueError(
                    "vLLM's fp8 sparse-MLA entry is defined for a 512 + 64 latent; this "
                    f"model's is {m.kv_lora_rank} + {m.qk_rope_head_dim}: size it in bf16"
                )
            scales = cdiv(self.indexer_head_dim, INDEXER_FP8_SCALE_BLOCK)
            return DS_MLA_FP8_BYTES_PER_TOKEN + self.indexer_head_dim + 4 * scales
        return bytes_for(self.latent_dim + self.indexer_head_dim, dtype)

    def layout_note(self, dtype: str) -> str | None:
        if not self.indexer_head_dim:
            return None
        if require_dtype(dtype) == "fp8":
            return (
                f"MLA at fp8 as vLLM stores DeepSeek-V3.2: {DS_MLA_FP8_BYTES_PER_TOKEN} B of "
                "latent (512 fp8, 4 fp32 scales, 64 bf16 RoPE) and 132 B of indexer key "
                "(128 fp8, 1 fp32 scale) a token a layer"
            )
        return (
            f"latent and indexer keys in {dtype}, as transformers caches them (vLLM "
            "keeps the indexer keys in fp8 with a scale: 132 B a token a layer)"
        )

    def attention_pairs(self, prompt_tokens: int) -> int:
        if self.indexer_head_dim:
            raise ValueError(
                "kvlib does not count the attention FLOPs of a top-k sparse (indexed) MLA layer"
            )
        return super().attention_pairs(prompt_tokens)

    def attention_flops_per_pair(self, num_heads: int, head_dim: int) -> int:
        """Prefill runs on decompressed heads (vLLM's MLA prefill):
        :func:`naive_flops_per_key` for this layer's own heads (the arguments, which
        size a layer of standard heads, do not apply)."""
        m = self.shape
        return naive_flops_per_key(
            m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
        )

    def decode_flops_per_key(self, num_heads: int, head_dim: int) -> int:
        """Decode runs the absorbed path, queries meeting the latent itself:
        :func:`absorbed_flops_per_key` for this layer's own heads (the arguments do
        not apply)."""
        m = self.shape
        return absorbed_flops_per_key(m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim)

    def decompressed(self) -> DecompressedMLA:
        """Per-head keys (nope + rope) and values for every query head (transformers 4.x)."""
        return DecompressedMLA(
            num_heads=self.shape.num_heads,
            qk_head_dim=self.shape.qk_head_dim,
            v_head_dim=self.shape.v_head_dim,
            extra_dim=self.indexer_head_dim,
        )


@dataclass(frozen=True)
class DecompressedMLA(CacheSpec):
    """An MLA layer whose per-head keys and values are kept decompressed: keys of
    ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim`` and values of ``v_head_dim``
    (the names of :class:`kvlib.config.MLAShape` and of DeepSeek's config)."""

    num_heads: int
    qk_head_dim: int
    v_head_dim: int
    extra_dim: int = 0
    kind: ClassVar[str] = "mla-decompressed"

    def bytes_per_token(self, dtype: str) -> int:
        """``H x (d_qk + d_v) x b`` plus the indexer's keys."""
        per_token = self.num_heads * (self.qk_head_dim + self.v_head_dim) + self.extra_dim
        return bytes_for(per_token, dtype)
