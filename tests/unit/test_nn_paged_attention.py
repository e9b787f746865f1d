"""Paged decode attention equals scaled_dot_product_attention on the contiguous cache.

Tolerances, against torch's SDPA (float64 for the exact value):
- float32: |paged - SDPA| <= 1e-5 + 1e-5 |SDPA|. The output is a convex combination
  of at most a few hundred values of order 1; float32 rounding (2^-24 relative)
  accumulates far below 1e-5.
- bfloat16: the kernel computes in float32 and rounds once, so it is within half an ulp
  of the exact value: 2^-8 relative, since bfloat16 keeps 8 significant bits (measured
  worst case over 100 random cases: 0.00389), plus float32 noise far below 1e-5.
  Checked against float64 SDPA with rtol 2^-8, atol 1e-5. Against SDPA run in bfloat16
  itself, each side rounds on its own and may land one ulp away: rtol 2^-6, atol 2^-8.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from kvlib.nn.paged_attention import block_tables_tensor, paged_decode_attention, write_to_cache
from kvlib.paging.table import PagedKVCache

TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.bfloat16: {"atol": 1e-5, "rtol": 2**-8},  # against the float64 value
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _random_case(
    seed: int, heads: int, kv_heads: int, dim: int, block_size: int, dtype: torch.dtype
) -> dict[str, object]:
    """Sequences of random lengths in randomly scattered blocks, garbage everywhere else."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    lens = [rng.randint(1, 70) for _ in range(rng.randint(1, 5))]
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + 3
    order = list(range(num_blocks))
    rng.shuffle(order)  # physical blocks out of order: the table must be followed
    tables, start = [], 0
    for n in need:
        tables.append(order[start : start + n])
        start += n
    shape = (num_blocks, block_size, kv_heads, dim)
    key_cache = torch.full(shape, float("nan"), dtype=dtype)  # unused slots hold NaN
    value_cache = torch.full(shape, float("nan"), dtype=dtype)
    keys, values = [], []
    for table, n in zip(tables, lens, strict=True):
        k = torch.randn(n, kv_heads, dim, generator=gen).to(dtype)  # (T, H_kv, d)
        v = torch.randn(n, kv_heads, dim, generator=gen).to(dtype)
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                              for p in range(n)])
        write_to_cache(key_cache, value_cache, slots, k, v)
        keys.append(k)
        values.append(v)
    query = torch.randn(len(lens), heads, dim, generator=gen).to(dtype)  # (batch, H, d)
    return {
        "query": query, "key_cache": key_cache, "value_cache": value_cache,
        "tables": tables, "lens": lens, "keys": keys, "values": values,
    }


def _sdpa(case: dict[str, object], dtype: torch.dtype | None = None) -> torch.Tensor:
    """SDPA per sequence on its contiguous keys and values: the reference."""
    query = case["query"]
    assert isinstance(query, torch.Tensor)
    outs = []
    for i, (k, v) in enumerate(zip(case["keys"], case["values"], strict=True)):  # type: ignore[call-overload]
        cast = dtype or query.dtype
        q = query[i][None, :, None, :].to(cast)  # (1, H, 1, d)
        kk = k.permute(1, 0, 2)[None].to(cast)  # (1, H_kv, T, d)
        vv = v.permute(1, 0, 2)[None].to(cast)
        out = F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)  # (1, H, 1, d)
        outs.append(out[0, :, 0, :])
    return torch.stack(outs)  # (batch, H, d)


def _paged(case: dict[str, object]) -> torch.Tensor:
    return paged_decode_attention(
        case["query"],  # type: ignore[arg-type]
        case["key_cache"],  # type: ignore[arg-type]
        case["value_cache"],  # type: ignore[arg-type]
        block_tables_tensor(case["tables"]),  # type: ignore[arg-type]
        torch.tensor(case["lens"]),
    )


SHAPES = [(8, 8), (8, 4), (8, 2), (8, 1), (12, 4), (4, 4)]  # MHA, GQA 2:1 and 4:1, MQA, 3:1, MHA


@pytest.mark.parametrize(("heads", "kv_heads"), SHAPES)
@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("seed", range(3))
def test_float32_equals_sdpa_on_the_contiguous_cache(
    heads: int, kv_heads: int, block_size: int, seed: int
) -> None:
    case = _random_case(seed, heads, kv_heads, 32, block_size, torch.float32)
    out = _paged(case)
    assert out.dtype == torch.float32 and out.shape == (len(case["lens"]), heads, 32)  # type: ignore[arg-type]
    torch.testing.assert_close(out, _sdpa(case), **TOLERANCES[torch.float32])


