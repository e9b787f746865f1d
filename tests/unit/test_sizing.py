"""kvlib.sizing: the published figures, and invariants every sizing must keep."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvlib import sizing
from kvlib.config import ModelConfig, load_config
from kvlib.units import GiB, KiB, MiB


def test_chapter_one_worked_example(example_config: dict[str, object]) -> None:
    # 40 layers, 8 KV heads of 128 dims, 16-bit cache.
    per_token = sizing.kv_bytes_per_token_dense(40, 8, 128, 2)
    assert per_token == 163_840 == 160 * KiB
    cfg = load_config(example_config)
    assert sizing.kv_bytes_per_token(cfg, "bf16") == per_token
    one_user = sizing.kv_bytes(cfg, 4096, "bf16")
    assert one_user == 640 * MiB
    ten_users = sizing.kv_bytes(cfg, 4096, "bf16", batch=10)
    # "6,250 MiB" is a classic slip: ten 640 MiB seats are 6,400 MiB, which is 6.25 GiB.
    assert ten_users == 6_400 * MiB == int(6.25 * GiB)
    assert sizing.seats(9 * GiB, one_user) == 14  # the fifteenth seat fails
    assert 15 * one_user > 9 * GiB


@pytest.mark.parametrize(
    ("name", "per_token"),
    [
        # "128 KB per token for Llama 3.1 8B and 320 KB for 70B in bf16", as often quoted (KiB).
        ("Llama-3.1-8B", 128 * KiB),
        ("Llama-3.1-70B", 320 * KiB),
        # DeepSeek-V3 latent: 61 layers x (512 + 64) x 2 B (vLLM MLAAttentionSpec).
        ("DeepSeek-V3", 61 * 576 * 2),
        ("Falcon-7B", 2 * 32 * 1 * 64 * 2),
    ],
)
def test_published_bytes_per_token(name: str, per_token: int) -> None:
    assert sizing.kv_bytes_per_token(load_config(name), "bf16") == per_token


def test_kv_dtype_scales_bytes() -> None:
    cfg = load_config("Llama-3.1-8B")
    bf16 = sizing.kv_bytes_per_token(cfg, "bf16")
    assert sizing.kv_bytes_per_token(cfg, "fp32") == 2 * bf16
    assert sizing.kv_bytes_per_token(cfg, "fp8") == bf16 // 2
    assert sizing.kv_bytes_per_token(cfg, "int4") == bf16 // 4  # "quarter-price at 4-bit"


def test_sliding_layers_keep_window_minus_one_tokens() -> None:
    cfg = load_config("gpt-oss-20b")  # window 128, layers alternate sliding/full
    per_layer = sizing.kv_bytes_per_token_per_layer(cfg, 0, "bf16")
    assert per_layer == 2 * 8 * 64 * 2
    by_layer = sizing.kv_bytes_by_layer(cfg, 1000, "bf16")
    assert by_layer[0] == 127 * per_layer and by_layer[1] == 1000 * per_layer
    below = sizing.kv_bytes(cfg, 100, "bf16")
    assert below == 100 * sizing.kv_bytes_per_token(cfg, "bf16")


def test_mistral_cache_stops_growing_at_its_window() -> None:
    cfg = load_config("Mistral-7B-v0.1")
    assert sizing.kv_bytes(cfg, 4095) == sizing.kv_bytes(cfg, 32768)
    assert sizing.max_context_tokens(cfg, 1 * GiB) is None


def test_mla_layouts() -> None:
    cfg = load_config("DeepSeek-V3")
    latent = sizing.kv_bytes_per_token(cfg, "bf16")
    decompressed = sizing.kv_bytes_per_token(cfg, "bf16", mla_layout="decompressed")
    assert decompressed == 61 * 128 * (192 + 128) * 2
    assert decompressed // latent == 71  # MLA's cache is ~71x smaller than the heads it replaces


def test_seats_for_context_and_max_context_agree(bundled: ModelConfig) -> None:
    free = 20 * GiB
    for context in (1024, 8192):
        seats = sizing.seats_for_context(bundled, free, context)
        assert sizing.kv_bytes(bundled, context, batch=seats) <= free
        assert sizing.kv_bytes(bundled, context, batch=seats + 1) > free


@given(
    free=st.integers(0, 200 * GiB),
    batch=st.integers(1, 64),
    name=st.sampled_from(["Llama-3.1-8B", "Gemma-2-9B", "gpt-oss-20b", "DeepSeek-V3", "GPT-2"]),
)
# A budget that fills the 128-token windows exactly, with one more token's bytes of the
# full-attention layers to spare: the limit is past the window, not at it.
@example(free=106536960, batch=17, name="gpt-oss-20b")
def test_max_context_is_the_largest_that_fits(free: int, batch: int, name: str) -> None:
    cfg = load_config(name)
    limit = sizing.max_context_tokens(cfg, free, batch)
    assert limit is not None
    assert sizing.kv_bytes(cfg, limit, batch=batch) <= free
    assert sizing.kv_bytes(cfg, limit + 1, batch=batch) > free


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_kv_bytes_is_monotone(a: int, b: int) -> None:
    cfg = load_config("Gemma-2-9B")
    lo, hi = sorted((a, b))
    assert sizing.kv_bytes(cfg, lo) <= sizing.kv_bytes(cfg, hi)


def test_page_is_vllms_pages_summed() -> None:
    """vLLM's page across layers: 2 x block x H_kv x d x b a full layer, no 2 for MLA."""
    llama = load_config("Llama-3.1-8B")
    assert sizing.summed_page_bytes(llama, 16, "bf16") == 32 * 2 * 16 * 8 * 128 * 2
    assert sizing.summed_page_bytes(llama, 16, "bf16") == 16 * sizing.kv_bytes_per_token(llama)
    deepseek = load_config("DeepSeek-V3")
    assert sizing.summed_page_bytes(deepseek, 64, "fp8") == 61 * 64 * 576


@pytest.mark.parametrize(
    ("call", "kwargs", "message"),
    [
        (
            sizing.kv_bytes_per_token_dense,
            {"num_layers": 0, "num_kv_heads": 8, "head_dim": 128, "bytes_per_element": 2},
            "num_layers",
        ),
        (
            sizing.kv_bytes_per_token_dense,
            {"num_layers": 40, "num_kv_heads": 8, "head_dim": 128, "bytes_per_element": 0},
            "bytes_per_element",
        ),
        (sizing.seats, {"free_bytes": 10, "bytes_per_seat": 0}, "bytes_per_seat"),
    ],
)
def test_bad_arguments_name_the_argument(call: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(**kwargs)


def test_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="fp9.*bf16"):
        sizing.kv_bytes_per_token(load_config("GPT-2"), "fp9")
