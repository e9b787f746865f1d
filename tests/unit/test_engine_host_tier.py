"""kvlib.engine.host_tier: blocks the GPU pool evicts come back from host memory; outputs do
not change, the prefix hit rate rises, and the copy costs the tiers formula's time."""

from __future__ import annotations

import pytest
import torch

from kvlib.config import load_config
from kvlib.engine.core import Engine, EngineConfig, Request
from kvlib.engine.gpu_clock import GpuClock
from kvlib.engine.host_tier import HostTieredEngine, MultiTurnRun, multi_turn, run_multi_turn
from kvlib.nn.decoder import TinyDecoder, tiny_config
from kvlib.tiers.links import get_link
from kvlib.tiers.reload import reload_s

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PCIE5 = get_link("pcie5")
# A GPU pool of 80 blocks holds about one conversation: six of them evict each other
# between turns (think time 20 steps).
CONFIG = EngineConfig(num_blocks=80, block_size=16, max_num_seqs=4, enable_prefix_caching=True,
                      max_num_batched_tokens=2048)
SESSIONS = multi_turn(6, 3, prompt_tokens=384, message_tokens=32, reply_tokens=8,
                      think_steps=20)


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(load_config(tiny_config(layers=2, max_positions=1024)), seed=0)


@pytest.fixture(scope="module")
def runs(model: TinyDecoder) -> tuple[MultiTurnRun, MultiTurnRun]:
    # module-scoped, so set up before the one_torch_thread fixture: one thread here too
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    clock = GpuClock.named()
    try:
        without = run_multi_turn(model, CONFIG, SESSIONS, host_blocks=None, link=PCIE5,
                                 gpu_clock=clock)
        with_tier = run_multi_turn(model, CONFIG, SESSIONS, host_blocks=1024, link=PCIE5,
                                   gpu_clock=clock)
    finally:
        torch.set_num_threads(threads)
    return without, with_tier


def test_outputs_do_not_change(runs: tuple[MultiTurnRun, MultiTurnRun]) -> None:
    without, with_tier = runs
    assert with_tier.reloaded_tokens > 0
    assert with_tier.outputs == without.outputs
    assert len(with_tier.outputs) == 6 * 3
    assert all(len(tokens) == 8 for tokens in with_tier.outputs.values())


def test_a_later_turn_equals_its_prompt_decoded_alone(
    model: TinyDecoder, runs: tuple[MultiTurnRun, MultiTurnRun]
) -> None:
    with_tier = runs[1]
    for rid in ("s0/2", "s3/1"):
        alone = Engine(model, EngineConfig(num_blocks=64, block_size=16, max_num_seqs=1))
        result = alone.run([Request(rid, with_tier.prompts[rid], 8)])[0]
        assert result.output_tokens == with_tier.outputs[rid]


def test_the_tier_raises_the_hit_rate_and_cuts_ttft(
    runs: tuple[MultiTurnRun, MultiTurnRun]
) -> None:
    without, with_tier = runs
    assert with_tier.hit_rate > without.hit_rate + 0.3
    assert with_tier.mean_ttft_s() < without.mean_ttft_s()
    # first turns find nothing either way
    assert with_tier.mean_ttft_s(first_turns=True) == pytest.approx(
        without.mean_ttft_s(first_turns=True), rel=0.2)


def test_copies_cost_the_tiers_reload_time(runs: tuple[MultiTurnRun, MultiTurnRun]) -> None:
    with_tier = runs[1]
    llama = load_config("Llama-3.1-8B")
    # each copy is priced alone; with no setup time they add up to one of all the tokens
    assert with_tier.reload_s == pytest.approx(
        reload_s(llama, with_tier.reloaded_tokens, PCIE5.bytes_per_s))


def test_a_tiny_host_pool_drops_its_oldest_blocks(model: TinyDecoder) -> None:
    engine = HostTieredEngine(model, CONFIG, 4, PCIE5)
    engine.run([Request(f"r{i}", [i] * 700, 2) for i in range(4)])
    assert len(engine.host.blocks) == 4
    assert engine.host.dropped_blocks == engine.host.offloaded_blocks - 4 > 0


def test_prefix_caching_is_required(model: TinyDecoder) -> None:
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        HostTieredEngine(model, EngineConfig(num_blocks=8), 4, PCIE5)


def _run(model: TinyDecoder, num_blocks: int, think_steps: int,
         host_blocks: int | None) -> MultiTurnRun:
    config = EngineConfig(num_blocks=num_blocks, block_size=16, max_num_seqs=4,
                          enable_prefix_caching=True, max_num_batched_tokens=2048)
    sessions = multi_turn(6, 3, prompt_tokens=384, message_tokens=32, reply_tokens=8,
                          think_steps=think_steps)
    return run_multi_turn(model, config, sessions, host_blocks=host_blocks, link=PCIE5,
                          gpu_clock=GpuClock.named())


def test_blocks_are_copied_back_only_for_a_request_the_step_admits(
    model: TinyDecoder,
) -> None:
    # No think time: the conversations run together in a pool of about one of them, and
    # most steps cannot admit the next waiting turn. A copy made for it anyway is reused
    # before it runs and made again the next step; every copied token must be a hit.
    with_tier = _run(model, 80, 0, 1024)
    without = _run(model, 80, 0, None)
    assert 0 < with_tier.reloaded_tokens <= with_tier.prefix_hit_tokens
    assert with_tier.mean_ttft_s() < without.mean_ttft_s()


def test_a_copy_back_never_evicts_the_prefix_it_completes(model: TinyDecoder) -> None:
    # A pool of twice that: a later turn finds its first blocks still on the GPU (free,
    # at the head of the eviction queue) and the rest only on the host. Copying the rest
    # must not evict the first ones, or the turn finds no prefix at all.
    with_tier = _run(model, 160, 5, 1024)
    without = _run(model, 160, 5, None)
    assert with_tier.reloaded_tokens > 0
    for rid, result in without.results.items():
        assert with_tier.results[rid].cached_prompt_tokens >= result.cached_prompt_tokens, rid
    assert with_tier.hit_rate > without.hit_rate
