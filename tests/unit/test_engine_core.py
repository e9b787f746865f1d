"""kvlib.engine.core: batched greedy outputs equal single-request ones, preemption included;
tokens stream per request; bad requests fail alone. Runs on the CPU."""

from __future__ import annotations

import random

import pytest

from kvlib.config import load_config
from kvlib.engine.core import Engine, EngineConfig, Request, serve_in_steps
from kvlib.nn.decoder import TinyDecoder, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(load_config(tiny_config(layers=2, max_positions=256)), seed=0)


def workload(n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(f"r{i}", [rng.randrange(512) for _ in range(rng.randrange(3, 30))],
                rng.randrange(1, 16))
        for i in range(n)
    ]


def alone(model: TinyDecoder, request: Request) -> list[int]:
    engine = Engine(model, EngineConfig(num_blocks=64, block_size=4, max_num_seqs=1))
    return engine.run([request])[0].output_tokens


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_batched_outputs_equal_single_request_outputs(model: TinyDecoder, policy: str) -> None:
    requests = workload(10)
    # A pool this small forces preemptions; the outputs must not change.
    engine = Engine(model, EngineConfig(num_blocks=14, block_size=4, max_num_seqs=4,
                                        policy=policy))  # type: ignore[arg-type]
    results = engine.run(requests)
    assert sum(r.preemptions for r in results) > 0
    for request, result in zip(requests, results, strict=True):
        assert result.error is None
        assert len(result.output_tokens) == request.max_new_tokens
        assert result.output_tokens == alone(model, request), request.request_id


def test_tokens_stream_as_they_are_decoded(model: TinyDecoder) -> None:
    streamed: dict[str, list[int]] = {}
    requests = [
        Request(r.request_id, r.prompt, r.max_new_tokens,
                on_token=lambda rid, tok: streamed.setdefault(rid, []).append(tok))
        for r in workload(4, seed=1)
    ]
    results = Engine(model, EngineConfig(num_blocks=64, block_size=4)).run(requests)
    assert {r.request_id: r.output_tokens for r in results} == streamed
    assert all(r.ttft_s is not None and r.finish_s is not None for r in results)


def test_a_bad_request_fails_alone(model: TinyDecoder) -> None:
    good = workload(2, seed=2)
    bad = [
        Request("empty", [], 4),
        Request("vocab", [1, 2, 512], 4),
        Request("too-long", [1] * 250, 10),  # the model's context is 256
        Request("never-fits", [1] * 40, 30),  # 70 tokens need 18 blocks of 4; the pool has 16
        Request("zero-output", [1, 2], 0),
    ]
    engine = Engine(model, EngineConfig(num_blocks=16, block_size=4))
    results = {r.request_id: r for r in engine.run(good + bad)}
    assert all(results[r.request_id].error is None for r in good)
    assert all(len(results[r.request_id].output_tokens) == r.max_new_tokens for r in good)
    messages = {name: results[name].error or "" for name in
                ("empty", "vocab", "too-long", "never-fits", "zero-output")}
    assert "empty prompt" in messages["empty"]
    assert "[0, 512)" in messages["vocab"]
    assert "exceeds max_model_len (256)" in messages["too-long"]
    assert "could never run" in messages["never-fits"]
    assert "at least 1" in messages["zero-output"]
    assert all(not results[name].output_tokens for name in messages)


def test_continuous_batching_mixes_prefill_and_decode(model: TinyDecoder) -> None:
    requests = [Request("a", [1, 2, 3], 6), Request("b", [4, 5], 3, arrival_s=1.0)]
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4, max_num_seqs=4))
    for request in requests:
        engine.submit(request)
    engine.step(0.0)
    engine.step(0.5)  # b has not arrived: a decodes alone
    engine.step(1.0)  # b arrives and joins a's decode step
    last = engine.steps[-1]
    assert last.prefill_tokens == 2 and last.decode_tokens == 1


def test_static_batching_leaves_finished_slots_empty(model: TinyDecoder) -> None:
    requests = [Request("short", [1, 2], 1), Request("long", [3, 4], 8), Request("late", [5], 2)]
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4, max_num_seqs=2,
                                        policy="static"))
    engine.run(requests)
    prefills = [s.step for s in engine.steps if s.prefill_tokens]
    assert prefills == [0, 8]  # "late" waits for "long" to finish its 8 tokens


def test_the_cache_holds_what_kvlib_says(model: TinyDecoder) -> None:
    from kvlib.sizing import summed_page_bytes

    engine = Engine(model, EngineConfig(num_blocks=8, block_size=4))
    assert engine.kv.nbytes == 8 * 2 * summed_page_bytes(model.cfg, 4, "fp32")  # float64 elements


