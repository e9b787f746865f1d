"""kvlib.view: one derived view a model, and every public path giving its one answer.

Each quantity here was once worked out in several places that disagreed: the bytes a
decode step reads, the weights on a GPU under tensor parallelism, the valid TP degrees.
The tests ask every public path for the same model and inputs and demand one answer.
"""

from __future__ import annotations

import json

import pytest

from kvlib import bounds
from kvlib.capacity.assessment import assess
from kvlib.capacity.scenario import Scenario, ScenarioError, check_scenario
from kvlib.cli import main
from kvlib.config import from_dict, load_config
from kvlib.hardware import get_gpu
from kvlib.mla import placement
from kvlib.paging.step_bytes import paged_step_bytes
from kvlib.view import VOCAB_PADDING, model_view
from kvlib.weights import params
from kvlib.weights.layouts import weight_groups

H100 = get_gpu("H100-SXM")
CASES = [("Mixtral-8x7B", 8), ("DeepSeek-V3", 8), ("Llama-3.1-70B", 4), ("gpt-oss-20b", 2)]


def size_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["size", *args, "--json"]) == 0
    report: dict[str, object] = json.loads(capsys.readouterr().out)
    return report


@pytest.mark.parametrize(("name", "tp"), CASES)
@pytest.mark.parametrize("weight_dtype", [None, "bf16"])
def test_weights_per_gpu_have_one_answer(
    capsys: pytest.CaptureFixture[str], name: str, tp: int, weight_dtype: str | None
) -> None:
    """The CLI, chapter 3's placement and the capstone's scenario read one owner."""
    cfg = load_config(name)
    owner = bounds.weight_bytes_per_gpu(cfg, tp, weight_dtype)
    assert placement.weight_bytes_per_gpu(cfg, tp, weight_dtype, "tp") == owner
    flags = ["--gpu", "H100-SXM", "--tp", str(tp)]
    if weight_dtype is not None:
        flags += ["--weight-dtype", weight_dtype]
    assert size_json(capsys, name, *flags)["weight_bytes_per_gpu"] == owner
    scenario = Scenario(model=cfg, gpu=H100, prompt_tokens=512, output_tokens=64,
                        concurrency=1, needed_context_tokens=1024, max_model_len=1024,
                        tp=tp, weight_dtype=weight_dtype)
    try:
        assert assess(scenario).weight_bytes_per_gpu == owner
    except ScenarioError as err:  # the weights leave no room: the message names them
        assert f"{owner / 2**30:.1f} GiB per GPU" in str(err)


