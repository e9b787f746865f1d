"""kvlib.deploy: tensor parallelism, GPUs needed, and the time bounds of prefill and decode."""

from __future__ import annotations

import random

import pytest

from kvlib import deploy, params, sizing
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.units import GB


def test_prefill_and_decode_bounds() -> None:
    # 2 FLOPs per parameter per prompt token: 8e9 params x 1000 tokens at 1e15 FLOP/s.
    assert deploy.prefill_seconds(8 * 10**9, 1000, 1e15) == pytest.approx(0.016)
    # The course brief: 4 GB of int4 weights through 1,008 GB/s is 252 tokens/s.
    assert deploy.decode_tokens_per_s(4 * GB, 1_008 * GB) == pytest.approx(252)


def test_kv_outweighs_weights_at() -> None:
    cfg = load_config("Llama-3.1-8B")
    tokens = deploy.kv_exceeds_weights_at_tokens(cfg)
    assert tokens is not None
    weights = params.weight_bytes(cfg)
    assert sizing.kv_bytes(cfg, tokens) > weights >= sizing.kv_bytes(cfg, tokens - 1)


def test_tensor_parallel_degrees_and_shares() -> None:
    llama = load_config("Llama-3.1-70B")
    assert deploy.valid_tp_degrees(llama) == [1, 2, 4, 8]
    assert deploy.valid_tp_degrees(load_config("Falcon-7B")) == [1]  # 71 heads
    one = deploy.kv_bytes_per_gpu(llama, 1000, tp=1)
    assert deploy.kv_bytes_per_gpu(llama, 1000, tp=8) == one // 8
    # Past 8 KV heads each GPU keeps one head: 16 GPUs hold what 8 do.
    wide = load_config({**dict(llama.raw), "num_attention_heads": 64})
    assert deploy.kv_bytes_per_gpu(wide, 1000, tp=16) == deploy.kv_bytes_per_gpu(wide, 1000, tp=8)
    mla = load_config("DeepSeek-V3")
    assert deploy.kv_bytes_per_gpu(mla, 1000, tp=8) == sizing.kv_bytes(mla, 1000)
    with pytest.raises(ValueError, match="tp=3"):
        deploy.kv_bytes_per_gpu(llama, 1000, tp=3)


def test_min_gpus() -> None:
    h100 = get_gpu("H100-SXM")
    assert deploy.min_gpus(load_config("Llama-3.1-8B"), h100) == 1
    # 141 GB of bf16 weights: two cards of 79.6 GiB at 90 % leave room.
    assert deploy.min_gpus(load_config("Llama-3.1-70B"), h100) == 2
    deepseek = load_config("DeepSeek-V3")
    # 671 GB at one byte a weight needs 9 cards of 71.7 GiB; 16 is the next that splits
    # 128 heads. As shipped (fp8 with scales, bf16 embeddings), 627 GiB: 5 H200s, so 8.
    assert deploy.min_gpus(deepseek, h100, "fp8") == 16
    assert deploy.min_gpus(deepseek, get_gpu("H200"), None) == 8
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        deploy.min_gpus(deepseek, h100, "fp8", 1.5)


def test_expected_experts_match_random_routing() -> None:
    """E (1 - (1 - k/E)^B) against routing B tokens to k distinct random experts each."""
    rng = random.Random(0)
    experts, k = 32, 4
    for batch in (1, 4, 16, 64):
        trials = [
            len({e for _ in range(batch) for e in rng.sample(range(experts), k)})
            for _ in range(4000)
        ]
        simulated = sum(trials) / len(trials)
        assert deploy.expected_experts_touched(experts, k, batch) == pytest.approx(
            simulated, rel=0.02
        )


def test_decode_step_reads_weights_once_and_every_cache() -> None:
    cfg = load_config("Llama-3.1-70B")
    one = deploy.decode_step_bytes(cfg, 1, 8192, tp=4)
    weights, kv = params.weight_bytes(cfg), deploy.kv_bytes_per_gpu(cfg, 8192, tp=4)
    assert one == -(-weights // 4) + kv
    assert deploy.decode_step_bytes(cfg, 32, 8192, tp=4) - one == 31 * kv


def test_moe_decode_reads_only_the_experts_it_routes_to() -> None:
    cfg = load_config("gpt-oss-20b")
    shipped = params.weight_bytes(cfg, None)
    experts = params.expert_weight_bytes(cfg, None)
    kv = deploy.kv_bytes_per_gpu(cfg, 4096)
    one = deploy.decode_step_bytes(cfg, 1, 4096, weight_dtype=None)
    # One token reads 4 of the 32 experts of every layer.
    assert one - kv == shipped - experts + -(-experts * 4 // 32)
    many = deploy.decode_step_bytes(cfg, 256, 4096, weight_dtype=None)
    assert many - 256 * kv == pytest.approx(shipped, rel=1e-3)  # every expert is read


@pytest.mark.parametrize(
    ("call", "args", "message"),
    [
        (deploy.prefill_seconds, (10, 5, 0), "flops_per_s"),
        (deploy.decode_tokens_per_s, (0, 1e12), "bytes_read_per_step"),
        (deploy.expected_experts_touched, (8, 2, 0), "tokens"),
        (deploy.valid_tp_degrees, (load_config("GPT-2"), 0), "max_tp"),
    ],
)
def test_bad_arguments_name_the_argument(
    call: object, args: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call(*args)  # type: ignore[operator]
