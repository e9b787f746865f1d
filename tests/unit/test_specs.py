"""kvlib.specs: each cache kind's bytes, tokens held, pages and tensor-parallel share.

Pages are checked against vLLM's own formulas, re-derived here from
vllm/v1/kv_cache_interface.py (AttentionSpec.real_page_size_bytes,
MLAAttentionSpec.real_page_size_bytes with its "fp8_ds_mla" case, MambaSpec)
and vllm/model_executor/models/deepseek_v2.py (DeepseekV32IndexerCache). Bytes
per token against transformers' caches are in tests/test_reference*.py.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlib import specs
from kvlib.config import MLAShape, load_config

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def vllm_attention_page(block: int, kv_heads: int, head_size: int, dtype_bytes: int) -> int:
    """AttentionSpec.real_page_size_bytes: ``2 * block_size * num_kv_heads * head_size * b``."""
    return 2 * block * kv_heads * head_size * dtype_bytes


def vllm_mla_page(block: int, head_size: int, dtype_bytes: int) -> int:
    """MLAAttentionSpec.real_page_size_bytes: one head, no factor 2."""
    return block * 1 * head_size * dtype_bytes


def v32_layer(**changes: int) -> specs.MLALatent:
    widths = dict(
        hidden_size=7168,
        num_heads=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
    )
    indexer = changes.pop("indexer_head_dim", 128)
    widths.update(changes)
    return specs.MLALatent(MLAShape(**widths), indexer_head_dim=indexer)


@given(
    st.sampled_from([1, 16, 32, 64, 128]),
    st.integers(1, 64),
    st.sampled_from([64, 80, 96, 128, 256]),
    st.sampled_from(sorted(DTYPE_BYTES)),
)
def test_attention_pages_are_vllms(block: int, kv_heads: int, head_dim: int, dtype: str) -> None:
    for spec in (
        specs.FullAttention(kv_heads, head_dim),
        specs.SlidingWindow(kv_heads, head_dim, 4096),
        specs.ChunkedLocal(kv_heads, head_dim, 8192),
    ):
        expected = vllm_attention_page(block, kv_heads, head_dim, DTYPE_BYTES[dtype])
        assert spec.page_bytes(block, dtype) == expected
        assert spec.page_bytes(block, dtype) == block * spec.bytes_per_token(dtype)


def vllm_scaled_page(block: int, kv_heads: int, head_size: int, kv_cache_dtype: str) -> int:
    """vllm/v1/kv_cache_interface.py (commit 001cabc1be16): ``page_size_bytes`` adds
    ``2 * block_size * num_kv_heads * get_dtype_size(torch.float32)`` to the int8/fp8
    page for per-token-head scales; nvfp4's last dim is ``nvfp4_kv_cache_full_dim``
    (``head_size // 2 + head_size // 16``) for keys and again for values, uint8."""
    if kv_cache_dtype == "nvfp4":
        full_dim = head_size // 2 + head_size // 16
        return block * kv_heads * (full_dim + full_dim) * 1
    return 2 * block * kv_heads * head_size * 1 + 2 * block * kv_heads * 4


@given(
    st.sampled_from([16, 32, 64, 128]),
    st.integers(1, 64),
    st.sampled_from([64, 80, 96, 128, 256]),
    st.sampled_from(specs.attention.VLLM_SCALED_KV_DTYPES),
)
def test_scaled_kv_pages_are_vllms(block: int, kv_heads: int, head_dim: int, dtype: str) -> None:
    spec = specs.FullAttention(kv_heads, head_dim)
    assert spec.vllm_scaled_page_bytes(block, dtype) == vllm_scaled_page(
        block, kv_heads, head_dim, dtype
    )


def test_per_token_head_scales_cost_three_percent_and_nvfp4_four_and_a_half_bits() -> None:
    spec = specs.FullAttention(8, 128)
    fp8 = spec.page_bytes(16, "fp8")
    scaled = spec.vllm_scaled_page_bytes(16, "fp8_per_token_head")
    assert scaled / fp8 == 1 + 4 / 128  # one 4-byte scale per 128 one-byte values
    nvfp4 = spec.vllm_scaled_page_bytes(16, "nvfp4")
    assert nvfp4 * 8 / (2 * 16 * 8 * 128) == 4.5
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        spec.vllm_scaled_page_bytes(16, "fp8")


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "fp32"])
def test_mla_page_drops_the_factor_two(dtype: str) -> None:
    latent = v32_layer(indexer_head_dim=0)
    assert latent.page_bytes(64, dtype) == vllm_mla_page(64, 576, DTYPE_BYTES[dtype])
    assert latent.bytes_per_token("bf16") == 1152  # DeepSeek-V2 paper: (512 + 64) x 2 bytes


