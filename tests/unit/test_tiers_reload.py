"""kvlib.tiers.reload: reload over a link against recompute by the step model."""

from __future__ import annotations

import pytest

from kvlib.bounds import kv_bytes_per_gpu
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.step import PrefillChunk, step_time
from kvlib.tiers.links import get_link
from kvlib.tiers.reload import (
    break_even_bytes_per_s,
    break_even_tokens,
    recompute_s,
    reload_s,
)

H100 = get_gpu("H100-SXM")


@pytest.fixture(scope="module")
def llama():
    return load_config("Llama-3.1-8B")


def test_the_issue_estimate_reload_about_12x_faster(llama) -> None:
    # 128 KiB a token over ~50 GB/s is ~2.6 us; recomputing at 50% MFU ~30 us a token.
    tokens = 4096
    reload = reload_s(llama, tokens, 50e9) / tokens
    recompute = recompute_s(llama, H100, tokens, mfu=0.5) / tokens
    assert reload == pytest.approx(128 * 1024 / 50e9)
    assert 28e-6 < recompute < 36e-6
    assert 10 < recompute / reload < 14


def test_reload_is_one_gpus_share_over_its_link(llama) -> None:
    one = reload_s(llama, 1000, 1e9)
    assert reload_s(llama, 1000, 1e9, tp=4) == pytest.approx(one / 4)
    assert reload_s(llama, 1000, 1e9, setup_s=1e-3) == pytest.approx(one + 1e-3)
    assert reload_s(llama, 1000, 1e9, kv_dtype="fp8") == pytest.approx(one / 2)


def test_recompute_is_the_step_models_prefill(llama) -> None:
    t = 8192
    step = step_time(llama, H100, (), [PrefillChunk(t)], mfu=0.5)
    assert recompute_s(llama, H100, t, mfu=0.5) == step.total_s
    # attention's T^2 term: doubling a long prefix more than doubles its recompute
    assert recompute_s(llama, H100, 2 * t) > 2.05 * recompute_s(llama, H100, t)


def test_reload_always_wins_for_llama_over_pcie(llama) -> None:
    result = break_even_tokens(llama, H100, get_link("pcie5").bytes_per_s)
    assert result.tokens is None and result.recompute_wins_from is None


def test_a_window_where_recompute_wins_and_its_edges() -> None:
    # GPT-2: 36 KiB a token and ~0.1 B parameters: over one NVMe drive recomputing wins
    # past the weight read, until attention's quadratic term catches up.
    gpt2 = load_config("GPT-2")
    bw = get_link("nvme-gen5").bytes_per_s
    result = break_even_tokens(gpt2, H100, bw, max_tokens=1 << 20)
    assert result.tokens is not None and result.recompute_wins_from is not None

    def wins(t: int) -> bool:
        return recompute_s(gpt2, H100, t) < reload_s(gpt2, t, bw)

    assert wins(result.tokens - 1) and not wins(result.tokens)
    assert wins(result.recompute_wins_from) and not wins(result.recompute_wins_from - 1)


def test_recompute_wins_to_the_limit_on_a_slow_enough_link(llama) -> None:
    result = break_even_tokens(llama, H100, 1e8, max_tokens=4096)
    assert result.recompute_wins_to_max and result.tokens is None


def test_break_even_bandwidth_equalises_the_two(llama) -> None:
    t = 4096
    bw = break_even_bytes_per_s(llama, H100, t, setup_s=1e-4)
    assert bw is not None
    assert reload_s(llama, t, bw, setup_s=1e-4) == pytest.approx(recompute_s(llama, H100, t))
    assert bw == pytest.approx(kv_bytes_per_gpu(llama, t) / (recompute_s(llama, H100, t) - 1e-4))
    assert break_even_bytes_per_s(llama, H100, t, setup_s=10.0) is None


def test_bad_input() -> None:
    llama = load_config("Llama-3.1-8B")
    with pytest.raises(ValueError, match="prefix_tokens"):
        reload_s(llama, 0, 1e9)
    with pytest.raises(ValueError, match="setup_s"):
        reload_s(llama, 10, 1e9, setup_s=-1)