@pytest.mark.parametrize(("heads", "kv_heads"), SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_bfloat16_is_rounded_once_from_the_exact_value(
    heads: int, kv_heads: int, seed: int
) -> None:
    case = _random_case(seed, heads, kv_heads, 64, 16, torch.bfloat16)
    out = _paged(case)
    assert out.dtype == torch.bfloat16
    exact = _sdpa(case, torch.float64)
    torch.testing.assert_close(out.double(), exact, **TOLERANCES[torch.bfloat16])
    torch.testing.assert_close(out, _sdpa(case), atol=2**-8, rtol=2**-6)


def test_the_block_table_matters() -> None:
    """Reading the blocks in the wrong order changes the answer (the check can fail)."""
    case = _random_case(7, 8, 2, 32, 4, torch.float32)
    case["tables"] = [t[::-1] for t in case["tables"]]  # type: ignore[attr-defined]
    longest = max(case["lens"])  # type: ignore[type-var]
    assert longest > 4
    with pytest.raises(AssertionError):
        torch.testing.assert_close(_paged(case), _sdpa(case), atol=1e-3, rtol=1e-3)


def test_with_the_block_pool_fork_and_copy_on_write() -> None:
    """Sequences managed by PagedKVCache: a fork shares blocks until copy-on-write."""
    block_size, kv_heads, heads, dim = 4, 2, 4, 16
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVCache(32, block_size)
    key_cache = torch.zeros(32, block_size, kv_heads, dim)
    value_cache = torch.zeros(32, block_size, kv_heads, dim)
    contiguous: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def write(seq: str, first: int, k: torch.Tensor, v: torch.Tensor) -> None:
        slots = torch.tensor([cache.slot(seq, p) for p in range(first, first + len(k))])
        write_to_cache(key_cache, value_cache, slots, k, v)
        old_k, old_v = contiguous.get(seq, (k[:0], v[:0]))
        contiguous[seq] = (torch.cat([old_k, k]), torch.cat([old_v, v]))

    def randn(n: int) -> torch.Tensor:
        return torch.randn(n, kv_heads, dim, generator=gen)  # (n, H_kv, d)

    prompt_k, prompt_v = randn(6), randn(6)
    cache.add_sequence("a", list(range(6)))
    write("a", 0, prompt_k, prompt_v)
    cache.fork("a", "b")
    contiguous["b"] = contiguous["a"]
    for step in range(5):
        for seq in ("a", "b"):
            k, v = randn(1), randn(1)
            copies_before = len(cache.copies)
            cache.append_tokens(seq, [100 + step])
            for src, dst in cache.copies[copies_before:]:
                key_cache[dst] = key_cache[src]  # copy-on-write: the data follows the table
                value_cache[dst] = value_cache[src]
            write(seq, len(cache.token_ids(seq)) - 1, k, v)
    assert cache.copies, "the shared partial block was copied"
    assert cache.block_table("a")[0] == cache.block_table("b")[0]
    query = torch.randn(2, heads, dim, generator=gen)
    seqs = ["a", "b"]
    out = paged_decode_attention(
        query, key_cache, value_cache,
        block_tables_tensor([cache.block_table(s) for s in seqs]),
        torch.tensor([len(cache.token_ids(s)) for s in seqs]),
    )
    case = {"query": query, "keys": [contiguous[s][0] for s in seqs],
            "values": [contiguous[s][1] for s in seqs]}
    torch.testing.assert_close(out, _sdpa(case), **TOLERANCES[torch.float32])


def test_block_tables_tensor_pads_ragged_tables() -> None:
    t = block_tables_tensor([[3, 1], [7], []])
    assert t.dtype == torch.long and t.tolist() == [[3, 1], [7, 0], [0, 0]]


@pytest.mark.parametrize(
    ("change", "match"),
    [("heads", "not a multiple"), ("dim", "head dim"), ("lens", "context_lens"),
     ("zero", "context_lens")],
)
def test_bad_shapes_are_refused(change: str, match: str) -> None:
    query = torch.zeros(2, 6, 8)
    caches = torch.zeros(4, 4, 4, 8)
    tables, lens = torch.zeros(2, 2, dtype=torch.long), torch.tensor([3, 8])
    if change == "dim":
        caches = torch.zeros(4, 4, 2, 16)
        query = torch.zeros(2, 4, 8)
    if change == "lens":
        lens = torch.tensor([3, 9])
    if change == "zero":
        lens = torch.tensor([0, 2])
    if change != "heads" and change != "dim":
        query = torch.zeros(2, 8, 8)
    with pytest.raises(ValueError, match=match):
        paged_decode_attention(query, caches, caches, tables, lens)
