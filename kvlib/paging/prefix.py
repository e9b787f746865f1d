"""Prefix caching: block hashes chained through a sequence, and what sharing saves.

A *full* block of ``block_size`` tokens is identified by a hash of its parent
block's hash, its own token ids and its extra keys: ``h_i = H(h_{i-1}, tokens_i,
extra_i)``. vLLM's ``generate_block_hash_extra_keys`` puts a LoRA adapter's name
(and an image's hash, for the blocks it covers) in every block's keys, and the
request's cache salt in block 0's only (``start_token_idx == 0``): the chain
carries it to every later block. Because each hash folds in its parent's, two
sequences share block ``i`` only if they agree on *every* token up to the end of
that block. This is vLLM v1's scheme
(``hash_block_tokens`` and ``get_request_block_hasher`` in
``vllm/v1/core/kv_cache_utils.py``, read at commit ``001cabc1be16``): only full
blocks are hashed, a partial last block is never shared, and a request whose
whole prompt hits the cache still recomputes its last token to get logits
(``max_cache_hit_length = num_tokens - 1`` in ``KVCacheManager.get_computed_blocks``).

vLLM seeds the chain with a random ``NONE_HASH`` per process (or one derived
from ``PYTHONHASHSEED``); here the seed is a fixed constant, so hashes are
reproducible across runs and machines.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

from kvlib._validate import are_non_negative_ints, cdiv, is_int, require_int

__all__ = [
    "ROOT_HASH",
    "BlockHash",
    "ExtraKey",
    "PrefixSharing",
    "block_extra_keys",
    "block_hashes",
    "cacheable_blocks",
    "hash_block_tokens",
    "prefix_sharing",
]

BlockHash = NewType("BlockHash", bytes)
ExtraKey = str | int | bytes

# The parent of a sequence's first block: a fixed seed keeps hashes reproducible.
ROOT_HASH = BlockHash(hashlib.sha256(b"kvlib.paging.prefix root block").digest())


def _encode_extra(extra_keys: Sequence[ExtraKey]) -> bytes:
    """A byte string that tells apart ``("a", 1)``, ``("a1",)``, ``(b"a", 1)``."""
    parts = []
    for key in extra_keys:
        if not (is_int(key) or isinstance(key, str | bytes)):
            raise TypeError(
                f"an extra key must be a str, int or bytes (an adapter name, a salt), "
                f"got {type(key).__name__}"
            )
        raw = key if isinstance(key, bytes) else str(key).encode()
        parts.append(type(key).__name__.encode() + struct.pack("<Q", len(raw)) + raw)
    return b"".join(parts)


def hash_block_tokens(
    parent: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: Sequence[ExtraKey] = (),
) -> BlockHash:
    """SHA-256 of (parent hash, the block's token ids, extra keys): one link of the chain.

    ``parent`` is None for a sequence's first block (then :data:`ROOT_HASH`
    is used, as vLLM uses ``NONE_HASH``). Token ids are packed as
    little-endian 64-bit integers, so the hash does not depend on the machine.
    """
    tokens = list(token_ids)
    if not are_non_negative_ints(tokens):
        raise ValueError("token ids must be non-negative integers")
    digest = hashlib.sha256(parent if parent is not None else ROOT_HASH)
    digest.update(struct.pack(f"<Q{len(tokens)}q", len(tokens), *tokens))
    digest.update(_encode_extra(extra_keys))
    return BlockHash(digest.digest())


def block_extra_keys(
    block_index: int, extra_keys: Sequence[ExtraKey] = (), cache_salt: str | None = None
) -> tuple[ExtraKey, ...]:
    """The extra keys of block ``block_index``: ``extra_keys`` (an adapter's name) on
    every block, the cache salt on block 0 only (vLLM's ``generate_block_hash_extra_keys``)."""
    require_int(block_index, "block_index")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise ValueError(f"cache_salt must be a non-empty string or None, got {cache_salt!r}")
    salt: tuple[ExtraKey, ...] = (cache_salt,) if block_index == 0 and cache_salt else ()
    return tuple(extra_keys) + salt


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[ExtraKey] = (),
    cache_salt: str | None = None,
) -> list[BlockHash]:
    """The hash of every *full* block of ``token_ids``; a partial tail gets none."""
    require_int(block_size, "block_size", 1)
    block_extra_keys(0, extra_keys, cache_salt)  # a bad salt is refused with no full block too
    hashes: list[BlockHash] = []
    parent: BlockHash | None = None
    for index, start in enumerate(range(0, len(token_ids) - block_size + 1, block_size)):
        keys = block_extra_keys(index, extra_keys, cache_salt)
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], keys)
        hashes.append(parent)
    return hashes


