"""What one layer caches: one frozen class per kind of cache.

Every class answers the same questions (:class:`CacheSpec`: ``bytes_per_token``,
``tokens_held``, ``fixed_bytes``, ``bytes_for_context``, ``page_bytes``,
``tp_share``...), so code that sums over layers never asks which kind a layer is.

The oracle for the byte counts is the cache Hugging Face ``transformers``
5.23 allocates (``tests/reference/test_reference*.py``); for pages, vLLM's
``KVCacheSpec.page_size_bytes`` (``vllm/v1/kv_cache_interface.py``).
"""

from kvlib.specs.attention import ChunkedLocal, FullAttention, SlidingWindow, vllm_group_spec
from kvlib.specs.base import CacheSpec, causal_pairs
from kvlib.specs.latent import (
    DS_MLA_FP8_BYTES_PER_TOKEN,
    INDEXER_FP8_SCALE_BLOCK,
    DecompressedMLA,
    MLALatent,
)
from kvlib.specs.states import LinearState, SharedKV

__all__ = [
    "CacheSpec",
    "ChunkedLocal",
    "DecompressedMLA",
    "FullAttention",
    "LinearState",
    "MLALatent",
    "SharedKV",
    "SlidingWindow",
    "causal_pairs",
    "vllm_group_spec",
    "DS_MLA_FP8_BYTES_PER_TOKEN",
    "INDEXER_FP8_SCALE_BLOCK",
]
