"""Block hashes chain through a sequence; prefix-sharing arithmetic equals what the pool does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlib.paging.prefix as prefix
from kvlib.paging.prefix import (
    ROOT_HASH,
    block_extra_keys,
    block_hashes,
    cacheable_blocks,
    hash_block_tokens,
    prefix_sharing,
)
from kvlib.paging.table import PagedKVCache


def test_exports() -> None:
    assert sorted(prefix.__all__) == sorted(
        ["ROOT_HASH", "BlockHash", "ExtraKey", "PrefixSharing", "block_extra_keys", "block_hashes",
         "cacheable_blocks", "hash_block_tokens", "prefix_sharing"]
    )


def test_a_hash_depends_on_parent_tokens_and_extra_keys() -> None:
    base = hash_block_tokens(None, [1, 2, 3])
    assert base == hash_block_tokens(ROOT_HASH, [1, 2, 3]) == hash_block_tokens(None, (1, 2, 3))
    assert len(base) == 32
    variants = [
        hash_block_tokens(base, [1, 2, 3]),
        hash_block_tokens(None, [1, 2, 4]),
        hash_block_tokens(None, [3, 2, 1]),
        hash_block_tokens(None, [1, 2, 3], ("lora-a",)),
        hash_block_tokens(None, [1, 2, 3], ("lora-b",)),
        hash_block_tokens(None, [1, 2, 3], ("a", 1)),
        hash_block_tokens(None, [1, 2, 3], ("a1",)),
        hash_block_tokens(None, [1, 2, 3], (b"a", 1)),
        hash_block_tokens(None, [1, 2, 3], (1,)),
        hash_block_tokens(None, [1, 2, 3], ("1",)),
        hash_block_tokens(None, [1, 2], (3,)),
    ]
    assert len({base, *variants}) == len(variants) + 1


@pytest.mark.parametrize("bad", [[-1], [1.5], [True]])
def test_hash_refuses_bad_token_ids(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="non-negative integers"):
        hash_block_tokens(None, bad)  # type: ignore[arg-type]


def test_hash_refuses_unhashable_extra_keys() -> None:
    with pytest.raises(TypeError, match="extra key"):
        hash_block_tokens(None, [1], (1.5,))  # type: ignore[arg-type]


@given(st.lists(st.integers(0, 50), max_size=60), st.integers(1, 9), st.integers(0, 60))
def test_block_hashes_cover_full_blocks_and_a_prefix_keeps_its_hashes(
    tokens: list[int], block_size: int, cut: int
) -> None:
    hashes = block_hashes(tokens, block_size)
    assert len(hashes) == len(tokens) // block_size
    shorter = block_hashes(tokens[:cut], block_size)
    assert shorter == hashes[: len(shorter)]


def test_a_change_in_the_first_block_changes_every_hash() -> None:
    a = list(range(64))
    b = [99] + a[1:]
    assert not set(block_hashes(a, 16)) & set(block_hashes(b, 16))


@pytest.mark.parametrize(
    ("shared", "prompt", "block", "blocks"),
    [(1000, 1200, 16, 62), (40, 43, 16, 2), (32, 32, 16, 1), (33, 33, 16, 2), (15, 100, 16, 0),
     (0, 5, 16, 0), (16, 17, 16, 1)],
)
def test_cacheable_blocks(shared: int, prompt: int, block: int, blocks: int) -> None:
    assert cacheable_blocks(shared, prompt, block) == blocks


def test_cacheable_blocks_refuses_a_prefix_longer_than_the_prompt() -> None:
    with pytest.raises(ValueError, match="cannot exceed"):
        cacheable_blocks(10, 5, 16)


def test_a_system_prompt_shared_by_ten_requests() -> None:
    s = prefix_sharing(10, shared_prefix_tokens=1000, unique_tokens=200, block_size=16)
    assert s.shared_blocks == 62  # 992 tokens; the last 8 prefix tokens share a block with
    assert s.held_blocks_per_request == 75  # each request's own tokens
    assert s.blocks_without_sharing == 750
    assert s.blocks_with_sharing == 62 + 10 * 13
    assert s.blocks_saved == 9 * 62
    assert s.prefill_tokens_skipped == 9 * 992
    assert s.hit_rate == pytest.approx(9 * 992 / 12_000)


@pytest.mark.parametrize(
    "kwargs",
    [dict(num_requests=0, shared_prefix_tokens=1, unique_tokens=1),
     dict(num_requests=2, shared_prefix_tokens=0, unique_tokens=0),
     dict(num_requests=2, shared_prefix_tokens=-1, unique_tokens=3),
     dict(num_requests=2, shared_prefix_tokens=5, unique_tokens=3, block_size=0)],
)
def test_prefix_sharing_refuses_bad_input(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        prefix_sharing(**kwargs)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6),
    shared=st.integers(0, 70),
    unique=st.integers(0, 40),
    block=st.sampled_from([1, 2, 4, 8, 16]),
)
def test_the_formula_equals_what_the_block_pool_does(
    n: int, shared: int, unique: int, block: int
) -> None:
    """Run N prompts through the real pool and compare blocks used and tokens hit."""
    if shared + unique == 0:
        return
    system = [1000 + i for i in range(shared)]
    cache = PagedKVCache(700, block)
    hit = 0
    for r in range(n):
        # Each request's own tokens differ from the first one on: nothing else is shared.
        own = [r * 100 + j for j in range(unique)]
        hit += cache.add_sequence(r, system + own)
    expected = prefix_sharing(n, shared, unique, block)
    assert cache.pool.num_used_blocks == expected.blocks_with_sharing
    assert hit == expected.prefill_tokens_skipped
    assert cache.prefix_hit_tokens / cache.prefix_query_tokens == pytest.approx(expected.hit_rate)
    plain = PagedKVCache(700, block, enable_prefix_caching=False)
    for r in range(n):
        plain.add_sequence(r, system + [r * 100 + j for j in range(unique)])
    assert plain.pool.num_used_blocks == expected.blocks_without_sharing


def test_the_cache_salt_enters_block_0_only_and_still_changes_every_hash() -> None:
    """vLLM's generate_block_hash_extra_keys: the salt when start_token_idx == 0, a LoRA
    name on every block; the chain carries block 0's difference to every later block."""
    tokens = list(range(64))
    assert block_extra_keys(0, ("lora-a",), "tenant-1") == ("lora-a", "tenant-1")
    assert block_extra_keys(1, ("lora-a",), "tenant-1") == ("lora-a",)
    salted = block_hashes(tokens, 16, cache_salt="tenant-1")
    plain = block_hashes(tokens, 16)
    assert all(a != b for a, b in zip(salted, plain, strict=True))
    # Block 1 of the salted chain is block 1's tokens under block 0's salted hash, no salt.
    assert salted[1] == hash_block_tokens(salted[0], tokens[16:32])
    assert salted[1] != hash_block_tokens(salted[0], tokens[16:32], ("tenant-1",))
    with pytest.raises(ValueError, match="cache_salt"):
        block_extra_keys(0, (), "")
