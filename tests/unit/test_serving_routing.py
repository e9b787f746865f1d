"""kvlib.serving.routing: prefix caches on replicas, the routers, the simulation and its
intervals, checked against closed forms and against each other."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.paging.prefix import BlockHash, block_hashes, cacheable_blocks
from kvlib.serving.routing import (
    ConsistentHash,
    LeastLoaded,
    LinearService,
    PrefixCache,
    PrefixIndex,
    RoundRobin,
    SessionWorkload,
    StepService,
    compare_routers,
    expected_hit_rate,
    seed_interval,
    simulate_routing,
)
from kvlib.step import PrefillChunk, mixed_step, step_time

SERVICE = LinearService(prefill_s_per_token=1e-4, tpot_s=0.01)
# Many sessions in flight at once, so that round-robin scatters each one's turns.
SESSIONS = SessionWorkload(sessions=60, turns=5, system_prompts=2, system_prompt_tokens=0,
                           message_tokens=40, output_tokens=40, sessions_per_s=5.0, think_s=5.0)
SHARED = dataclasses.replace(SESSIONS, system_prompt_tokens=96, system_prompts=2)
ROUTERS = [RoundRobin(), LeastLoaded(), LeastLoaded("tokens"), ConsistentHash(),
           ConsistentHash("prefix"), PrefixIndex(None), PrefixIndex(1.25)]


def run(router, workload=SESSIONS, replicas=4, cache_blocks=None, seed=0):
    return simulate_routing(workload, router, replicas=replicas, cache_blocks=cache_blocks,
                            service=SERVICE, seed=seed)


def chain(tag: int, blocks: int) -> list[BlockHash]:
    return block_hashes([tag] * 4 + list(range(4 * blocks - 4)), 4)


# --- the cache --------------------------------------------------------------------------


def test_cache_holds_a_prefix_and_evicts_tails_first() -> None:
    cache = PrefixCache(capacity_blocks=10)
    a, b = chain(1, 6), chain(2, 6)
    cache.store(a)
    cache.store(b)  # 12 blocks: a's two tail blocks go, its head stays
    assert cache.cached_blocks(a) == 4 and cache.cached_blocks(b) == 6 and len(cache) == 10
    cache.store(a[:2])  # a's head becomes the most recent; a[2:4] are now the oldest
    cache.store(chain(3, 2))
    assert cache.cached_blocks(a) == 2 and cache.cached_blocks(b) == 6
    cache.store(chain(4, 3))  # then b, tail first
    assert cache.cached_blocks(a) == 2 and cache.cached_blocks(b) == 3


def test_cached_blocks_equals_a_walk_after_random_stores() -> None:
    rng = random.Random(7)
    chains = [chain(t, 12) for t in range(6)]
    cache = PrefixCache(capacity_blocks=25)
    for _ in range(300):
        cache.store(rng.choice(chains)[: rng.randint(1, 12)])
        for c in chains:
            walk = next((i for i, h in enumerate(c) if h not in cache), len(c))
            assert cache.cached_blocks(c) == walk
            assert all(h not in cache for h in c[walk:])  # what is held is a prefix


# --- the workload and the simulation ------------------------------------------------------


def test_prompt_lengths_follow_the_conversation() -> None:
    w = SHARED
    assert [w.prompt_tokens(k) for k in (1, 2, 3)] == [136, 216, 296]
    assert w.cached_after(2) == 216 + 40 - 1
    assert w.prompt_tokens_total == w.sessions * sum(w.prompt_tokens(k) for k in range(1, 6))


def test_a_seed_fixes_the_run() -> None:
    first, again, other = run(PrefixIndex(), SHARED), run(PrefixIndex(), SHARED), run(
        PrefixIndex(), SHARED, seed=1)
    assert np.array_equal(first.replica, again.replica)
    assert np.array_equal(first.hit_tokens, again.hit_tokens)
    assert not np.array_equal(first.arrival_s, other.arrival_s)
    assert len(first.replica) == SHARED.requests


def test_one_replica_gives_every_router_the_same_hits() -> None:
    hits = {r.name: run(r, SHARED, replicas=1, cache_blocks=40).hit_tokens for r in ROUTERS}
    reference = hits["round-robin"]
    assert reference.sum() > 0
    assert all(np.array_equal(h, reference) for h in hits.values())


def test_session_hashing_with_an_unbounded_cache_hits_every_repeat_turn() -> None:
    result = run(ConsistentHash("session"), SESSIONS, replicas=4)
    b = SESSIONS.block_size
    for turn, prompt, hit in zip(result.turn, result.prompt_tokens, result.hit_tokens,
                                 strict=True):
        previous = SESSIONS.cached_after(int(turn) - 1) if turn > 1 else 0
        assert hit == b * cacheable_blocks(previous, int(prompt), b)
    assert result.hit_rate == pytest.approx(expected_hit_rate(SESSIONS, 1), abs=1e-12)


def test_round_robin_matches_the_scattered_closed_form() -> None:
    """Each turn on a replica drawn 1 in N: the closed form lies in the 95% interval."""
    [rr] = compare_routers(SESSIONS, [RoundRobin()], replicas=4, cache_blocks=None,
                           service=SERVICE, seeds=20)
    expected = expected_hit_rate(SESSIONS, 4)
    assert rr.hit_rate.contains(expected), (rr.hit_rate, expected)
    assert expected < expected_hit_rate(SESSIONS, 1) - 0.2  # scattering costs hits


def test_prefix_index_beats_round_robin_with_separate_intervals() -> None:
    rr, index = compare_routers(SHARED, [RoundRobin(), PrefixIndex(1.25)], replicas=4,
                                cache_blocks=60, service=SERVICE, seeds=10)
    assert index.hit_rate.low > rr.hit_rate.high
    assert index.mean_prefill_s.high < rr.mean_prefill_s.low


def test_round_robin_is_even_for_equal_requests() -> None:
    single = dataclasses.replace(SESSIONS, turns=1, sessions=40)  # no reuse: equal requests
    result = run(RoundRobin(), single, replicas=4)
    assert result.hit_rate == 0
    assert result.request_imbalance == 1.0
    assert result.work_imbalance == pytest.approx(1.0, abs=1e-12)
    assert result.work_cv == pytest.approx(0.0, abs=1e-12)


def test_hashing_the_shared_prompt_piles_everything_on_one_replica() -> None:
    one_prompt = dataclasses.replace(SHARED, system_prompts=1)
    piled = run(ConsistentHash("prefix"), one_prompt, replicas=4)
    assert piled.request_imbalance == 4.0  # every request on one of four replicas
    bounded = run(ConsistentHash("prefix", load_factor=1.25), one_prompt, replicas=4)
    assert bounded.request_imbalance < 2.0


def test_the_load_bound_trades_hits_for_balance() -> None:
    free, bounded = (run(PrefixIndex(c), SHARED) for c in (None, 1.0))
    assert bounded.request_imbalance < free.request_imbalance
    assert bounded.hit_rate < free.hit_rate


def test_piling_up_overflows_a_small_cache() -> None:
    """With little cache, the unbounded index crowds one replica's cache and hits less
    than the bounded one: concentration costs hits as well as balance."""
    free, bounded = (run(PrefixIndex(c), SHARED, cache_blocks=60) for c in (None, 1.25))
    assert free.request_imbalance > 2 > bounded.request_imbalance
    assert free.hit_rate < bounded.hit_rate


def test_intervals_shrink_with_more_seeds() -> None:
    widths = [compare_routers(SHARED, [RoundRobin()], replicas=4, cache_blocks=60,
                              service=SERVICE, seeds=n)[0].hit_rate.half_width for n in (10, 40)]
    assert widths[1] < widths[0]


def test_seed_interval_is_the_t_interval() -> None:
    values = np.arange(10.0)
    estimate = seed_interval(values)
    # t(0.975, 9) = 2.262 (tables); sd of 0..9 = 3.0277
    assert estimate.value == 4.5
    assert estimate.half_width == pytest.approx(2.262 * 3.02765 / np.sqrt(10), rel=1e-3)


def test_step_service_is_the_step_model() -> None:
    cfg, gpu = load_config("Llama-3.1-8B"), get_gpu("H100-SXM")
    service = StepService(cfg, gpu, decode_batch=16, context_tokens=2_000)
    assert service.tpot_s == mixed_step(cfg, gpu, 16, 2_000).total_s
    expected = step_time(cfg, gpu, [], [PrefillChunk(1_000, 3_000)]).total_s
    assert service.prefill_s(4_000, 3_000) == expected
    assert service.prefill_s(4_000, 3_000) < service.prefill_s(4_000, 0)
    assert service.service_s(4_000, 0, 10) == pytest.approx(
        service.prefill_s(4_000, 0) + 10 * service.tpot_s)


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [
    ("sessions", 0), ("turns", 1.5), ("system_prompts", 0), ("system_prompt_tokens", -1),
    ("message_tokens", 0), ("output_tokens", 0), ("sessions_per_s", 0.0),
    ("think_s", -1.0), ("block_size", 0),
])
def test_a_bad_workload_names_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(SESSIONS, **{field: value})


@pytest.mark.parametrize(("call", "name"), [
    (lambda: run(RoundRobin(), replicas=0), "replicas"),
    (lambda: run(RoundRobin(), cache_blocks=0), "cache_blocks"),
    (lambda: run(RoundRobin(), seed=-1), "seed"),
    (lambda: PrefixIndex(load_factor=0.5), "load_factor"),
    (lambda: ConsistentHash(key="user"), "key"),
    (lambda: ConsistentHash(virtual_nodes=0), "virtual_nodes"),
    (lambda: LeastLoaded(by="bytes"), "by"),
    (lambda: LinearService(0.0, 0.01), "prefill_s_per_token"),
    (lambda: compare_routers(SESSIONS, [RoundRobin()], replicas=2, cache_blocks=None,
                             service=SERVICE, seeds=5), "seeds"),
    (lambda: compare_routers(SESSIONS, [], replicas=2, cache_blocks=None,
                             service=SERVICE, seeds=10), "routers"),
    (lambda: seed_interval([0.5] * 3), "seeds"),
    (lambda: run("round-robin"), "router"),
    (lambda: simulate_routing(SESSIONS, RoundRobin(), replicas=2, cache_blocks=None,
                              service=0.1, seed=0), "service"),
])
def test_bad_input_names_the_argument(call, name: str) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        call()
