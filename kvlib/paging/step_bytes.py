"""Bytes one decode step reads through a block table, against a contiguous cache.

A decode step reads every weight it multiplies, once (all but the input embedding table,
and of a mixture-of-experts layer only the experts its tokens are routed to: the same
weights :func:`kvlib.bounds.decode_bytes_per_gpu` counts) and every cached key and value
of every running sequence. Through a block table it reads whole blocks: the last block
of a sequence is read in full although only part of it holds tokens (a kernel loads
a block as one tile of keys), plus the table itself, one 4-byte block id per block
(vLLM's ``block_table`` tensors are int32). An unfused implementation that first
gathers each sequence's blocks into token order, then attends, also writes that copy
and reads it back: twice the cache's bytes more. Dividing by a GPU's bandwidth gives
the time bound of the step (:func:`kvlib.bounds.decode_tokens_per_s` divides the other
way).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import cdiv, require_int
from kvlib.bounds import decode_bytes_per_gpu
from kvlib.config import ModelConfig
from kvlib.paging.vllm_pool import DEFAULT_BLOCK_SIZE, unified_page_bytes
from kvlib.sizing import kv_bytes

__all__ = ["BLOCK_ID_BYTES", "PagedStepBytes", "paged_step_bytes"]

BLOCK_ID_BYTES = 4  # one int32 entry of a block table


@dataclass(frozen=True)
class PagedStepBytes:
    """Bytes one decode step reads, by where they come from."""

    weights: int  # every weight the step multiplies (a MoE layer: the experts it touches)
    cache_tokens: int  # the keys and values the sequences hold, token by token
    cache_blocks: int  # the same read as whole blocks (the last one's empty slots too)
    block_table: int  # the block ids
    gather_copy: int  # an unfused gather's write and read back of the cache

    @property
    def contiguous(self) -> int:
        """A contiguous cache: weights and exactly the tokens' keys and values."""
        return self.weights + self.cache_tokens

    @property
    def fused_paged(self) -> int:
        """A fused paged kernel: weights, whole blocks and the block table."""
        return self.weights + self.cache_blocks + self.block_table

    @property
    def gather_then_attend(self) -> int:
        """Gather into token order, then attend: the fused kernel's bytes and the copy."""
        return self.fused_paged + self.gather_copy


def paged_step_bytes(
    cfg: ModelConfig,
    context_tokens: int,
    batch: int,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
) -> PagedStepBytes:
    """One decode step of ``batch`` sequences of ``context_tokens`` each.

    ``weights``: the weight part of :func:`kvlib.bounds.decode_bytes_per_gpu` on one GPU
    (its cache part is ``cache_tokens``); ``cache_tokens = batch x kv_bytes(T)``;
    ``cache_blocks = batch x cdiv(T, B) x page``
    (vLLM's page summed over layers, :func:`kvlib.paging.vllm_pool.unified_page_bytes`);
    ``block_table = batch x cdiv(T, B) x 4``; ``gather_copy = 2 x cache_blocks``.
    Full-attention models: a sliding layer would read only its window's blocks.
    """
    require_int(context_tokens, "context_tokens", 1)
    require_int(batch, "batch", 1)
    require_int(block_size, "block_size", 1)
    # Every layer must page every token: no window (cap) and no borrowed cache (no pages).
    if any(spec.vllm_page_type() is None or spec.cap_tokens is not None for spec in cfg.layers):
        raise ValueError(
            f"{cfg.name} has layers that are not full attention: paged_step_bytes reads "
            "every block of every layer; size sliding layers by their window instead"
        )
    blocks = batch * cdiv(context_tokens, block_size)
    cache_blocks = blocks * unified_page_bytes(cfg, block_size, kv_dtype)
    return PagedStepBytes(
        weights=decode_bytes_per_gpu(cfg, batch, 0, kv_dtype, weight_dtype),
        cache_tokens=batch * kv_bytes(cfg, context_tokens, kv_dtype),
        cache_blocks=cache_blocks,
        block_table=blocks * BLOCK_ID_BYTES,
        gather_copy=2 * cache_blocks,
    )
