"""The block pool under a paged KV cache: blocks, reference counts, an LRU free queue.

In the manner of vLLM v1's ``BlockPool`` (``vllm/v1/core/block_pool.py``, read at
commit ``002f34915134``) and its ``FreeKVCacheBlockQueue`` and ``KVCacheBlock``
(``vllm/v1/core/kv_cache_utils.py``, read at commit ``001cabc1be16``). Free
blocks wait in a doubly linked list whose head is the least recently freed
block; a freed *cached* block keeps its hash there until it is allocated
again, so the free queue doubles as the LRU eviction order of the prefix
cache. Block tables on top of the pool live in :mod:`kvlib.paging.table`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from kvlib._validate import require_int
from kvlib.paging.prefix import BlockHash

__all__ = ["Block", "BlockPool", "FreeBlockQueue", "OutOfBlocksError"]


class OutOfBlocksError(RuntimeError):
    """More blocks were asked for than are free; nothing was changed."""


@dataclass(eq=False, slots=True)
class Block:
    """One physical block: its id, reference count, hash (if cached) and free-list links."""

    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None
    prev_free: Block | None = field(default=None, repr=False)
    next_free: Block | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Free blocks in eviction order (head first), as a doubly linked list with two sentinels:
    ``remove`` takes a block out of the middle in O(1), which a ``deque`` cannot do."""

    def __init__(self, blocks: Sequence[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next_free, self._tail.prev_free = self._tail, self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Block]:
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free

    def popleft(self) -> Block:
        """Take the head block (the least recently freed)."""
        if self._len == 0:
            raise OutOfBlocksError("the free block queue is empty")
        block = self._head.next_free
        assert block is not None
        self.remove(block)
        return block

    def remove(self, block: Block) -> None:
        """Unlink ``block`` from anywhere in the queue."""
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev.next_free, nxt.prev_free = nxt, prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def append(self, block: Block) -> None:
        """Put ``block`` at the tail (evicted last)."""
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self._len += 1


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` slots, with reference counts and a prefix cache."""

    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True
    ) -> None:
        require_int(num_blocks, "num_blocks", 1)
        require_int(block_size, "block_size", 1)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks: tuple[Block, ...] = tuple(Block(i) for i in range(num_blocks))
        self._free = FreeBlockQueue(self.blocks)
        self._cached: dict[BlockHash, Block] = {}
        self.num_evictions = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds, cached ones included (they can be evicted)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered under a hash, in use or waiting in the free queue."""
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Ids of the free blocks in eviction order (first evicted first)."""
        return [block.block_id for block in self._free]

    def get_cached_block(self, block_hash: BlockHash) -> Block | None:
        """The block cached under ``block_hash``, or None."""
        return self._cached.get(block_hash) if self.enable_prefix_caching else None

    def ensure_free(self, n: int) -> None:
        """Raise :class:`OutOfBlocksError` unless ``n`` blocks are free."""
        if n > len(self._free):
            raise OutOfBlocksError(
                f"asked for {n} blocks but only {len(self._free)} of {self.num_blocks} are "
                "free: free or preempt a sequence, or make the pool larger"
            )

    def allocate(self, n: int) -> list[Block]:
        """Take ``n`` blocks from the head of the free queue, evicting their cached hashes."""
        require_int(n, "n")
        self.ensure_free(n)
        taken = [self._free.popleft() for _ in range(n)]
        for block in taken:
            if block.block_hash is not None:
                # Least recently used cached block: forget it now that it is reused.
                del self._cached[block.block_hash]
                block.block_hash = None
                self.num_evictions += 1
            block.ref_count = 1
        return taken

    def touch(self, blocks: Iterable[Block]) -> None:
        """One more reference to each block; a free (cached) block leaves the free queue."""
        for block in blocks:
            if block.ref_count == 0:
                self._free.remove(block)
            block.ref_count += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """One reference fewer to each block, in order; those at 0 join the free queue's tail."""
        for block in blocks:
            if block.ref_count < 1:
                raise ValueError(f"block {block.block_id} is already free")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free.append(block)

    def cache_block(self, block: Block, block_hash: BlockHash) -> bool:
        """Register a full block under its hash; False if that hash is already cached."""
        if not self.enable_prefix_caching or block_hash in self._cached:
            return False
        if block.block_hash is not None:
            raise ValueError(f"block {block.block_id} is already cached")
        block.block_hash = block_hash
        self._cached[block_hash] = block
        return True
