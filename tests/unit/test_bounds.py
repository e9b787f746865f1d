"""kvlib.bounds: tensor parallelism, GPUs needed, and the time bounds of prefill and decode."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import refmodels

from kvlib import bounds, sizing, specs
from kvlib.config import bundled_config_path, load_config
from kvlib.hardware import get_gpu
from kvlib.units import GB
from kvlib.weights import params


def test_prefill_and_decode_bounds() -> None:
    # 2 FLOPs per parameter per prompt token: 8e9 params x 1000 tokens at 1e15 FLOP/s.
    assert bounds.prefill_rule_of_thumb_s(8 * 10**9, 1000, 1e15) == pytest.approx(0.016)
    # Chapter 4's example: 4 GB of int4 weights through 1,008 GB/s is 252 tokens/s.
    assert bounds.decode_tokens_per_s(4 * GB, 1_008 * GB) == pytest.approx(252)


def test_kv_outweighs_weights_at() -> None:
    cfg = load_config("Llama-3.1-8B")
    tokens = bounds.kv_exceeds_weights_at_tokens(cfg)
    assert tokens is not None
    weights = params.weight_bytes(cfg)
    assert sizing.kv_bytes(cfg, tokens) > weights >= sizing.kv_bytes(cfg, tokens - 1)


def test_tensor_parallel_degrees_and_shares() -> None:
    llama = load_config("Llama-3.1-70B")
    assert bounds.valid_tp_degrees(llama) == [1, 2, 4, 8]
    assert bounds.valid_tp_degrees(load_config("Falcon-7B")) == [1]  # 71 heads
    one = bounds.kv_bytes_per_gpu(llama, 1000, tp=1)
    assert bounds.kv_bytes_per_gpu(llama, 1000, tp=8) == one // 8
    # Past 8 KV heads each GPU keeps one head: 16 GPUs hold what 8 do.
    wide = load_config({**dict(llama.raw), "num_attention_heads": 64})
    assert bounds.kv_bytes_per_gpu(wide, 1000, tp=16) == bounds.kv_bytes_per_gpu(wide, 1000, tp=8)
    mla = load_config("DeepSeek-V3")
    assert bounds.kv_bytes_per_gpu(mla, 1000, tp=8) == sizing.kv_bytes(mla, 1000)
    with pytest.raises(ValueError, match="tp=3"):
        bounds.kv_bytes_per_gpu(llama, 1000, tp=3)


def test_min_gpus() -> None:
    h100 = get_gpu("H100-SXM")
    assert bounds.min_gpus(load_config("Llama-3.1-8B"), h100) == 1
    # 141 GB of bf16 weights: two cards of 79.6 GiB at 90 % leave room.
    assert bounds.min_gpus(load_config("Llama-3.1-70B"), h100) == 2
    deepseek = load_config("DeepSeek-V3")
    # 671 GB at one byte a weight needs 9 cards of 71.7 GiB; 16 is the next that splits
    # 128 heads. As shipped (fp8 with scales, bf16 embeddings), 627 GiB: 5 H200s, so 8.
    assert bounds.min_gpus(deepseek, h100, "fp8") == 16
    assert bounds.min_gpus(deepseek, get_gpu("H200"), None) == 8
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        bounds.min_gpus(deepseek, h100, "fp8", 1.5)


def test_expected_experts_match_random_routing() -> None:
    """E (1 - (1 - k/E)^B) against routing B tokens to k distinct random experts each."""
    rng = random.Random(0)
    experts, k = 32, 4
    for batch in (1, 4, 16, 64):
        trials = [
            len({e for _ in range(batch) for e in rng.sample(range(experts), k)})
            for _ in range(1000)  # the mean's error is under 0.5%; the bound is 2%
        ]
        simulated = sum(trials) / len(trials)
        assert bounds.expected_experts_touched(experts, k, batch) == pytest.approx(
            simulated, rel=0.02
        )


def test_decode_step_reads_weights_once_and_every_cache() -> None:
    """Every weight a token is multiplied by, once; the 128,256 x 8,192 input table is only
    looked up (one row a token), so it is not read."""
    cfg = load_config("Llama-3.1-70B")
    one = bounds.decode_bytes_per_gpu(cfg, 1, 8192, tp=4)
    weights, kv = params.weight_bytes(cfg), bounds.kv_bytes_per_gpu(cfg, 8192, tp=4)
    table = 2 * 128_256 * 8_192
    assert params.unread_weight_bytes(cfg) == table
    norms = 2 * (2 * 80 + 1) * 8_192  # two RMSNorms a layer and the final one, bf16
    # vLLM keeps the norms whole on every rank and splits the rest four ways.
    assert one == norms + -(-(weights - table - norms) // 4) + kv
    assert bounds.decode_bytes_per_gpu(cfg, 32, 8192, tp=4) - one == 31 * kv
    tied = load_config("Gemma-2-9B")  # its table is also the LM head: read every step
    assert params.unread_weight_bytes(tied) == 0


def test_moe_decode_reads_only_the_experts_it_routes_to() -> None:
    cfg = load_config("gpt-oss-20b")
    shipped = params.weight_bytes(cfg, None) - params.unread_weight_bytes(cfg, None)
    experts = params.expert_weight_bytes(cfg, None)
    kv = bounds.kv_bytes_per_gpu(cfg, 4096)
    one = bounds.decode_bytes_per_gpu(cfg, 1, 4096, weight_dtype=None)
    # One token reads 4 of the 32 experts of every layer.
    assert one - kv == shipped - experts + -(-experts * 4 // 32)
    many = bounds.decode_bytes_per_gpu(cfg, 256, 4096, weight_dtype=None)
    assert many - 256 * kv == pytest.approx(shipped, rel=1e-3)  # every expert is read


@pytest.mark.parametrize(
    ("call", "args", "message"),
    [
        (bounds.prefill_rule_of_thumb_s, (10, 5, 0), "flops_per_s"),
        (bounds.decode_tokens_per_s, (0, 1e12), "bytes_read_per_step"),
        (bounds.expected_experts_touched, (8, 2, 0), "tokens"),
        (bounds.valid_tp_degrees, (load_config("GPT-2"), 0), "max_tp"),
    ],
)
def test_bad_arguments_name_the_argument(
    call: object, args: tuple[object, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call(*args)  # type: ignore[operator]


# Prefill FLOPs, checked against torch's own FLOP counter (torch.utils.flop_counter) on the
# models transformers builds from the real configs: no weights, nothing downloaded.


# The attention module's name in each family (its bmm are QK^T and AV; projections are mm).
_ATTENTION_MODULES = {"self_attn", "self_attention", "attn"}


def _hf_model(config: dict[str, Any], *, meta: bool) -> Any:
    """A transformers causal LM with eager attention and eager (per-expert) MoE loops.

    Eager attention computes every score of the T x T square with a bmm and then masks
    it; the eager expert loop multiplies each token through its routed experts only.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    fields = refmodels.strip_metadata(config)
    hf_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        model = AutoModelForCausalLM.from_config(
            hf_config, attn_implementation="eager", experts_implementation="eager"
        )
    return model.eval()


