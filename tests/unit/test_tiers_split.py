"""kvlib.tiers.split: the layer-by-layer overlap against an event-by-event replay, the M/D/1
prefill queue against a Lindley-recursion simulation, the goodput arithmetic against the
DistServe authors' published example, and the aggregated and disaggregated models against
steps computed independently with the step model."""

from __future__ import annotations

import math
import random

import pytest

from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.sizing import kv_bytes_per_token_dense
from kvlib.step import PrefillChunk, mixed_step, step_time
from kvlib.tiers.links import get_link
from kvlib.tiers.split import (
    Workload,
    aggregated_goodput,
    aggregated_point,
    best_split,
    decode_rate_for_tpot,
    disaggregated_goodput,
    handoff_overlap,
    layerwise_overlap,
    md1_ttft_s,
    prefill_rate_for_ttft,
    split_goodput_per_gpu,
)

LLAMA = load_config("Llama-3.1-8B")
H100 = get_gpu("H100-SXM")
LONG = Workload(4096, 256, ttft_target_s=1.0, tpot_target_s=0.010)
SHORT = Workload(256, 512, ttft_target_s=0.5, tpot_target_s=0.050)


def replay_last_send_end(prefill_s: float, transfer_s: float, layers: int) -> float:
    """Layer i is computed by i p; its send starts when both it and the previous send are
    done, and takes x: the end of the last send, event by event."""
    p, x = prefill_s / layers, transfer_s / layers
    end = 0.0
    for i in range(1, layers + 1):
        end = max(i * p, end) + x
    return end


def test_layerwise_overlap_equals_an_event_replay() -> None:
    rng = random.Random(0)
    for _ in range(500):
        layers = rng.randrange(1, 130)
        prefill, transfer = rng.uniform(1e-3, 1.0), rng.uniform(0.0, 2.0)
        overlap = layerwise_overlap(prefill, transfer, layers)
        replayed = replay_last_send_end(prefill, transfer, layers)
        assert overlap.finish_s == pytest.approx(replayed, rel=1e-12)
        assert overlap.hidden == (transfer <= prefill)
        # Sending after the prefill shows all of the transfer; layer by layer never more.
        assert overlap.exposed_s <= transfer + 1e-15


def test_a_hidden_transfer_shows_only_its_last_layer() -> None:
    overlap = layerwise_overlap(0.1, 0.08, 32)
    assert overlap.hidden and overlap.exposed_s == pytest.approx(0.08 / 32)
    assert layerwise_overlap(0.1, 0.08, 1).exposed_s == pytest.approx(0.08)  # one layer: none
    assert layerwise_overlap(0.1, 0.0, 32).exposed_s == 0.0
    slow = layerwise_overlap(0.1, 0.3, 32)
    assert not slow.hidden and slow.exposed_s == pytest.approx(0.3 - 31 * 0.1 / 32)


def test_handoff_overlap_uses_the_cache_bytes_and_the_step_model() -> None:
    link = get_link("ib-400g")
    overlap = handoff_overlap(LLAMA, H100, 4096, link.bytes_per_s, prefill_tp=2, decode_tp=4)
    per_token = kv_bytes_per_token_dense(32, 8, 128, 2)  # 2 x L x H_kv x d x 2 bytes
    # Prefill GPUs each send half of the heads; decode GPUs each receive a quarter: the
    # busiest link carries half of the cache.
    assert overlap.transfer_s == pytest.approx(4096 * per_token / 2 / (400e9 / 8))
    alone = step_time(LLAMA, H100, (), [PrefillChunk(4096)], tp=2).total_s
    assert overlap.prefill_s == alone and overlap.layers == 32


def test_md1_mean_matches_a_simulated_queue() -> None:
    """Lindley's recursion W_(n+1) = max(0, W_n + D - A_(n+1)) with Poisson arrivals."""
    rng = random.Random(1)
    service, rate, n = 0.2, 3.0, 200_000
    wait, total = 0.0, 0.0
    for _ in range(n):
        total += wait
        wait = max(0.0, wait + service - rng.expovariate(rate))
    simulated = service + total / n
    assert md1_ttft_s(service, rate) == pytest.approx(simulated, rel=0.03)
    assert md1_ttft_s(service, 0.0) == service