def test_deepseek_v32_fp8_is_vllms_entry() -> None:
    """656 B of sparse-MLA latent (block_size * 656) plus the 132 B indexer key."""
    layer = v32_layer()
    assert specs.DS_MLA_FP8_BYTES_PER_TOKEN == 656
    indexer_head_size = 128 + 128 // 128 * 4  # DeepseekV32IndexerCache head_dim, uint8
    assert layer.bytes_per_token("fp8") == 656 + indexer_head_size == 788
    assert layer.page_bytes(64, "fp8") == 64 * 656 + vllm_mla_page(64, indexer_head_size, 1)
    assert "656" in (layer.layout_note("fp8") or "")


def test_v32_at_bf16_is_transformers_layout_and_says_so() -> None:
    layer = v32_layer()
    assert layer.bytes_per_token("bf16") == (512 + 64 + 128) * 2
    assert "transformers" in (layer.layout_note("bf16") or "")
    assert v32_layer(indexer_head_dim=0).layout_note("fp8") is None


def test_fp8_sparse_entry_refuses_other_latent_widths() -> None:
    with pytest.raises(ValueError, match="512 \\+ 64"):
        v32_layer(kv_lora_rank=256).bytes_per_token("fp8")


def test_decompressed_mla_is_per_head_keys_and_values() -> None:
    layer = v32_layer(indexer_head_dim=0).decompressed()
    assert layer.bytes_per_token("bf16") == 128 * (128 + 64 + 128) * 2
    assert specs.FullAttention(8, 128).decompressed() == specs.FullAttention(8, 128)


@given(st.integers(0, 10**6), st.integers(2, 10**5))
def test_windows_hold_at_most_w_minus_one(tokens: int, window: int) -> None:
    spec = specs.SlidingWindow(8, 128, window)
    assert spec.tokens_held(tokens) == min(tokens, window - 1)
    assert spec.bytes_for_context(tokens, "bf16") == spec.tokens_held(tokens) * 4096
    assert specs.FullAttention(8, 128).tokens_held(tokens) == tokens


def test_linear_state_is_fixed_and_is_one_page() -> None:
    state = specs.LinearState(conv_elements=1000, recurrent_elements=500)
    assert state.bytes_per_token("bf16") == 0
    assert state.bytes_for_context(0, "bf16") == 0
    assert state.bytes_for_context(1, "bf16") == state.bytes_for_context(10**6, "bf16")
    assert state.fixed_bytes("bf16") == 1000 * 2 + 500 * 4  # recurrent state in fp32
    # MambaSpec.page_size_bytes: the state's tensors, whatever the block size.
    assert state.page_bytes(16, "bf16") == state.page_bytes(1024, "bf16") == 4000


def test_shared_layer_holds_nothing() -> None:
    shared = specs.SharedKV()
    assert shared.bytes_for_context(10**6, "bf16") == shared.page_bytes(16, "bf16") == 0
    assert shared.tp_share(4) == 0


@pytest.mark.parametrize(
    ("kv_heads", "tp", "share"),
    [(8, 1, Fraction(1)), (8, 2, Fraction(1, 2)), (8, 8, Fraction(1, 8)), (8, 16, Fraction(1, 8)),
     (1, 4, Fraction(1)), (2, 4, Fraction(1, 2))],
)
def test_kv_heads_split_then_replicate(kv_heads: int, tp: int, share: Fraction) -> None:
    assert specs.FullAttention(kv_heads, 128).tp_share(tp) == share


