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

from kvlib.specs.attention import ChunkedLocal, FullAttention, SlidingWindow, vllm_group_spec
from kvlib.specs.base import CacheSpec
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
    "vllm_group_spec",
    "DS_MLA_FP8_BYTES_PER_TOKEN",
    "INDEXER_FP8_SCALE_BLOCK",
]
