"""kvlib.engine.disagg: a prefill engine hands real KV tensors to a decode engine; outputs
equal the aggregated engine's and single-request ones; the bytes equal the tiers formula."""

from __future__ import annotations

import random

import pytest
import torch

from kvlib.config import load_config
from kvlib.engine.core import Engine, EngineConfig, Request
from kvlib.engine.disagg import DisaggregatedEngines
from kvlib.nn.decoder import TinyDecoder, tiny_config
from kvlib.tiers.handoff import handoff

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PREFILL = EngineConfig(num_blocks=64, block_size=4, max_num_seqs=4)
DECODE = EngineConfig(num_blocks=40, block_size=4, max_num_seqs=4)


def workload(n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    return [Request(f"r{i}", [rng.randrange(512) for _ in range(rng.randrange(3, 30))],
                    rng.randrange(1, 16)) for i in range(n)]


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(load_config(tiny_config(layers=2, max_positions=256)), seed=0)


def test_outputs_equal_aggregated_and_alone(model: TinyDecoder) -> None:
    requests = workload(10)
    split = DisaggregatedEngines(model, PREFILL, DECODE).run(requests)
    together = Engine(model, PREFILL).run(requests)
    for request, a, b in zip(requests, split, together, strict=True):
        assert a.error is None and a.output_tokens == b.output_tokens
        assert len(a.output_tokens) == request.max_new_tokens
        single = Engine(model, EngineConfig(num_blocks=64, block_size=4, max_num_seqs=1))
        assert a.output_tokens == single.run([request])[0].output_tokens


def test_handed_bytes_equal_the_formula() -> None:
    cfg = load_config(tiny_config(layers=3, kv_heads=4, heads=8, max_positions=256))
    model = TinyDecoder(cfg, seed=1, dtype=torch.float32)
    engines = DisaggregatedEngines(model, PREFILL, DECODE)
    engines.run(workload(5, seed=2))
    assert len(engines.handovers) == 5 - sum(r.max_new_tokens == 1 for r in workload(5, 2))
    for handover in engines.handovers:
        tokens = len(handover.request.prompt)
        assert handover.nbytes == handoff(cfg, tokens, kv_dtype="fp32").transfer_bytes
        for a, b in ((1, 1), (2, 4), (4, 2), (1, 4), (4, 1)):
            plan = handoff(cfg, tokens, prefill_tp=a, decode_tp=b, kv_dtype="fp32")
            assert handover.bytes_per_gpu_pair(a, b) == plan.bytes_per_gpu_pair


def test_the_decode_engine_must_not_share_prefixes(model: TinyDecoder) -> None:
    with pytest.raises(ValueError, match="prefix caching"):
        DisaggregatedEngines(model, PREFILL, EngineConfig(num_blocks=8,
                                                          enable_prefix_caching=True))