def test_latent_is_whole_on_every_rank_and_states_split() -> None:
    assert v32_layer().tp_share(8) == 1
    assert specs.LinearState(10, 10).tp_share(4) == Fraction(1, 4)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: specs.FullAttention(0, 128), "num_kv_heads"),
        (lambda: specs.FullAttention(8, True), "head_dim"),
        (lambda: specs.SlidingWindow(8, 128, 1), "window"),
        (lambda: specs.ChunkedLocal(8, 128, 0), "chunk"),
    ],
)
def test_bad_shapes_name_the_field(make: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()  # type: ignore[operator]


def test_bad_arguments_name_the_argument() -> None:
    spec = specs.FullAttention(8, 128)
    with pytest.raises(ValueError, match="block_size"):
        spec.page_bytes(0, "bf16")
    with pytest.raises(ValueError, match="context_tokens"):
        spec.tokens_held(-1)
    with pytest.raises(ValueError, match="fp9"):
        spec.bytes_per_token("fp9")


def test_every_bundled_layer_is_a_spec() -> None:
    kinds = {type(layer) for name in ("gpt-oss-20b", "DeepSeek-V3") for layer in
             load_config(name).layers}
    assert kinds == {specs.SlidingWindow, specs.FullAttention, specs.MLALatent}
    assert all(isinstance(k.kind, str) for k in kinds)


@given(st.integers(0, 3000), st.integers(2, 600))
def test_attention_pairs_count_what_each_query_sees(tokens: int, window: int) -> None:
    """Pairs summed query by query: min(i, W) keys in a window, its own chunk's in a chunk."""
    full = specs.FullAttention(8, 128)
    sliding = specs.SlidingWindow(8, 128, window)
    chunked = specs.ChunkedLocal(8, 128, window)
    queries = range(1, tokens + 1)
    assert full.attention_pairs(tokens) == sum(queries)
    assert sliding.attention_pairs(tokens) == sum(min(i, window) for i in queries)
    assert chunked.attention_pairs(tokens) == sum((i - 1) % window + 1 for i in queries)


def test_attention_flops_per_pair() -> None:
    assert specs.FullAttention(8, 128).attention_flops_per_pair(32, 128) == 32 * 2 * 256
    latent = v32_layer(indexer_head_dim=0)
    assert latent.attention_flops_per_pair(1, 1) == 128 * 2 * (192 + 128)  # decompressed
    assert latent.decode_flops_per_key(1, 1) == 128 * 2 * (2 * 512 + 64)  # absorbed
    with pytest.raises(ValueError, match="sparse"):
        v32_layer().attention_pairs(10)
    with pytest.raises(ValueError, match="linear"):
        specs.LinearState(1, 1).attention_pairs(10)


@pytest.mark.parametrize(
    ("spec", "tokens", "held", "budget"),
    [
        # vLLM budgets: cdiv(T, B); sliding cdiv(min(W - 1 + batched, T), B) + 1;
        # chunked cdiv(min(C + batched, T), B). Held at a time: the window straddles
        # at most cdiv(W - 1, B) + 1 blocks, a chunk cdiv(C, B).
        (specs.FullAttention(8, 128), 1000, 63, 63),
        (specs.SlidingWindow(8, 128, 128), 1000, 9, 64),
        (specs.SlidingWindow(8, 128, 128), 100, 7, 8),
        (specs.ChunkedLocal(8, 128, 64), 1000, 4, 63),
        (specs.SharedKV(), 1000, 0, 0),
    ],
)
def test_blocks_held_and_budgeted(spec: specs.CacheSpec, tokens: int, held: int,
                                  budget: int) -> None:
    assert spec.held_blocks(tokens, 16) == held
    if spec.vllm_page_type() is not None:
        assert spec.vllm_blocks_per_request(tokens, 16, 8192) == budget


def test_page_types_group_layers_as_vllm_does() -> None:
    assert specs.FullAttention(8, 128).vllm_page_type() == v32_layer().vllm_page_type()
    assert specs.SlidingWindow(8, 128, 4096).vllm_page_type() == ("sliding", 4096)
    assert specs.SharedKV().vllm_page_type() is None
    with pytest.raises(ValueError, match="MambaSpec"):
        specs.LinearState(1, 1).vllm_page_type()
