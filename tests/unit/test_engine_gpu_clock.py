"""kvlib.engine.gpu_clock: each engine step priced by the step model on a named GPU; the
modelled times leave the outputs alone, add up to the step model's, and show the
inter-token spike of a long prompt chunk and the time a preemption costs."""

from __future__ import annotations

import pytest

from kvlib.config import load_config
from kvlib.engine.core import Engine, EngineConfig, Request, serve_in_steps
from kvlib.engine.gpu_clock import DEFAULT_GPU, DEFAULT_MODEL, GpuClock
from kvlib.engine.scheduler import Chunk, Plan, SeqState
from kvlib.hardware import get_gpu
from kvlib.nn.decoder import TinyDecoder, tiny_config
from kvlib.step import ASSUMED_MFU, PrefillChunk, step_time

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLOCK = GpuClock.named()


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(load_config(tiny_config(layers=2, max_positions=256)), seed=0)


def test_the_default_clock_is_the_chapters_model_and_gpu() -> None:
    assert (CLOCK.cfg.name, CLOCK.gpu.name, CLOCK.mfu) == (DEFAULT_MODEL, DEFAULT_GPU,
                                                           ASSUMED_MFU)
    assert CLOCK.label == f"{DEFAULT_MODEL} on {DEFAULT_GPU} at MFU {ASSUMED_MFU:g}"


def test_a_plan_is_priced_as_the_step_model_prices_its_chunks() -> None:
    """Decodes read the tokens computed before the step; a prompt chunk after ``start``
    cached tokens samples only when it ends the prompt."""
    decoding = SeqState("d", [1] * 40, 8, 0.0, generated=[5, 6])
    prompt = SeqState("p", [2] * 300, 8, 0.0)
    plan = Plan(decode=[decoding], prefill=[prompt],
                chunks=[Chunk.of(decoding, 41, 1), Chunk.of(prompt, 100, 150)])
    expected = step_time(load_config(DEFAULT_MODEL), get_gpu(DEFAULT_GPU), [41],
                         [PrefillChunk(150, 100, last=False)]).total_s
    cost = CLOCK.cost(plan)
    assert cost.step_s == pytest.approx(expected, rel=1e-12)
    assert (cost.recompute_s, cost.recompute_tokens) == (0.0, 0)


def test_modelled_times_add_up_and_leave_outputs_alone(model: TinyDecoder) -> None:
    requests = [Request(f"r{i}", [i + 1] * (8 + 5 * i), 6) for i in range(5)]
    config = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=3,
                          max_num_batched_tokens=16)
    plain = serve_in_steps(model, config, requests)
    timed = serve_in_steps(model, config, requests, gpu_clock=CLOCK)
    for rid, result in timed.results.items():
        assert result.output_tokens == plain.results[rid].output_tokens
        assert plain.results[rid].modelled_ttft_s is None
        # Each token's modelled time is the sum of the steps up to the one that made it.
        assert result.modelled_ttft_s is not None and result.modelled_ttft_s > 0
        assert all(gap > 0 for gap in result.modelled_itl_s)
    total = sum(s.modelled_s or 0.0 for s in timed.steps)
    last = max(r.modelled_token_times_s[-1] for r in timed.results.values())
    assert last == pytest.approx(total, rel=1e-12)
    assert all(s.modelled_s is None for s in plain.steps)


def test_a_large_budget_makes_the_decodes_wait_for_a_long_prompt(model: TinyDecoder) -> None:
    """One stream decodes while a long prompt arrives: with no budget the prompt is one
    step and the stream's largest gap is that step; a small budget splits it."""
    requests = [Request("stream", [7] * 8, 12), Request("long", [9] * 200, 2, arrival_s=3.0)]
    gaps = {}
    for budget in (None, 32):
        config = EngineConfig(num_blocks=96, block_size=16, max_num_seqs=4,
                              max_num_batched_tokens=budget)
        engine = serve_in_steps(model, config, requests, gpu_clock=CLOCK)
        gaps[budget] = max(engine.results["stream"].modelled_itl_s)
    decode_alone = step_time(CLOCK.cfg, CLOCK.gpu, [10]).total_s
    whole_prompt = step_time(CLOCK.cfg, CLOCK.gpu, [11], [PrefillChunk(200)]).total_s
    assert gaps[None] == pytest.approx(whole_prompt, rel=0.05)
    assert decode_alone < gaps[32] < gaps[None]


def test_a_preemption_costs_its_recompute(model: TinyDecoder) -> None:
    requests = [Request(f"r{i}", [i + 3] * 20, 12) for i in range(4)]
    config = EngineConfig(num_blocks=14, block_size=4, max_num_seqs=4)
    engine = serve_in_steps(model, config, requests, gpu_clock=CLOCK)
    assert sum(r.preemptions for r in engine.results.values()) > 0
    recompute = [s for s in engine.steps if s.recompute_tokens]
    assert recompute, "a preempted sequence is recomputed"
    for s in recompute:
        assert s.modelled_s is not None and 0 < s.recompute_s <= s.modelled_s
    roomy = serve_in_steps(model, EngineConfig(num_blocks=64, block_size=4, max_num_seqs=4),
                           requests, gpu_clock=CLOCK)
    assert sum(r.preemptions for r in roomy.results.values()) == 0
    for rid, result in engine.results.items():
        assert result.output_tokens == roomy.results[rid].output_tokens


def test_run_resets_the_modelled_clock(model: TinyDecoder) -> None:
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4), gpu_clock=CLOCK)
    first = engine.run([Request("a", [1, 2, 3], 3)])[0]
    assert first.modelled_arrival_s == 0.0
    assert first.modelled_ttft_s == pytest.approx(
        step_time(CLOCK.cfg, CLOCK.gpu, [], [PrefillChunk(3)]).total_s)