def _torch_prefill(model: Any, tokens: int, *, meta: bool, logits_to_keep: int = 1) -> Any:
    """(matmul FLOPs outside attention, bmm FLOPs inside attention, attention weights)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    device = "meta" if meta else "cpu"
    ids = torch.randint(0, 100, (1, tokens), generator=torch.Generator().manual_seed(1))
    mask = torch.ones((1, tokens), dtype=torch.long, device=device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        out = model(
            ids.to(device),
            attention_mask=mask,
            logits_to_keep=logits_to_keep,
            use_cache=False,
            output_attentions=not meta,
        )
    counts = counter.get_flop_counts()
    attention = sum(
        flops
        for module, ops in counts.items()
        if module.rsplit(".", 1)[-1] in _ATTENTION_MODULES
        for op, flops in ops.items()
        if "bmm" in str(op)
    )
    return sum(counts["Global"].values()) - attention, attention, out.attentions


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Gemma-2-9B", "GPT-2", "Falcon-7B"])
def test_prefill_flops_match_torchs_count_of_the_full_size_model(model: str) -> None:
    """The real configs on the meta device: shapes only, so a 9B model costs nothing."""
    raw = json.loads(bundled_config_path(model).read_text())
    cfg = load_config(model)
    hf = _hf_model(raw, meta=True)
    tokens = 512
    for logits in (1, tokens):  # an engine's prefill, then a training-style forward
        weights, dense_attention, _ = _torch_prefill(
            hf, tokens, meta=True, logits_to_keep=0 if logits == tokens else 1
        )
        flops = bounds.prefill_flops(cfg, tokens, logits_tokens=logits)
        assert weights == flops.weights + flops.lm_head
    # Eager attention scores the whole square; kvlib's FLOPs per scored pair agree.
    assert dense_attention == bounds.prefill_attention_flops(cfg, 1) * tokens**2


@pytest.mark.parametrize(
    ("model", "window"),
    [("Mixtral-8x7B", None), ("gpt-oss-20b", 8), ("DeepSeek-V3", None),
     ("Mistral-7B-v0.1", 8), ("Gemma-2-9B", 8)],
)
def test_prefill_flops_of_experts_windows_and_mla_match_torch(
    model: str, window: int | None
) -> None:
    """Small random-weight models built from the real configs (experts, windows and MLA
    kept): the matmul FLOPs of the routed experts, and the pairs the mask lets through
    (attention weights that are not exactly zero), counted by torch."""
    small = refmodels.shrink(json.loads(bundled_config_path(model).read_text()))
    small = {**small, "num_hidden_layers": 4}
    if "layer_types" in small:
        small["layer_types"] = small["layer_types"][:4]
    if model == "DeepSeek-V3":
        small["first_k_dense_replace"] = 1  # one dense layer, three routed
    if window is not None:
        small = refmodels.with_window(small, window)
    cfg = load_config(small)
    tokens = 24
    weights, dense_attention, attention_weights = _torch_prefill(
        _hf_model(small, meta=False), tokens, meta=False
    )
    flops = bounds.prefill_flops(cfg, tokens)
    assert weights == flops.weights + flops.lm_head
    assert dense_attention == bounds.prefill_attention_flops(cfg, 1) * tokens**2
    scored = [int((w > 0).sum()) for w in attention_weights]
    heads = [w.shape[1] for w in attention_weights]
    assert scored == [
        bounds.attention_pairs(spec, tokens) * h for spec, h in zip(cfg.layers, heads, strict=True)
    ]
    if window is not None:
        assert min(scored) < max(scored) or model == "Mistral-7B-v0.1"


def test_attention_pairs_count_each_querys_keys() -> None:
    """Closed forms against the definition: query i sees min(i, W) keys, or its chunk's."""
    for tokens in (1, 7, 8, 9, 100):
        for window in (2, 8, 200):
            spec = specs.SlidingWindow(8, 128, window)
            assert bounds.attention_pairs(spec, tokens) == sum(
                min(i, window) for i in range(1, tokens + 1)
            )
            chunked = specs.ChunkedLocal(8, 128, window)
            assert bounds.attention_pairs(chunked, tokens) == sum(
                (i - 1) % window + 1 for i in range(1, tokens + 1)
            )
        full = specs.FullAttention(8, 128)
        assert bounds.attention_pairs(full, tokens) == tokens * (tokens + 1) // 2
    with pytest.raises(ValueError, match="linear"):
        bounds.attention_pairs(specs.LinearState(10, 10), 5)


