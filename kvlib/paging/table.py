"""A paged KV cache: a block table per sequence over a :class:`~kvlib.paging.block_pool.BlockPool`.

The design follows vLLM v1 (the pool's module names the files and commits):

- Each block has a reference count: the number of sequences whose block
  table lists it. A block returns to the free queue when its count reaches 0.
- Prefix caching: a *full* block is registered under its hash
  (:mod:`kvlib.paging.prefix`: parent hash, token ids, extra keys), and keeps it
  while it waits in the free queue, so a later prompt with the same prefix takes
  it back instead of recomputing it. A sequence frees its blocks tail first, so
  the end of a prefix is evicted before its beginning.
- A sequence forked from another (parallel sampling) shares all its blocks;
  writing into a shared, partly filled last block first copies it
  (copy-on-write). Full blocks are never written again, so they never copy.

Differences from vLLM, on purpose: no null block (vLLM reserves block 0 as a
placeholder, so its scheduler can use ``num_blocks - 1``), one block per hash
(vLLM may keep duplicates), and one KV cache group (no hybrid models).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvlib._validate import are_non_negative_ints, cdiv, require_int
from kvlib.paging.block_pool import Block, BlockPool
from kvlib.paging.prefix import (
    BlockHash,
    ExtraKey,
    block_extra_keys,
    block_hashes,
    hash_block_tokens,
)

__all__ = ["PagedKVCache", "blocks_for_tokens"]


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """``cdiv(T, B)``: whole blocks that hold ``num_tokens`` (a partial block is a block)."""
    require_int(num_tokens, "num_tokens")
    require_int(block_size, "block_size", 1)
    return cdiv(num_tokens, block_size)


@dataclass(eq=False)
class _Sequence:
    token_ids: list[int]
    blocks: list[Block]
    hashes: list[BlockHash]
    extra_keys: tuple[ExtraKey, ...]
    cache_salt: str | None = None


class PagedKVCache:
    """Block tables over a :class:`BlockPool`: add, grow, fork and free sequences.

    Every method that needs blocks checks that enough are free *before*
    changing anything, and raises :class:`~kvlib.paging.block_pool.OutOfBlocksError` otherwise.
    """

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True
    ) -> None:
        self.pool = BlockPool(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching)
        self._seqs: dict[Hashable, _Sequence] = {}
        self.prefix_query_tokens = 0  # prompt tokens looked up in the cache
        self.prefix_hit_tokens = 0  # of which found there
        self.copies: list[tuple[int, int]] = []  # (source, destination) block ids, CoW

    @property
    def block_size(self) -> int:
        return self.pool.block_size

    @property
    def sequences(self) -> list[Hashable]:
        return list(self._seqs)

    def _seq(self, seq_id: Hashable) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"no sequence {seq_id!r}: add it first") from None

    def block_table(self, seq_id: Hashable) -> list[int]:
        """Physical block ids of the sequence's logical blocks 0, 1, 2, ..."""
        return [block.block_id for block in self._seq(seq_id).blocks]

    def token_ids(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).token_ids)

    def extra_keys(self, seq_id: Hashable) -> tuple[ExtraKey, ...]:
        """The keys (adapter, salt) folded into every block hash of the sequence."""
        return self._seq(seq_id).extra_keys

    def slot(self, seq_id: Hashable, position: int) -> int:
        """Slot of token ``position``: ``block_table[position // B] x B + position % B``."""
        seq = self._seq(seq_id)
        if not 0 <= position < len(seq.token_ids):
            raise IndexError(f"position {position} outside 0..{len(seq.token_ids) - 1}")
        block = seq.blocks[position // self.block_size]
        return block.block_id * self.block_size + position % self.block_size

    def add_sequence(
        self,
        seq_id: Hashable,
        token_ids: Sequence[int],
        *,
        extra_keys: Sequence[ExtraKey] = (),
        cache_salt: str | None = None,
    ) -> int:
        """Give a prompt its blocks, reusing cached full blocks; return the tokens found cached.

        ``extra_keys`` (an adapter's name) enter every block's hash, ``cache_salt`` block
        0's only, as in vLLM (:func:`kvlib.paging.prefix.block_extra_keys`).
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists: free it or pick another id")
        tokens = list(token_ids)
        if not tokens:
            raise ValueError("a sequence needs at least one token")
        extra = tuple(extra_keys)
        hashes = block_hashes(tokens, self.block_size, extra, cache_salt)
        hits: list[Block] = []
        # The prompt's last token is always recomputed: it yields the first output's logits.
        for block_hash in hashes[: (len(tokens) - 1) // self.block_size]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        new = blocks_for_tokens(len(tokens), self.block_size) - len(hits)
        # Touching a cached free block takes it out of the free queue too.
        self.pool.ensure_free(new + sum(block.ref_count == 0 for block in hits))
        self.pool.touch(hits)
        blocks = hits + self.pool.allocate(new)
        for i in range(len(hits), len(hashes)):
            self.pool.cache_block(blocks[i], hashes[i])
        self._seqs[seq_id] = _Sequence(tokens, blocks, hashes, extra, cache_salt)
        self.prefix_query_tokens += len(tokens)
        self.prefix_hit_tokens += len(hits) * self.block_size
        return len(hits) * self.block_size

    def blocks_needed(self, seq_id: Hashable, num_new_tokens: int) -> int:
        """Free blocks an append of ``num_new_tokens`` takes, a copy-on-write included."""
        seq = self._seq(seq_id)
        size = len(seq.token_ids)
        needed = blocks_for_tokens(size + num_new_tokens, self.block_size) - len(seq.blocks)
        shared_partial = size % self.block_size != 0 and seq.blocks[-1].ref_count > 1
        return needed + int(shared_partial and num_new_tokens > 0)

    def append_tokens(self, seq_id: Hashable, token_ids: Sequence[int]) -> None:
        """Add generated tokens: fill the last block, copy it first if shared, then new blocks."""
        seq = self._seq(seq_id)
        tokens = list(token_ids)
        if not are_non_negative_ints(tokens):
            raise ValueError("token ids must be non-negative integers")
        self.pool.ensure_free(self.blocks_needed(seq_id, len(tokens)))
        if tokens and len(seq.token_ids) % self.block_size and seq.blocks[-1].ref_count > 1:
            (copy,) = self.pool.allocate(1)
            self.copies.append((seq.blocks[-1].block_id, copy.block_id))
            self.pool.free([seq.blocks[-1]])
            seq.blocks[-1] = copy
        seq.token_ids += tokens
        size = self.block_size
        seq.blocks += self.pool.allocate(cdiv(len(seq.token_ids), size) - len(seq.blocks))
        while len(seq.hashes) < len(seq.token_ids) // size:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else None
            keys = block_extra_keys(i, seq.extra_keys, seq.cache_salt)
            block_hash = hash_block_tokens(parent, seq.token_ids[i * size : (i + 1) * size], keys)
            seq.hashes.append(block_hash)
            if seq.blocks[i].block_hash is None:
                self.pool.cache_block(seq.blocks[i], block_hash)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """A new sequence sharing every block of ``parent_id`` (no block is copied yet)."""
        parent = self._seq(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id!r} already exists: pick another id")
        self.pool.touch(parent.blocks)
        self._seqs[child_id] = _Sequence(
            list(parent.token_ids),
            list(parent.blocks),
            list(parent.hashes),
            parent.extra_keys,
            parent.cache_salt,
        )

    def free(self, seq_id: Hashable) -> None:
        """Release a sequence; its blocks are freed tail first (its tail is evicted first)."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        self.pool.free(reversed(seq.blocks))
