"""The block pool and block tables: counts, prefix hits, eviction order, copy-on-write,
atomic failures, and a state machine checking the invariants after every step."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

import kvlib.paging.table as paging
from kvlib.paging.block_pool import Block, BlockPool, FreeBlockQueue, OutOfBlocksError
from kvlib.paging.prefix import block_hashes
from kvlib.paging.table import PagedKVCache, blocks_for_tokens


def test_exports() -> None:
    # The block pool lives in kvlib.paging.block_pool, the prefix arithmetic in
    # kvlib.paging.prefix: the table module exports only its own names.
    assert sorted(paging.__all__) == ["PagedKVCache", "blocks_for_tokens"]


@pytest.mark.parametrize(
    ("tokens", "block_size", "blocks"),
    [(0, 16, 0), (1, 16, 1), (16, 16, 1), (17, 16, 2), (4096, 16, 256), (4097, 16, 257),
     (1000, 1, 1000), (5, 8, 1)],
)
def test_blocks_for_tokens_rounds_a_partial_block_up(
    tokens: int, block_size: int, blocks: int
) -> None:
    assert blocks_for_tokens(tokens, block_size) == blocks


@pytest.mark.parametrize(("tokens", "block_size"), [(-1, 16), (10, 0), (1.5, 16), (True, 16)])
def test_blocks_for_tokens_refuses_bad_input(tokens: object, block_size: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        blocks_for_tokens(tokens, block_size)  # type: ignore[arg-type]


# ---------------------------------------------------------------- free queue


def test_free_queue_pops_in_order_and_removes_from_the_middle() -> None:
    blocks = [Block(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    assert len(queue) == 5 and [b.block_id for b in queue] == [0, 1, 2, 3, 4]
    queue.remove(blocks[2])
    assert [b.block_id for b in queue] == [0, 1, 3, 4]
    assert queue.popleft() is blocks[0]
    queue.append(blocks[2])
    assert [b.block_id for b in queue] == [1, 3, 4, 2] and len(queue) == 4


def test_free_queue_refuses_double_append_and_foreign_remove() -> None:
    blocks = [Block(0), Block(1)]
    queue = FreeBlockQueue(blocks)
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[0])
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(Block(7))
    queue.popleft()
    queue.popleft()
    with pytest.raises(OutOfBlocksError):
        queue.popleft()


# ---------------------------------------------------------------- pool


def test_pool_counts_and_reference_counts() -> None:
    pool = BlockPool(8, 4)
    a = pool.allocate(3)
    assert [b.block_id for b in a] == [0, 1, 2] and all(b.ref_count == 1 for b in a)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (5, 3)
    pool.touch(a[:1])
    pool.free(a)
    assert a[0].ref_count == 1 and pool.num_free_blocks == 7
    pool.free(a[:1])
    assert pool.num_free_blocks == 8
    with pytest.raises(ValueError, match="already free"):
        pool.free(a[:1])


def test_asking_for_more_blocks_than_are_free_changes_nothing() -> None:
    pool = BlockPool(4, 16)
    pool.allocate(3)
    before = pool.free_block_ids()
    with pytest.raises(OutOfBlocksError, match="asked for 2 blocks but only 1 of 4 are free"):
        pool.allocate(2)
    assert pool.free_block_ids() == before


def test_eviction_takes_the_least_recently_freed_cached_block() -> None:
    pool = BlockPool(3, 2)
    a, b, c = pool.allocate(3)
    for block, name in ((a, b"a"), (b, b"b"), (c, b"c")):
        assert pool.cache_block(block, name)  # type: ignore[arg-type]
    pool.free([b])
    pool.free([a])
    pool.free([c])
    assert pool.free_block_ids() == [b.block_id, a.block_id, c.block_id]
    assert pool.num_cached_blocks == 3
    # A cache hit on `a` takes it out of the free queue: it can no longer be evicted.
    assert pool.get_cached_block(b"a") is a  # type: ignore[arg-type]
    pool.touch([a])
    (taken,) = pool.allocate(1)
    assert taken is b and b.block_hash is None and pool.num_evictions == 1
    assert pool.get_cached_block(b"b") is None  # type: ignore[arg-type]
    assert pool.get_cached_block(b"a") is a  # type: ignore[arg-type]


def test_pool_without_prefix_caching_never_hits() -> None:
    pool = BlockPool(2, 2, enable_prefix_caching=False)
    (a,) = pool.allocate(1)
    assert not pool.cache_block(a, b"x")  # type: ignore[arg-type]
    assert pool.get_cached_block(b"x") is None  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_pool_refuses_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        BlockPool(bad, 16)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive integer"):
        BlockPool(16, bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- block tables


def test_block_table_maps_positions_to_slots() -> None:
    cache = PagedKVCache(10, 4)
    cache.add_sequence("x", list(range(6)))
    table = cache.block_table("x")
    assert len(table) == 2
    assert cache.slot("x", 5) == table[1] * 4 + 1
    with pytest.raises(IndexError):
        cache.slot("x", 6)


def test_a_shared_prefix_is_stored_once_and_skipped_by_prefill() -> None:
    system = list(range(100, 140))  # 40 tokens: 2 full blocks of 16, 8 left over
    cache = PagedKVCache(64, 16)
    assert cache.add_sequence(0, system + [1, 2, 3]) == 0
    assert cache.add_sequence(1, system + [4, 5]) == 32  # the partial third block is not shared
    t0, t1 = cache.block_table(0), cache.block_table(1)
    assert t0[:2] == t1[:2] and t0[2] != t1[2]
    assert cache.pool.num_used_blocks == 3 + 1
    assert (cache.prefix_hit_tokens, cache.prefix_query_tokens) == (32, 43 + 42)


def test_a_difference_in_the_first_block_breaks_every_later_hit() -> None:
    tokens = list(range(64))
    cache = PagedKVCache(16, 16)
    cache.add_sequence("a", tokens + [0])
    assert cache.add_sequence("b", [999] + tokens[1:] + [0]) == 0  # 63 equal tokens, no hit


def test_extra_keys_keep_adapters_apart() -> None:
    tokens = list(range(33))
    cache = PagedKVCache(16, 16)
    cache.add_sequence("base", tokens)
    assert cache.add_sequence("lora-a", tokens, extra_keys=("adapter-a",)) == 0
    assert cache.add_sequence("lora-a2", tokens, extra_keys=("adapter-a",)) == 32


def test_a_fully_cached_prompt_recomputes_its_last_block() -> None:
    prompt = list(range(32))  # exactly two blocks
    cache = PagedKVCache(8, 16)
    cache.add_sequence("a", prompt)
    assert cache.add_sequence("b", prompt) == 16  # the block of the last token is recomputed
    assert cache.pool.num_used_blocks == 3


def test_freed_prefix_stays_cached_until_evicted_tail_first() -> None:
    cache = PagedKVCache(4, 4)
    cache.add_sequence("a", list(range(13)))  # blocks for 4 + 4 + 4 + 1 tokens
    table = cache.block_table("a")
    cache.free("a")
    assert cache.pool.num_free_blocks == 4 and cache.pool.num_cached_blocks == 3
    # Freed tail first: the last block is evicted first, the first block last.
    assert cache.pool.free_block_ids() == table[::-1]
    assert cache.add_sequence("b", list(range(9)) + [77]) == 8
    assert cache.block_table("b")[:2] == table[:2]


def test_fork_shares_blocks_and_copies_a_shared_partial_block_on_write() -> None:
    cache = PagedKVCache(16, 4)
    cache.add_sequence("p", list(range(6)))  # one full block, one holding 2 tokens
    cache.fork("p", "c")
    assert cache.block_table("p") == cache.block_table("c")
    assert cache.pool.num_used_blocks == 2
    assert cache.blocks_needed("c", 1) == 1  # the copy
    cache.append_tokens("c", [50])
    tp, tc = cache.block_table("p"), cache.block_table("c")
    assert tp[0] == tc[0] and tp[1] != tc[1]
    assert cache.copies == [(tp[1], tc[1])]
    # The parent is now the only holder of its block: it writes in place.
    cache.append_tokens("p", [60])
    assert cache.block_table("p") == tp and len(cache.copies) == 1
    assert cache.token_ids("p")[-1] == 60 and cache.token_ids("c")[-1] == 50


def test_a_full_shared_block_is_never_copied() -> None:
    cache = PagedKVCache(8, 4)
    cache.add_sequence("p", list(range(8)))
    cache.fork("p", "c")
    assert cache.blocks_needed("c", 1) == 1  # a new block, no copy
    cache.append_tokens("c", [1])
    assert cache.copies == [] and cache.block_table("c")[:2] == cache.block_table("p")


def _snapshot(cache: PagedKVCache) -> object:
    return (
        {s: (cache.block_table(s), cache.token_ids(s)) for s in cache.sequences},
        cache.pool.free_block_ids(),
        [(b.ref_count, b.block_hash) for b in cache.pool.blocks],
        cache.copies[:],
    )


def test_failed_requests_leave_the_cache_untouched() -> None:
    cache = PagedKVCache(4, 4)
    cache.add_sequence("a", list(range(10)))  # 3 blocks
    cache.fork("a", "b")
    before = _snapshot(cache)
    with pytest.raises(OutOfBlocksError, match="only 1 of 4"):
        cache.add_sequence("c", list(range(100, 109)))
    with pytest.raises(OutOfBlocksError):
        cache.append_tokens("b", list(range(7)))  # a copy and a new block
    assert _snapshot(cache) == before
    with pytest.raises(ValueError, match="already exists"):
        cache.add_sequence("a", [1])
    with pytest.raises(KeyError, match="no sequence"):
        cache.free("zzz")
    with pytest.raises(ValueError, match="at least one token"):
        cache.add_sequence("d", [])
    assert _snapshot(cache) == before


def test_a_cache_hit_on_a_free_block_counts_against_the_free_blocks() -> None:
    cache = PagedKVCache(3, 4)
    cache.add_sequence("a", list(range(9)))  # 3 blocks; 2 full ones get cached
    cache.free("a")
    # The prompt hits 2 cached blocks (both free) and needs 2 new: 4 > 3 free.
    with pytest.raises(OutOfBlocksError):
        cache.add_sequence("b", list(range(8)) + [0, 1, 2, 3, 4])
    assert cache.pool.num_free_blocks == 3 and cache.pool.num_cached_blocks == 2


# ---------------------------------------------------------------- state machine

VOCAB = st.integers(0, 3)
# Shared system prompts (two agree on their first block only) make cache hits common.
STEMS = [[], [0, 1, 2, 3, 0, 1, 2, 3, 1], [0, 1, 2, 3, 3, 2, 1, 0, 2]]


class PoolMachine(RuleBasedStateMachine):
    """Random add / append / fork / free sequences against the invariants of the pool."""

    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.cache = PagedKVCache(16, 4)
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _in_use(self) -> dict[int, object]:
        """Each block some sequence holds, with the hash it carries."""
        return {
            b: self.cache.pool.blocks[b].block_hash
            for s in self.cache.sequences
            for b in self.cache.block_table(s)
        }

    def _guarded(self, action: Callable[[], object]) -> bool:
        """Run an action; if it runs out of blocks, check that nothing changed."""
        before, in_use = _snapshot(self.cache), self._in_use()
        try:
            action()
        except OutOfBlocksError:
            assert _snapshot(self.cache) == before
            return False
        # Eviction never touches a block in use: blocks still held keep their hash.
        after = self._in_use()
        for block, block_hash in in_use.items():
            if block in after and block_hash is not None:
                assert after[block] == block_hash
        return True

    @rule(
        target=seqs,
        stem=st.sampled_from(STEMS),
        tokens=st.lists(VOCAB, max_size=8),
        adapter=st.sampled_from([(), ("lora",)]),
    )
    def add(self, stem: list[int], tokens: list[int], adapter: tuple[str, ...]) -> object:
        seq_id = self._new_id()
        prompt = stem + tokens or [0]
        if not self._guarded(lambda: self.cache.add_sequence(seq_id, prompt, extra_keys=adapter)):
            return None
        return seq_id

    @rule(seq=seqs, tokens=st.lists(VOCAB, min_size=1, max_size=6))
    def append(self, seq: object, tokens: list[int]) -> None:
        if seq in self.cache.sequences:
            self._guarded(lambda: self.cache.append_tokens(seq, tokens))

    @rule(target=seqs, seq=seqs)
    def fork(self, seq: object) -> object:
        if seq not in self.cache.sequences:
            return None
        child = self._new_id()
        self.cache.fork(seq, child)
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq: object) -> None:
        if seq in self.cache.sequences:
            self.cache.free(seq)

    @precondition(lambda self: bool(self.cache.sequences))
    @rule(data=st.data())
    def free_random(self, data: st.DataObject) -> None:
        self.cache.free(data.draw(st.sampled_from(self.cache.sequences)))

    @invariant()
    def free_plus_used_is_total(self) -> None:
        pool = self.cache.pool
        assert pool.num_free_blocks + pool.num_used_blocks == pool.num_blocks
        assert len(set(pool.free_block_ids())) == pool.num_free_blocks

    @invariant()
    def ref_counts_count_the_block_tables(self) -> None:
        held: dict[int, int] = {}
        for s in self.cache.sequences:
            for b in self.cache.block_table(s):
                held[b] = held.get(b, 0) + 1
        free = set(self.cache.pool.free_block_ids())
        for block in self.cache.pool.blocks:
            assert block.ref_count >= 0
            assert block.ref_count == held.get(block.block_id, 0)
            assert (block.ref_count == 0) == (block.block_id in free)

    @invariant()
    def tables_hold_their_tokens(self) -> None:
        for s in self.cache.sequences:
            n = len(self.cache.token_ids(s))
            assert len(self.cache.block_table(s)) == blocks_for_tokens(n, 4)

    @invariant()
    def a_block_is_shared_only_by_an_equal_prefix(self) -> None:
        where: dict[int, list[tuple[Hashable, int]]] = {}
        for s in self.cache.sequences:
            for i, b in enumerate(self.cache.block_table(s)):
                where.setdefault(b, []).append((s, i))
        for holders in where.values():
            (s0, i0), rest = holders[0], holders[1:]
            for s, i in rest:
                assert i == i0, "a shared block sits at the same logical index"
                a, b = self.cache.token_ids(s0), self.cache.token_ids(s)
                end = min((i + 1) * 4, len(a), len(b))
                assert a[:end] == b[:end], "sharers agree on every token up to the block"

    @invariant()
    def cached_hashes_match_contents(self) -> None:
        for s in self.cache.sequences:
            hashes = block_hashes(self.cache.token_ids(s), 4, self.cache.extra_keys(s))
            for b, expected in zip(self.cache.block_table(s), hashes, strict=False):
                got = self.cache.pool.blocks[b].block_hash
                assert got is None or got == expected


PoolMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPoolMachine = PoolMachine.TestCase


def test_a_salted_prompt_shares_nothing_with_the_same_prompt_unsalted() -> None:
    """The salt sits in block 0's hash only, yet isolates the whole chain (vLLM's cache_salt)."""
    cache = PagedKVCache(num_blocks=32, block_size=16)
    prompt = list(range(70))
    cache.add_sequence("plain", prompt)
    assert cache.add_sequence("salted", prompt, cache_salt="tenant-1") == 0
    assert cache.add_sequence("same tenant", prompt, cache_salt="tenant-1") == 64
    # Blocks filled later (by appended tokens) keep the salt out of their own keys.
    cache.append_tokens("salted", list(range(70, 80)))
    assert cache.add_sequence("longer", prompt + list(range(70, 81)), cache_salt="tenant-1") == 80


@pytest.mark.parametrize("salt", ["", 7])
def test_a_bad_salt_on_a_prompt_shorter_than_a_block_is_refused_before_anything_changes(
    salt: object,
) -> None:
    cache = PagedKVCache(num_blocks=8, block_size=16)
    free = cache.pool.num_free_blocks
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string or None"):
        cache.add_sequence("short", [1, 2, 3], cache_salt=salt)  # type: ignore[arg-type]
    assert cache.pool.num_free_blocks == free and cache.add_sequence("short", [1, 2, 3]) == 0
