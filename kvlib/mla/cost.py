"""What one MLA layer computes and reads per decode step, on the naive and the absorbed path.

The two paths are those of vLLM's ``vllm/v1/attention/backends/mla/common.py``:
the "compute friendly" naive path decompresses every cached latent into per-head
keys and values through ``kv_b_proj``; the "data-movement friendly" absorbed path
folds ``W_UK`` into the query and ``W_UV`` into the output and attends in latent
space (MQA with a ``d_c + d_r``-wide key and a ``d_c``-wide value). A sparse
indexer (DeepSeek-V3.2) narrows the absorbed path to the top-k tokens.

FLOPs count a multiply-add as 2 and only matrix products (softmax, norms, RoPE and
the top-k selection are left out), the convention of
``torch.utils.flop_counter.FlopCounterMode``, which ``tests/unit/test_nn_mla.py`` and
``tests/unit/test_nn_sparse.py`` count with on :mod:`kvlib.nn.mla` and
:mod:`kvlib.nn.sparse`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kvlib._validate import require_int
from kvlib.config import IndexerShape, MLAShape
from kvlib.dtypes import DTYPE_BITS, require_dtype
from kvlib.specs import causal_pairs
from kvlib.specs.latent import absorbed_flops_per_key, naive_flops_per_key

__all__ = [
    "LatentReadCost",
    "MLAPath",
    "MLAStepCost",
    "PrefillAttentionFlops",
    "latent_read_cost",
    "mla_step_cost",
    "prefill_path_flops",
]

MLAPath = Literal["naive", "absorbed"]


@dataclass(frozen=True)
class MLAStepCost:
    """Matrix FLOPs and bytes read by one MLA layer for ``query_tokens`` new tokens.

    ``cache_bytes``: the latents read; ``weight_bytes``: the layer's weights;
    ``decompressed_bytes``: the per-head keys and values the naive path forms and then
    reads (written once, read once; counted here as read). 0 for the absorbed path,
    which never forms them.
    """

    path: MLAPath
    context_tokens: int
    query_tokens: int
    projection_flops: int
    kv_up_flops: int
    attention_flops: int
    cache_bytes: int
    weight_bytes: int
    decompressed_bytes: int

    @property
    def flops(self) -> int:
        return self.projection_flops + self.kv_up_flops + self.attention_flops

    @property
    def bytes_read(self) -> int:
        return self.cache_bytes + self.weight_bytes + self.decompressed_bytes


def mla_step_cost(
    shape: MLAShape,
    context_tokens: int,
    path: MLAPath,
    *,
    query_tokens: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
) -> MLAStepCost:
    """Cost of ``query_tokens`` new tokens attending to ``context_tokens`` cached ones.

    ``context_tokens`` counts the cache after the new tokens are appended (S <= T).
    With ``H`` heads, ``d_c`` the rank, ``d_r`` the RoPE width, ``d_n`` and ``d_v``:

    - naive: decompress ``2 T d_c H (d_n + d_v)``; attend ``2 S T H (d_n + d_r + d_v)``;
      write and read back ``T H (d_n + d_r + d_v)`` elements of keys and values;
    - absorbed: fold ``2 S H d_c (d_n + d_v)``; attend ``2 S T H (2 d_c + d_r)``.

    Every query is scored against every cached token (a causal kernel skips about
    half of the S x S block of a prefill; at decode S = 1 it changes nothing).
    """
    if path not in ("naive", "absorbed"):
        raise ValueError(f"path must be 'naive' or 'absorbed', got {path!r}")
    require_int(context_tokens, "context_tokens", 1)
    require_int(query_tokens, "query_tokens", 1)
    if query_tokens > context_tokens:
        raise ValueError(
            f"query_tokens ({query_tokens}) exceeds context_tokens ({context_tokens}): the "
            "context counts the new tokens too"
        )
    kv_bits = DTYPE_BITS[require_dtype(kv_dtype)]
    weight_bits = DTYPE_BITS[require_dtype(weight_dtype)]
    s, t, heads = query_tokens, context_tokens, shape.num_heads
    rank, rope = shape.kv_lora_rank, shape.qk_rope_head_dim
    nope, value = shape.qk_nope_head_dim, shape.v_head_dim
    if path == "naive":
        kv_up = 2 * t * shape.kv_b_params
        attention = s * t * naive_flops_per_key(heads, nope, rope, value)
        decompressed = t * heads * (nope + rope + value)
    else:
        kv_up = 2 * s * shape.kv_b_params
        attention = s * t * absorbed_flops_per_key(heads, rank, rope)
        decompressed = 0
    return MLAStepCost(
        path=path,
        context_tokens=t,
        query_tokens=s,
        projection_flops=2 * s * shape.linear_params,
        kv_up_flops=kv_up,
        attention_flops=attention,
        cache_bytes=math.ceil(t * shape.latent_dim * kv_bits / 8),
        weight_bytes=math.ceil(shape.attention_params * weight_bits / 8),
        decompressed_bytes=math.ceil(decompressed * kv_bits / 8),
    )


@dataclass(frozen=True)
class LatentReadCost:
    """The part of one decode step that grows with the context, per query token per layer.

    The absorbed path attends ``selected_tokens`` latents; with an indexer, every
    cached token's indexer key is scored first. Projections are left out (the same
    with or without the indexer, apart from its small query and weight projections).
    """

    context_tokens: int
    selected_tokens: int
    indexer_flops: int
    indexer_bytes: int
    attention_flops: int
    attention_bytes: int

    @property
    def flops(self) -> int:
        return self.indexer_flops + self.attention_flops

    @property
    def bytes_read(self) -> int:
        return self.indexer_bytes + self.attention_bytes


def latent_read_cost(
    shape: MLAShape,
    context_tokens: int,
    latent_bytes_per_token: int,
    indexer: IndexerShape | None = None,
    indexer_bytes_per_token: int = 0,
) -> LatentReadCost:
    """Dense (``indexer`` None) or top-k sparse absorbed attention for one query token.

    Dense: ``2 H T (2 d_c + d_r)`` FLOPs, ``T`` latents read. Sparse: the indexer
    scores all ``T`` keys, ``2 H_I T (d_I + 1)`` FLOPs (a dot product per head, then
    the weighted sum over heads), reading ``T`` indexer keys; attention then reads
    only ``k = min(top_k, T)`` latents. Bytes per token are per layer, in the cache's
    layout (1,152 at bf16; ``DS_MLA_FP8_BYTES_PER_TOKEN`` + 132 for vLLM's fp8
    DeepSeek-V3.2 cache).
    """
    require_int(context_tokens, "context_tokens", 1)
    require_int(latent_bytes_per_token, "latent_bytes_per_token", 1)
    require_int(indexer_bytes_per_token, "indexer_bytes_per_token")
    per_token_flops = absorbed_flops_per_key(
        shape.num_heads, shape.kv_lora_rank, shape.qk_rope_head_dim
    )
    if indexer is None:
        selected, indexer_flops, indexer_bytes = context_tokens, 0, 0
    else:
        if indexer_bytes_per_token < 1:
            raise ValueError("indexer_bytes_per_token must be given (>= 1) with an indexer")
        selected = min(indexer.top_k, context_tokens)
        indexer_flops = 2 * indexer.num_heads * context_tokens * (indexer.head_dim + 1)
        indexer_bytes = context_tokens * indexer_bytes_per_token
    return LatentReadCost(
        context_tokens=context_tokens,
        selected_tokens=selected,
        indexer_flops=indexer_flops,
        indexer_bytes=indexer_bytes,
        attention_flops=selected * per_token_flops,
        attention_bytes=selected * latent_bytes_per_token,
    )


@dataclass(frozen=True)
class PrefillAttentionFlops:
    """Matrix FLOPs of one layer's attention over a whole prompt of ``prompt_tokens``, causal.

    ``naive``: decompress every latent, then MHA; ``absorbed_dense``: fold the
    up-projections into every query and output, then MQA over the latent;
    ``absorbed_sparse``: the same, each query reading only its top-k latents;
    ``naive_sparse``: decompress every latent, then MHA over each query's top-k
    (fewer FLOPs, but no entry shared by the heads: not what DeepSeek runs);
    ``indexer``: the indexer scoring every earlier token for every query.
    """

    prompt_tokens: int
    top_k: int | None
    naive: int
    absorbed_dense: int
    absorbed_sparse: int
    naive_sparse: int
    indexer: int

    @property
    def sparse_total(self) -> int:
        """What a DeepSeek-V3.2 prefill computes: sparse absorbed attention and its indexer."""
        return self.absorbed_sparse + self.indexer


def prefill_path_flops(
    shape: MLAShape, prompt_tokens: int, indexer: IndexerShape | None = None
) -> PrefillAttentionFlops:
    """FLOPs of one MLA layer's causal prefill of ``prompt_tokens`` on each path
    (projections left out). A whole model's attention FLOPs, summed over its layers,
    are :func:`kvlib.bounds.prefill_attention_flops`.

    Query ``t`` (1-based) sees ``t`` tokens, so a prompt has ``T (T + 1) / 2`` pairs:

    - naive: ``2 T d_c H (d_n + d_v)`` to decompress, ``2 H (d_n + d_r + d_v)`` a pair;
    - absorbed: ``2 T d_c H (d_n + d_v)`` to fold, ``2 H (2 d_c + d_r)`` a pair;
    - sparse absorbed (DeepSeek-V3.2): the same fold, pairs capped at ``k`` per query,
      so a query costs at most ``2 H k (2 d_c + d_r)`` however long the prompt;
    - sparse naive: the naive path with the same cap, ``2 H k (d_n + d_r + d_v)``;
    - the indexer: ``2 H_I (d_I + 1)`` a pair, uncapped: ``H_I (d_I + 1) T (T + 1)``.

    The V3.2 report runs DSA in MLA's MQA (absorbed) mode for prefill too
    (DeepSeek-V3.2-Exp technical report, section 2.1; FlashMLA's sparse prefill kernel).
    """
    require_int(prompt_tokens, "prompt_tokens", 1)
    t, heads = prompt_tokens, shape.num_heads
    rank, rope = shape.kv_lora_rank, shape.qk_rope_head_dim
    nope, value = shape.qk_nope_head_dim, shape.v_head_dim
    up = 2 * t * shape.kv_b_params
    pairs = causal_pairs(t)
    absorbed_pair = absorbed_flops_per_key(heads, rank, rope)
    naive_pair = naive_flops_per_key(heads, nope, rope, value)
    top_k = None if indexer is None else indexer.top_k
    index = 0 if indexer is None else 2 * indexer.num_heads * (indexer.head_dim + 1) * pairs
    return PrefillAttentionFlops(
        prompt_tokens=t,
        top_k=top_k,
        naive=up + naive_pair * pairs,
        absorbed_dense=up + absorbed_pair * pairs,
        absorbed_sparse=up + absorbed_pair * causal_pairs(t, top_k),
        naive_sparse=up + naive_pair * causal_pairs(t, top_k),
        indexer=index,
    )