def test_compute_bound_tokens_reach_the_ridge() -> None:
    """torch's FLOPs for n tokens through a weight, over the weight's bytes, equal the ridge
    at n = compute_bound_tokens: 2 FLOPs per weight per token."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    ridge = get_gpu("H100-SXM").ridge_flops_per_byte
    for dtype in (torch.bfloat16, torch.float32):
        layer = torch.nn.Linear(256, 64, bias=False, dtype=dtype, device="meta")
        weight_bytes = layer.weight.numel() * layer.weight.element_size()
        n = bounds.compute_bound_tokens(ridge, layer.weight.element_size())
        with FlopCounterMode(display=False) as counter:  # shapes only, on the meta device
            layer(torch.zeros(round(n * 1000), 256, dtype=dtype, device="meta"))
        assert counter.get_total_flops() / 1000 / weight_bytes == pytest.approx(ridge, rel=1e-3)
    mixtral = load_config("Mixtral-8x7B")  # 2 of 8 experts: each sees a quarter of the prompt
    assert bounds.compute_bound_tokens(ridge, 2, mixtral) == pytest.approx(4 * ridge)


def test_prefill_time_is_memory_bound_short_and_compute_bound_long() -> None:
    cfg, gpu = load_config("Llama-3.1-8B"), get_gpu("H100-SXM")
    peak, bandwidth = gpu.bf16_dense_flops_per_s, gpu.hbm_bandwidth_bytes_per_s
    crossover = bounds.compute_bound_tokens(gpu.ridge_flops_per_byte)
    short, long = int(crossover / 2), int(crossover * 2)
    weights = params.weight_bytes(cfg) - params.unread_weight_bytes(cfg)  # no lookup table
    assert bounds.prefill_lower_bound_s(cfg, short, peak, bandwidth) == pytest.approx(
        (weights + sizing.kv_bytes(cfg, short)) / bandwidth
    )
    assert bounds.prefill_lower_bound_s(cfg, long, peak, bandwidth) == pytest.approx(
        bounds.prefill_flops(cfg, long).total / peak
    )
    # Split over tensor-parallel GPUs, each does a quarter of the FLOPs.
    assert bounds.prefill_lower_bound_s(cfg, 8192, peak, bandwidth, tp=4) == pytest.approx(
        bounds.prefill_flops(cfg, 8192).total / 4 / peak
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"prompt_tokens": 0}, "prompt_tokens"), ({"prompt_tokens": 4, "logits_tokens": 5},
     "logits_tokens")],
)
def test_prefill_flops_reject_bad_counts(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bounds.prefill_flops(load_config("GPT-2"), **kwargs)
