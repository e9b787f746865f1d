"""Multi-head Latent Attention by the numbers.

MLA (DeepSeek-V2 paper, arXiv 2405.04434, section 2.1) caches one latent of
``kv_lora_rank + qk_rope_head_dim`` elements per token per layer, shared by every
head and with no factor 2 for keys and values: 512 + 64 = 576 for DeepSeek-V2 and
V3. The per-token sizes themselves are :mod:`kvlib.sizing`'s; this package adds
what MLA changes around them:

- :mod:`kvlib.mla.cache`: equivalent GQA groups, reductions against MHA/GQA
  configs, and the bits per element a published reduction assumes;
- :mod:`kvlib.mla.cost`: FLOPs and bytes of a decode step on the naive and the
  absorbed path, and of top-k sparse attention with an indexer;
- :mod:`kvlib.mla.placement`: weights and seats per GPU under tensor-parallel
  and data-parallel attention, and decode context parallelism.

Standard library only; the torch modules that these formulas are counted against
live in :mod:`kvlib.nn.mla` and :mod:`kvlib.nn.sparse`.
"""

from kvlib.config import IndexerShape, MLAShape
from kvlib.mla.cache import (
    KVReduction,
    bits_for_published_reduction,
    cached_elements_per_token,
    equivalent_gqa_groups,
    kv_reduction,
    vllm_latent_entry_bytes,
)
from kvlib.mla.cost import (
    LatentReadCost,
    MLAPath,
    MLAStepCost,
    PrefillAttentionFlops,
    latent_read_cost,
    mla_step_cost,
    prefill_path_flops,
)
from kvlib.mla.placement import (
    AttentionParallel,
    dcp_node_seats,
    dcp_tokens_per_gpu,
    node_seats,
    weight_bytes_per_gpu,
)

__all__ = [
    "AttentionParallel",
    "IndexerShape",
    "KVReduction",
    "LatentReadCost",
    "MLAPath",
    "MLAShape",
    "MLAStepCost",
    "PrefillAttentionFlops",
    "bits_for_published_reduction",
    "cached_elements_per_token",
    "dcp_node_seats",
    "dcp_tokens_per_gpu",
    "equivalent_gqa_groups",
    "kv_reduction",
    "latent_read_cost",
    "mla_step_cost",
    "node_seats",
    "prefill_path_flops",
    "vllm_latent_entry_bytes",
    "weight_bytes_per_gpu",
]