def cacheable_blocks(shared_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """Blocks a request can take from the cache when its first ``shared_tokens`` match.

    ``min(shared // B, (prompt - 1) // B)``: whole blocks only, and never the
    block holding the prompt's last token when the whole prompt matches, since
    that token must be recomputed to produce the first output's logits.
    """
    require_int(shared_tokens, "shared_tokens")
    require_int(prompt_tokens, "prompt_tokens", 1)
    require_int(block_size, "block_size", 1)
    if shared_tokens > prompt_tokens:
        raise ValueError(
            f"shared_tokens ({shared_tokens}) cannot exceed prompt_tokens ({prompt_tokens})"
        )
    return min(shared_tokens // block_size, (prompt_tokens - 1) // block_size)


@dataclass(frozen=True)
class PrefixSharing:
    """What prefix caching saves when ``num_requests`` prompts share a prefix.

    Blocks are counted while all requests are resident at once (memory);
    prefill tokens over the whole batch (compute). The first request computes
    the shared blocks; every later one finds them in the cache.
    """

    num_requests: int
    prompt_tokens: int
    shared_blocks: int
    block_size: int

    @property
    def held_blocks_per_request(self) -> int:
        """``cdiv(prompt, B)``: whole blocks one prompt needs on its own."""
        return cdiv(self.prompt_tokens, self.block_size)

    @property
    def blocks_without_sharing(self) -> int:
        """``N x cdiv(prompt, B)``."""
        return self.num_requests * self.held_blocks_per_request

    @property
    def blocks_with_sharing(self) -> int:
        """The shared blocks once, plus each request's own blocks."""
        own = self.held_blocks_per_request - self.shared_blocks
        return self.shared_blocks + self.num_requests * own

    @property
    def blocks_saved(self) -> int:
        """``(N - 1) x shared blocks``: one copy is still needed."""
        return self.blocks_without_sharing - self.blocks_with_sharing

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens over the batch: ``N x prompt``."""
        return self.num_requests * self.prompt_tokens

    @property
    def prefill_tokens_skipped(self) -> int:
        """``(N - 1) x shared blocks x B``: tokens read from the cache, not recomputed."""
        return (self.num_requests - 1) * self.shared_blocks * self.block_size

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens served from the cache (vLLM's prefix cache hit rate)."""
        return self.prefill_tokens_skipped / self.prefill_tokens


def prefix_sharing(
    num_requests: int, shared_prefix_tokens: int, unique_tokens: int, block_size: int = 16
) -> PrefixSharing:
    """``num_requests`` prompts of a shared prefix followed by ``unique_tokens`` of their own.

    Only the prefix's full blocks are shared (:func:`cacheable_blocks`): every request
    recomputes the prefix's partial last block, in a block of its own.
    """
    require_int(num_requests, "num_requests", 1)
    require_int(shared_prefix_tokens, "shared_prefix_tokens")
    require_int(unique_tokens, "unique_tokens")
    require_int(block_size, "block_size", 1)
    prompt = shared_prefix_tokens + unique_tokens
    if prompt == 0:
        raise ValueError("a prompt needs at least one token: shared prefix + unique tokens > 0")
    shared = cacheable_blocks(shared_prefix_tokens, prompt, block_size)
    return PrefixSharing(num_requests, prompt, shared, block_size)