@pytest.mark.parametrize("budget", [4, 7, 16])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_chunked_prefill_outputs_equal_unchunked_and_single_request(
    model: TinyDecoder, budget: int, prefix_caching: bool
) -> None:
    """A token budget smaller than most prompts splits them over several steps; with or
    without prefix caching, a small pool (preemptions) and a shared prefix, every request's
    greedy tokens equal the unchunked engine's and the request run alone."""
    shared = list(range(100, 112))  # three blocks of 4 every prompt starts with
    requests = [Request(r.request_id, shared + list(r.prompt), r.max_new_tokens)
                for r in workload(8, seed=3)]
    unchunked = Engine(model, EngineConfig(num_blocks=64, block_size=4, max_num_seqs=4)).run(
        requests
    )
    config = EngineConfig(num_blocks=24, block_size=4, max_num_seqs=4,
                          max_num_batched_tokens=budget,
                          enable_prefix_caching=prefix_caching)
    engine = Engine(model, config)
    chunked = engine.run(requests)
    assert all(s.prefill_tokens + s.decode_tokens <= budget for s in engine.steps)
    assert any(s.prefill_tokens and s.decode_tokens for s in engine.steps)  # mixed steps
    for request, a, b in zip(requests, unchunked, chunked, strict=True):
        assert b.error is None
        assert b.output_tokens == a.output_tokens == alone(model, request), request.request_id
    if prefix_caching:
        assert any(r.cached_prompt_tokens >= len(shared) for r in chunked)


def test_a_long_prompt_no_longer_stalls_the_decodes(model: TinyDecoder) -> None:
    """Without a budget a 200-token prompt is one step that every decode waits behind; with
    a budget of 32 each step computes at most 32 tokens, so running sequences keep
    decoding while the long prompt is prefilled in chunks."""
    short = [Request(f"s{i}", [1 + i, 2, 3], 20) for i in range(3)]
    long = Request("long", [5] * 200, 4, arrival_s=1.0)

    def run(budget: int | None) -> Engine:
        clock = [0.0]
        engine = Engine(model, EngineConfig(num_blocks=128, block_size=4, max_num_seqs=4,
                                            max_num_batched_tokens=budget),
                        clock=lambda: clock[0])
        for request in [*short, long]:
            engine.submit(request)
        while engine.scheduler.has_work or engine._pending:
            engine.step(clock[0])
            clock[0] += 1.0
        return engine

    whole, chunked = run(None), run(32)
    assert max(s.prefill_tokens for s in whole.steps) == 200
    assert max(s.prefill_tokens + s.decode_tokens for s in chunked.steps) <= 32
    prefill_steps = [s for s in chunked.steps if s.prefill_tokens and s.step > 0]
    assert len(prefill_steps) == -(-200 // (32 - 3))  # 29 prompt tokens beside 3 decodes
    assert all(s.decode_tokens == 3 for s in prefill_steps)  # every short one kept decoding


def test_a_stop_token_ends_the_reply(model: TinyDecoder) -> None:
    free_run = Engine(model, EngineConfig(num_blocks=64, block_size=4)).run(
        [Request("a", [7, 8, 9], 12)]
    )[0]
    stop = free_run.output_tokens[4]
    first = free_run.output_tokens.index(stop)
    result = Engine(model, EngineConfig(num_blocks=64, block_size=4)).run(
        [Request("a", [7, 8, 9], 12, stop_token_ids=(stop,))]
    )[0]
    assert result.output_tokens == free_run.output_tokens[: first + 1]
    assert result.finish_reason == "stop" and free_run.finish_reason == "length"


def test_max_model_len_bounds_a_request_that_sets_no_limit(model: TinyDecoder) -> None:
    engine = Engine(model, EngineConfig(num_blocks=64, block_size=4, max_model_len=40))
    result = engine.run([Request("open-ended", [3] * 30)])[0]
    assert len(result.output_tokens) == 10 and result.finish_reason == "length"
    too_long = engine.submit(Request("too-long", [3] * 30, 11))
    assert "exceeds max_model_len (40)" in (too_long.error or "")
    with pytest.raises(ValueError, match="max_model_len"):
        Engine(model, EngineConfig(num_blocks=8, max_model_len=10_000))


def test_itl_and_ttft_come_from_the_token_times(model: TinyDecoder) -> None:
    clock = [0.0]
    engine = Engine(model, EngineConfig(num_blocks=64, block_size=4),
                    clock=lambda: clock[0])
    engine.submit(Request("a", [1, 2, 3], 5, arrival_s=0.0))
    while engine.scheduler.has_work or engine._pending:
        clock[0] += 0.5
        engine.step(clock[0])
    result = engine.results["a"]
    assert result.token_times_s == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert result.ttft_s == 0.5 and result.itl_s == [0.5] * 4


def test_serve_in_steps_counts_time_in_forward_passes(model: TinyDecoder) -> None:
    requests = [Request("a", [1, 2, 3], 4), Request("b", [4, 5], 2, arrival_s=2.0)]
    seen: list[int] = []
    engine = serve_in_steps(model, EngineConfig(num_blocks=32, block_size=4), requests,
                            after_step=lambda e: seen.append(len(e.steps)))
    a, b = engine.results["a"], engine.results["b"]
    assert a.token_times_s == [0.0, 1.0, 2.0, 3.0]  # one token a step from step 0
    assert b.first_token_s == 2.0 and b.ttft_s == 0.0  # prefilled the step it arrived
    assert seen == list(range(1, len(engine.steps) + 1))
    assert a.output_tokens == alone(model, requests[0])