def test_prefill_rate_for_ttft_inverts_the_queue() -> None:
    for target in (0.25, 0.5, 1.0, 4.0):
        rate = prefill_rate_for_ttft(0.2, target, extra_s=0.01)
        assert md1_ttft_s(0.2, rate) + 0.01 == pytest.approx(target)
    assert prefill_rate_for_ttft(0.2, 0.2, extra_s=0.01) == 0.0
    assert prefill_rate_for_ttft(0.2, 1e6) == pytest.approx(1 / 0.2, rel=1e-4)
    rates = [prefill_rate_for_ttft(0.2, t) for t in (0.3, 0.4, 0.8, 1.6)]
    assert rates == sorted(rates)


def test_the_distserve_authors_example() -> None:
    """hao-ai-lab.github.io/blogs/distserve (2024): a prefill worker ~5.6 rps, a decode
    worker ~10 rps; two and one give min(5.6 x 2, 10) / 3 = 3.3 rps a GPU, about twice
    the colocated 1.6."""
    per_gpu = split_goodput_per_gpu(5.6, 10.0, 2, 1)
    assert per_gpu == pytest.approx(10 / 3)
    assert round(per_gpu, 1) == 3.3 and round(per_gpu / 1.6) == 2
    assert best_split(5.6, 10.0, 3) == (2, 1, pytest.approx(10 / 3))


def test_best_split_stays_under_the_fluid_bound() -> None:
    for budget in (3, 5, 8, 16, 64):
        n_p, n_d, per_gpu = best_split(3.0, 7.0, budget, prefill_gpus=1, decode_gpus=2)
        assert n_p + 2 * n_d <= budget
        assert per_gpu <= 1 / (1 / 3.0 + 2 / 7.0) + 1e-12
    assert best_split(3.0, 7.0, 64, decode_gpus=2)[2] == pytest.approx(1 / (1 / 3 + 2 / 7),
                                                                      rel=0.02)
    with pytest.raises(ValueError, match="gpu_budget"):
        best_split(3.0, 7.0, 2, prefill_gpus=2)


def test_aggregated_point_equals_steps_computed_apart() -> None:
    for batch in (1, 37, 256, 300, 600):
        point = aggregated_point(LLAMA, H100, SHORT, batch)
        context = 256 + 512 // 2
        joins = batch / 512
        whole = math.floor(joins)
        plain = mixed_step(LLAMA, H100, batch, context).total_s if whole == 0 else step_time(
            LLAMA, H100, [context] * batch, [PrefillChunk(256)] * whole).total_s
        more = step_time(LLAMA, H100, [context] * batch, [PrefillChunk(256)] * (whole + 1))
        mean = (1 - (joins - whole)) * plain + (joins - whole) * more.total_s
        assert point.tpot_s == pytest.approx(mean)
        assert point.ttft_s == pytest.approx(mean / 2 + more.total_s)
        assert point.requests_per_s == pytest.approx(batch / (512 * mean))


def test_prefill_beside_the_decodes_slows_them() -> None:
    tpots = [aggregated_point(LLAMA, H100, LONG, b).tpot_s for b in (1, 4, 16, 64)]
    assert tpots == sorted(tpots)
    for batch in (1, 16, 64):
        alone = mixed_step(LLAMA, H100, batch, LONG.decode_context_tokens).total_s
        assert aggregated_point(LLAMA, H100, LONG, batch).tpot_s > alone
    # Long replies spread the prompts thin: TPOT tends to the decode-only step.
    thin = Workload(4096, 1_000_000, 1.0, 0.01)
    alone = mixed_step(LLAMA, H100, 4, thin.decode_context_tokens).total_s
    assert aggregated_point(LLAMA, H100, thin, 4).tpot_s == pytest.approx(alone, rel=1e-3)


