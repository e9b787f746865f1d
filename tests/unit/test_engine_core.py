"""kvlib.engine.core: batched greedy outputs equal single-request ones, preemption included;
tokens stream per request; bad requests fail alone. Runs on the CPU."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch

from kvlib.config import load_config
from kvlib.engine.core import Engine, EngineConfig, Request
from kvlib.nn.decoder import TinyDecoder, tiny_config


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(load_config(tiny_config(layers=2, max_positions=256)), seed=0)


def workload(n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(f"r{i}", [rng.randrange(512) for _ in range(rng.randrange(3, 30))],
                rng.randrange(1, 16))
        for i in range(n)
    ]  # fmt: skip


def alone(model: TinyDecoder, request: Request) -> list[int]:
    engine = Engine(model, EngineConfig(num_blocks=64, block_size=4, max_batch_size=1))
    return engine.run([request])[0].output_tokens


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_batched_outputs_equal_single_request_outputs(model: TinyDecoder, policy: str) -> None:
    requests = workload(10)
    # A pool this small forces preemptions; the outputs must not change.
    engine = Engine(model, EngineConfig(num_blocks=14, block_size=4, max_batch_size=4,
                                        policy=policy))  # type: ignore[arg-type]  # fmt: skip
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
    ]  # fmt: skip
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
                ("empty", "vocab", "too-long", "never-fits", "zero-output")}  # fmt: skip
    assert "empty prompt" in messages["empty"]
    assert "[0, 512)" in messages["vocab"]
    assert "context (256)" in messages["too-long"]
    assert "could never run" in messages["never-fits"]
    assert "at least 1" in messages["zero-output"]
    assert all(not results[name].output_tokens for name in messages)


def test_continuous_batching_mixes_prefill_and_decode(model: TinyDecoder) -> None:
    requests = [Request("a", [1, 2, 3], 6), Request("b", [4, 5], 3, arrival_s=1.0)]
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4, max_batch_size=4))
    for request in requests:
        engine.submit(request)
    engine.step(0.0)
    engine.step(0.5)  # b has not arrived: a decodes alone
    engine.step(1.0)  # b arrives and joins a's decode step
    last = engine.steps[-1]
    assert last.prefill_tokens == 2 and last.decode_tokens == 1


def test_static_batching_leaves_finished_slots_empty(model: TinyDecoder) -> None:
    requests = [Request("short", [1, 2], 1), Request("long", [3, 4], 8), Request("late", [5], 2)]
    engine = Engine(model, EngineConfig(num_blocks=32, block_size=4, max_batch_size=2,
                                        policy="static"))  # fmt: skip
    engine.run(requests)
    prefills = [s.step for s in engine.steps if s.prefill_tokens]
    assert prefills == [0, 8]  # "late" waits for "long" to finish its 8 tokens


def test_the_cache_holds_what_kvlib_says(model: TinyDecoder) -> None:
    from kvlib.sizing import page_bytes

    engine = Engine(model, EngineConfig(num_blocks=8, block_size=4))
    assert engine.kv.nbytes == 8 * 2 * page_bytes(model.cfg, 4, "fp32")  # float64 elements
