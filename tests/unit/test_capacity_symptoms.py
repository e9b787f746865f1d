"""kvlib.capacity.symptoms: the KV-bound signature, on hand-made step records and on the engine."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest

from kvlib.capacity.symptoms import arithmetic_share, diagnose_steps
from kvlib.config import load_config
from kvlib.engine.core import Engine, EngineConfig, Request
from kvlib.nn.decoder import TinyDecoder, tiny_config


@dataclass(frozen=True)
class Step:
    used_blocks: int
    running: int
    waiting: int
    preempted: int = 0


def test_a_step_is_kv_bound_when_full_with_a_queue_and_free_slots() -> None:
    steps = [
        Step(95, 3, 4),  # full, waiting, batch below the cap: the signature
        Step(100, 3, 4, preempted=1),  # the same, with a preemption
        Step(100, 8, 4),  # full but the batch is at its cap: the cap limits
        Step(40, 3, 4),  # a queue with room in the pool: not the pool's doing
        Step(100, 3, 0),  # full but nobody waits
    ]
    found = diagnose_steps(steps, num_blocks=100, max_num_seqs=8)
    assert found.kv_bound_steps == 2 and found.kv_bound_share == pytest.approx(0.4)
    assert found.preemptions == 1 and found.peak_waiting == 4
    assert found.peak_usage == 1.0 and found.mean_usage == pytest.approx(435 / 500)
    assert found.mean_running == pytest.approx(20 / 5)


def test_records_from_another_pool_are_refused() -> None:
    with pytest.raises(ValueError, match="pass the pool the records came from"):
        diagnose_steps([Step(120, 1, 0)], num_blocks=100, max_num_seqs=8)
    with pytest.raises(ValueError, match="full_fraction"):
        diagnose_steps([], num_blocks=100, max_num_seqs=8, full_fraction=0)
    assert diagnose_steps([], 10, 2).kv_bound_share == 0.0


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_engine_shows_the_signature_only_when_its_pool_is_small() -> None:
    model = TinyDecoder(load_config(tiny_config(layers=1, hidden=64, heads=2, kv_heads=1,
                                                max_positions=256)), seed=0)
    rng = random.Random(3)
    requests = [Request(f"r{i}", [rng.randrange(512) for _ in range(rng.randint(8, 24))],
                        rng.randint(20, 40)) for i in range(12)]
    small = Engine(model, EngineConfig(num_blocks=12, block_size=8, max_num_seqs=6))
    results = small.run(requests)
    tight = diagnose_steps(small.steps, 12, 6)
    assert tight.kv_bound_steps > 0 and tight.peak_usage == 1.0
    assert tight.preemptions == sum(r.preemptions for r in results) > 0
    roomy = Engine(model, EngineConfig(num_blocks=96, block_size=8, max_num_seqs=6))
    roomy.run(requests)
    loose = diagnose_steps(roomy.steps, 96, 6)
    assert loose.kv_bound_steps == 0 and loose.preemptions == 0
    assert loose.mean_running > tight.mean_running  # the same cap of 6


def test_arithmetic_share_counts_only_the_prompt_tokens_computed() -> None:
    """The document assistant's own rates with prefix caching on: the hits cost no
    arithmetic, and counting them overstates the share by the shared prompt's FLOPs."""
    from kvlib.capacity.assessment import assess, decode_flops_per_token
    from kvlib.capacity.examples import document_assistant

    cap = assess(dataclasses.replace(document_assistant(), prefix_caching=True))
    s = cap.scenario
    requests_per_s = cap.tokens_per_s / s.output_tokens
    prompt, hits = requests_per_s * s.prompt_tokens, requests_per_s * cap.shared_blocks * 16
    flops = decode_flops_per_token(s.model, s.decode_context_tokens) or 0
    peak = s.gpu.bf16_dense_flops_per_s
    share = arithmetic_share(prompt, hits, cap.tokens_per_s, flops, peak)
    assert share == pytest.approx((prompt - hits + cap.tokens_per_s) * flops / peak)
    uncorrected = arithmetic_share(prompt, 0, cap.tokens_per_s, flops, peak)
    assert uncorrected - share == pytest.approx(hits * flops / peak)
    assert uncorrected > 1.4 * share  # 1,984 of the 4,000 prompt tokens are hits
    with pytest.raises(ValueError, match="prefix_cache_hits_per_s"):
        arithmetic_share(10, 11, 5, flops, peak)