def test_goodput_meets_its_targets_and_looser_targets_never_lower_it() -> None:
    best = aggregated_goodput(LLAMA, H100, LONG, max_batch=100)
    assert best is not None and best.meets(LONG)
    looser = Workload(4096, 256, 2.0, 0.020)
    assert aggregated_goodput(LLAMA, H100, looser, max_batch=100).requests_per_s >= (
        best.requests_per_s)
    decode_only = mixed_step(LLAMA, H100, 1, LONG.decode_context_tokens).total_s
    impossible = Workload(4096, 256, 1.0, decode_only * 0.99)
    assert aggregated_goodput(LLAMA, H100, impossible, max_batch=100) is None
    assert decode_rate_for_tpot(LLAMA, H100, impossible, max_batch=100) == (0, 0.0, 0.0)


def test_disaggregated_goodput_counts_the_handoff() -> None:
    fast = disaggregated_goodput(LLAMA, H100, LONG, max_batch=100, gpu_budget=8,
                                 bytes_per_s=get_link("nvlink4").bytes_per_s)
    assert fast.requests_per_s_per_gpu == pytest.approx(split_goodput_per_gpu(
        fast.prefill_requests_per_s, fast.decode_requests_per_s, fast.n_prefill,
        fast.n_decode))
    assert fast.decode_step_s <= LONG.tpot_target_s
    assert md1_ttft_s(fast.prefill_s, fast.prefill_requests_per_s) + fast.exposed_transfer_s \
        == pytest.approx(LONG.ttft_target_s)
    # A link so slow that the hand-off alone misses the TTFT target serves nothing.
    crawl = disaggregated_goodput(LLAMA, H100, LONG, max_batch=100, gpu_budget=8,
                                  bytes_per_s=1e8)
    assert crawl.exposed_transfer_s > LONG.ttft_target_s and crawl.requests_per_s_per_gpu == 0


def test_splitting_wins_for_long_prompts_at_a_tight_tpot_only() -> None:
    link = get_link("ib-400g").bytes_per_s
    for workload, split_wins in ((LONG, True), (SHORT, False)):
        together = aggregated_goodput(LLAMA, H100, workload, max_batch=100)
        apart = disaggregated_goodput(LLAMA, H100, workload, max_batch=100, gpu_budget=8,
                                      bytes_per_s=link)
        assert together is not None
        assert (apart.requests_per_s_per_gpu > together.requests_per_s_per_gpu) == split_wins


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="prompt_tokens"):
        Workload(0, 10, 1.0, 0.1)
    with pytest.raises(ValueError, match="tpot_target_s"):
        Workload(10, 10, 1.0, 0)
    with pytest.raises(ValueError, match="rate_per_s"):
        md1_ttft_s(0.5, 2.0)
    with pytest.raises(ValueError, match="layers"):
        layerwise_overlap(0.1, 0.1, 0)
    with pytest.raises(ValueError, match="transfer_s"):
        layerwise_overlap(0.1, -1.0, 4)


def test_a_chunked_prompt_equals_its_steps_computed_apart() -> None:
    batch, budget = 9, 1033  # chunks of 1,024 tokens: four steps for a 4,096-token prompt
    point = aggregated_point(LLAMA, H100, LONG, batch, max_num_batched_tokens=budget)
    contexts = [LONG.decode_context_tokens] * batch
    own = sum(step_time(LLAMA, H100, contexts, [PrefillChunk(1024, 1024 * i, last=i == 3)])
              .total_s for i in range(4))
    cycle = 256 / batch
    decode_only = mixed_step(LLAMA, H100, batch, LONG.decode_context_tokens).total_s
    tpot = (own + (cycle - 4) * decode_only) / cycle
    assert point.prompt_steps == 4 and point.keeps_up
    assert point.tpot_s == pytest.approx(tpot)
    assert point.ttft_s == pytest.approx(tpot / 2 + own)


def test_smaller_chunks_trade_the_first_token_for_the_others() -> None:
    points = [aggregated_point(LLAMA, H100, LONG, 9, max_num_batched_tokens=k)
              for k in (8192, 2057, 521)]
    tpots, ttfts = [p.tpot_s for p in points], [p.ttft_s for p in points]
    assert tpots == sorted(tpots, reverse=True) and ttfts == sorted(ttfts)
    # A budget that cannot prefill the prompts as fast as requests finish does not keep up.
    assert not aggregated_point(LLAMA, H100, LONG, 200, max_num_batched_tokens=300).keeps_up
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        aggregated_point(LLAMA, H100, LONG, 64, max_num_batched_tokens=64)
