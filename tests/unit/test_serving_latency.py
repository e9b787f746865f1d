"""kvlib.serving.latency: service with prefill charged, the reachable rate, TTFT, TPOT and
goodput, all from kvlib.step's step time (never a second formula)."""

from __future__ import annotations

import math

import pytest

from kvlib.bounds import kv_bytes_per_gpu, matmul_params
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.serving.latency import (
    goodput_per_s,
    max_arrivals_per_s,
    pool_latency,
    prefill_s,
    service_by_batch_s,
)
from kvlib.serving.slots import load_dependent_mmc
from kvlib.step import ASSUMED_MFU, PrefillChunk, steady_state_step, step_time

CFG, GPU = load_config("Llama-3.1-8B"), get_gpu("H100-SXM")
P, OUT, SLOTS = 3_596, 500, 115  # chapter 5's request and seats at full context


@pytest.fixture(scope="module")
def services() -> list[float]:
    return service_by_batch_s(CFG, GPU, SLOTS, P, OUT)


def test_service_is_output_tokens_times_the_steady_step(services: list[float]) -> None:
    for n in (1, 40, SLOTS):
        step = steady_state_step(CFG, GPU, n, P, OUT)
        assert services[n - 1] == pytest.approx(OUT * step.total_s)
    alone = service_by_batch_s(CFG, GPU, SLOTS, P, OUT, prefill=False)
    assert alone[-1] == pytest.approx(OUT * step_time(CFG, GPU, [P + OUT // 2] * SLOTS).total_s)
    assert all(a < b for a, b in zip(alone, services, strict=True))


def test_the_rate_with_prefill_charged_is_reachable_and_the_decode_only_one_is_not(
    services: list[float],
) -> None:
    """Two lower bounds on the GPU time a second of traffic needs, counted here: the
    prompts' matmul FLOPs at MFU x peak, and each output token's cache read at the
    bandwidth. They fit in one second at lambda_max, not at the decode-only rate."""
    body, _ = matmul_params(CFG)
    flops_ceiling = ASSUMED_MFU * GPU.bf16_dense_flops_per_s
    read_s = kv_bytes_per_gpu(CFG, P + OUT // 2) / GPU.hbm_bandwidth_bytes_per_s

    def busy_share(rate: float) -> float:
        return rate * (2 * body * P / flops_ceiling + OUT * read_s)

    lam = max_arrivals_per_s(services)
    lam_decode = max_arrivals_per_s(service_by_batch_s(CFG, GPU, SLOTS, P, OUT, prefill=False))
    assert busy_share(lam) < 1 < busy_share(lam_decode)
    full = steady_state_step(CFG, GPU, SLOTS, P, OUT)
    assert full.reachable()
    assert full.flops_per_s <= flops_ceiling * (1 + 1e-9)
    assert full.hbm_bytes_per_s <= GPU.hbm_bandwidth_bytes_per_s * (1 + 1e-9)


def test_prefill_takes_ceil_prompt_over_chunk_steps() -> None:
    steps, seconds = prefill_s(CFG, GPU, P, 10, 2_000, token_budget=1_010)
    assert steps == math.ceil(P / 1_000)
    expected = sum(step_time(CFG, GPU, [2_000] * 10,
                             [PrefillChunk(min(1_000, P - i * 1_000), i * 1_000,
                                           last=i == steps - 1)]).total_s
                   for i in range(steps))
    assert seconds == pytest.approx(expected)
    one, whole = prefill_s(CFG, GPU, P, 10, 2_000)  # vLLM's 8,192: one step
    assert one == 1 and whole < seconds
    with pytest.raises(ValueError, match="token_budget"):
        prefill_s(CFG, GPU, P, 64, 2_000, token_budget=64)


def test_latency_grows_with_the_load(services: list[float]) -> None:
    lam = max_arrivals_per_s(services)
    low, high = (pool_latency(CFG, GPU, SLOTS, P, OUT, f * lam, services_s=services)
                 for f in (0.3, 0.95))
    assert low.tpot_s < high.tpot_s and low.decode_s < high.decode_s
    assert low.mean_batch < high.mean_batch
    for at in (low, high):
        # Little's law on the chain: the mean batch is the rate times the mean service.
        queue = load_dependent_mmc(at.arrivals_per_s, services)
        assert at.mean_batch == pytest.approx(queue.mean_running)
        assert at.ttft_q_s == pytest.approx(at.wait_q_s + at.prefill_s)
        assert at.e2e_mean_s == pytest.approx(queue.mean_wait_s + at.prefill_s + at.decode_s)
        assert at.decode_s == pytest.approx(OUT * at.tpot_s)


def test_goodput_is_the_edge_of_both_targets(services: list[float]) -> None:
    ttft, tpot = 0.2, 0.008
    good = goodput_per_s(CFG, GPU, SLOTS, P, OUT, ttft, tpot)
    assert 0 < good < max_arrivals_per_s(services)
    inside = pool_latency(CFG, GPU, SLOTS, P, OUT, good, q=0.9, services_s=services)
    outside = pool_latency(CFG, GPU, SLOTS, P, OUT, good * 1.02, q=0.9, services_s=services)
    assert inside.ttft_q_s <= ttft and inside.tpot_s <= tpot
    assert outside.ttft_q_s > ttft or outside.tpot_s > tpot
    assert goodput_per_s(CFG, GPU, SLOTS, P, OUT, ttft, 0.05) > good  # a looser target
    assert goodput_per_s(CFG, GPU, SLOTS, P, OUT, 0.01, tpot) == 0.0  # below one prefill