def test_deepseek_v3_keeps_vllms_replicated_tensors_whole() -> None:
    """At tp 8 each GPU holds the norms, the routers and the MLA down-projections
    (``fused_qkv_a_proj``) whole, and an eighth of the rest: 0.93 GiB more a GPU as
    shipped than an even split, as chapter 3 counted it."""
    cfg = load_config("DeepSeek-V3")
    groups = weight_groups(cfg)
    whole = [g for g in groups if g.role in ("norm", "router")
             or ".q_a_proj." in g.module or ".kv_a_proj_with_mqa." in g.module]
    rest = [g for g in groups if g not in whole]
    expected = params.group_weight_bytes(cfg, whole, "bf16") + -(
        -params.group_weight_bytes(cfg, rest, "bf16") // 8
    )
    assert cfg.vocab_size is not None and cfg.vocab_size % VOCAB_PADDING == 0  # no padding
    assert bounds.weight_bytes_per_gpu(cfg, 8, "bf16") == expected
    even = -(-params.weight_bytes(cfg, None) // 8)
    assert 0.9 < (bounds.weight_bytes_per_gpu(cfg, 8, None) - even) / 2**30 < 1.0


def test_vocab_parallel_tables_are_padded_to_64_rows() -> None:
    """GPT-2's 50,257-row table is tied to its LM head: vLLM pads it to 50,304 rows."""
    cfg = load_config("GPT-2")
    extra = (50_304 - 50_257) * cfg.hidden_size * 2
    assert bounds.weight_bytes_per_gpu(cfg, 1, "bf16") == params.weight_bytes(cfg, "bf16") + extra


@pytest.mark.parametrize("name", ["Mixtral-8x7B", "DeepSeek-V3", "Llama-3.1-8B"])
@pytest.mark.parametrize("batch", [1, 16])
def test_a_decode_step_reads_one_answer(name: str, batch: int) -> None:
    """The paging chapter's contiguous step is :func:`kvlib.bounds.decode_bytes_per_gpu`:
    Mixtral-8x7B at batch 1 reads its 2 routed experts of 8, not all of them."""
    cfg = load_config(name)
    step = paged_step_bytes(cfg, 4096, batch, block_size=64)
    assert step.contiguous == bounds.decode_bytes_per_gpu(cfg, batch, 4096)
    if cfg.moe is not None and batch == 1:
        all_experts = params.weight_bytes(cfg) - params.unread_weight_bytes(cfg)
        assert step.weights < all_experts - params.expert_weight_bytes(cfg) / 2


def test_mixtral_step_is_the_touched_experts() -> None:
    cfg = load_config("Mixtral-8x7B")
    assert cfg.moe is not None
    experts = params.expert_weight_bytes(cfg)
    dense = params.weight_bytes(cfg) - params.unread_weight_bytes(cfg) - experts
    touched = -(-experts * cfg.moe.experts_per_token // cfg.moe.num_experts)
    assert bounds.decode_bytes_per_gpu(cfg, 1, 0) == dense + touched


def test_size_reports_the_owners_step(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config("Mixtral-8x7B")
    report = size_json(capsys, "Mixtral-8x7B", "--gpu", "H100-SXM", "--tp", "8",
                       "--batch", "4", "--context", "2048")
    assert report["decode_bytes_per_gpu"] == bounds.decode_bytes_per_gpu(
        cfg, 4, 2048, "bf16", None, 8
    )


@pytest.mark.parametrize("name", ["Mixtral-8x7B", "DeepSeek-V3", "Gemma-2-9B", "GPT-2"])
def test_valid_tp_degrees_have_one_answer(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """Every degree ``kvlib size``, the scenario check and the per-GPU cache accept is in
    :func:`kvlib.bounds.valid_tp_degrees`, and every other one is refused by all three."""
    cfg = load_config(name)
    valid = bounds.valid_tp_degrees(cfg, max_tp=16)
    for tp in range(1, 17):
        cli_ok = main(["size", name, "--tp", str(tp), "--json"]) == 0
        capsys.readouterr()
        try:
            check_scenario(Scenario(model=cfg, gpu=H100, prompt_tokens=8, output_tokens=8,
                                    concurrency=1, needed_context_tokens=64, tp=tp))
            scenario_ok = True
        except ScenarioError:
            scenario_ok = False
        try:
            bounds.kv_bytes_per_gpu(cfg, 64, tp=tp)
            cache_ok = True
        except ValueError:
            cache_ok = False
        assert cli_ok == scenario_ok == cache_ok == (tp in valid), tp


def test_the_view_is_worked_out_once() -> None:
    cfg = load_config("DeepSeek-V3")
    view = model_view(cfg)
    assert model_view(load_config("DeepSeek-V3")) is view
    assert view.weights(None) is view.weights(None)
    assert view.weights("bfloat16") is view.weights("bf16")  # one cache per dtype
    assert view.weights("bf16").all == params.weight_bytes(cfg, "bf16")
    assert view.param_count == params.param_count(cfg)


def test_kv_projections_are_replicated_past_the_kv_heads() -> None:
    """Two KV heads on four GPUs: each GPU holds one head's K and V projections, half of
    them, not a quarter (``QKVParallelLinear``'s ``num_kv_head_replicas``)."""
    cfg = from_dict({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
                     "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 128,
                     "intermediate_size": 512, "tie_word_embeddings": False})
    groups = weight_groups(cfg)
    kv = [g for g in groups if ".k_proj." in g.module or ".v_proj." in g.module]
    norms = [g for g in groups if g.role == "norm"]
    rest = [g for g in groups if g not in kv and g not in norms]
    bf16 = params.group_weight_bytes
    expected = bf16(cfg, norms, "bf16") + bf16(cfg, kv, "bf16") // 2 + -(
        -bf16(cfg, rest, "bf16") // 4
    )
    assert bounds.weight_bytes_per_gpu(cfg, 4, "bf16") == expected
    assert bounds.valid_tp_degrees(cfg) == [1, 2, 4, 8]


@pytest.mark.parametrize("name", ["Gemma-2-9B", "gpt-oss-20b", "DeepSeek-V3", "Llama-3.1-8B"])
def test_layer_groups_sum_as_the_layers_do(name: str) -> None:
    """The per-spec sums the step model takes equal the layer-by-layer sums: cache bytes
    on each GPU, prefill and decode attention FLOPs, at contexts inside and past a window."""
    from kvlib.sizing import kv_bytes_by_layer
    from kvlib.step import attention_pairs, decode_attention_flops

    cfg = load_config(name)
    groups = model_view(cfg).layer_groups
    assert sum(count for _, count in groups) == len(cfg.layers)
    assert len({spec for spec, _ in groups}) == len(groups) == len(set(cfg.layers))
    heads, dim = cfg.num_attention_heads, cfg.head_dim
    for tp in bounds.valid_tp_degrees(cfg, 8):
        for tokens in (0, 1, 17, 4095, 4096, 4097, 131_072):
            shares = [layer.tp_share(tp) for layer in cfg.layers]
            by_layer = kv_bytes_by_layer(cfg, tokens, "fp8")
            assert bounds.kv_bytes_per_gpu(cfg, tokens, "fp8", tp) == sum(
                b * s.numerator // s.denominator for b, s in zip(by_layer, shares, strict=True))
    for tokens in (0, 1, 4095, 4096, 4097, 131_072):
        assert bounds.prefill_attention_flops(cfg, tokens) == sum(
            spec.attention_pairs(tokens) * spec.attention_flops_per_pair(heads, dim)
            for spec in cfg.layers)
        assert decode_attention_flops(cfg, tokens) == sum(
            (attention_pairs(spec, tokens + 1) - attention_pairs(spec, tokens))
            * spec.decode_flops_per_key(heads, dim) for spec in cfg.layers)
