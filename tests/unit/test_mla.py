"""kvlib.mla against the DeepSeek papers' own formulas and figures, vLLM's layouts and the
modules transformers builds.

Primary sources: the DeepSeek-V2 paper (arXiv 2405.04434): Table 1 (cache per token in
elements: MHA 2 n_h d_h l, GQA 2 n_g d_h l, MLA (d_c + d_h^R) l), section 2.1.4 ("equal
to GQA with only 2.25 groups"), section 3.2.3 (deployed cache at "6 bits on average"),
and the abstract ("reduces the KV cache by 93.3%" against DeepSeek 67B); the DeepSeek LLM
paper (arXiv 2401.02954), Table 2: the 67B model has 95 layers, d_model 8192, 64 heads,
8 KV heads.
"""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction
from typing import Any

import pytest

from kvlib.bounds import kv_bytes_per_gpu
from kvlib.config import ConfigError, bundled_config_path, load_config
from kvlib.hardware import get_gpu
from kvlib.mla import (
    IndexerShape,
    MLAShape,
    bits_for_published_reduction,
    cached_elements_per_token,
    dcp_node_seats,
    dcp_tokens_per_gpu,
    equivalent_gqa_groups,
    kv_reduction,
    latent_read_cost,
    mla_step_cost,
    node_seats,
    vllm_latent_entry_bytes,
    weight_bytes_per_gpu,
)
from kvlib.sizing import kv_bytes, kv_bytes_by_layer, kv_bytes_per_token_per_layer, seats
from kvlib.weights.params import param_count, weight_bytes

V2, V3, LLM_67B = "DeepSeek-V2", "DeepSeek-V3", "DeepSeek-LLM-67B"


def raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(bundled_config_path(name).read_text(encoding="utf-8"))
    return data


# --- the cache in elements, groups and reductions ------------------------------------


def test_cached_elements_are_the_papers_formulas() -> None:
    # DeepSeek-V2, section 3.1.2: 60 layers, d_c = 512, d_h^R = 64: (d_c + d_h^R) l.
    assert cached_elements_per_token(load_config(V2)) == (512 + 64) * 60
    # DeepSeek LLM 67B, Table 2: 95 layers, 8 KV heads, d_h = 8192 / 64: 2 n_g d_h l.
    assert cached_elements_per_token(load_config(LLM_67B)) == 2 * 8 * (8192 // 64) * 95


@pytest.mark.parametrize("name", [V2, V3])
def test_mla_is_gqa_with_two_and_a_quarter_groups(name: str) -> None:
    """Section 2.1.4: d_c = 4 d_h and d_h^R = d_h / 2, so (9/2) d_h l = 2 x 2.25 x d_h l."""
    cfg = load_config(name)
    groups = equivalent_gqa_groups(cfg)
    assert groups == Fraction(9, 4)
    # A GQA cache of that many groups of d_h holds exactly the latent's elements.
    d_h = raw(name)["v_head_dim"]
    assert 2 * groups * d_h * cfg.num_hidden_layers == cached_elements_per_token(cfg)


def test_groups_need_an_unambiguous_head_dim() -> None:
    lopsided = load_config({**raw(V3), "v_head_dim": 64})
    with pytest.raises(ValueError, match="pass head_dim"):
        equivalent_gqa_groups(lopsided)
    assert equivalent_gqa_groups(lopsided, head_dim=128) == Fraction(9, 4)
    with pytest.raises(ConfigError, match="not an MLA model"):
        equivalent_gqa_groups(load_config(LLM_67B))


def test_reproduces_the_93_3_percent_only_with_a_6_bit_cache() -> None:
    v2, dense = load_config(V2), load_config(LLM_67B)
    architecture = kv_reduction(v2, dense)  # both at 16 bits: MLA against GQA alone
    assert f"{architecture.percent:.0f}" == "82"
    deployed = kv_reduction(v2, dense, model_bits=6)  # V2's cache at 6 bits, 67B at bf16
    assert f"{deployed.percent:.1f}" == "93.3"
    assert deployed.model_bytes_per_token == Fraction(60 * 576 * 6, 8)
    # An fp8 cache (8 bits) or both models quantized alike would print other figures.
    assert f"{kv_reduction(v2, dense, model_bits='fp8').percent:.1f}" != "93.3"
    assert f"{kv_reduction(v2, dense, model_bits=6, baseline_bits=6).percent:.0f}" == "82"
    low, high = bits_for_published_reduction(v2, dense, "93.3")
    assert low < 6 < high and high - low < Fraction(1, 10)
    for inside in (low + Fraction(1, 1000), high - Fraction(1, 1000)):
        assert f"{kv_reduction(v2, dense, model_bits=inside).percent:.1f}" == "93.3"
    for outside in (low - Fraction(1, 1000), high + Fraction(1, 1000)):
        assert f"{kv_reduction(v2, dense, model_bits=outside).percent:.1f}" != "93.3"


def test_reduction_factor_is_the_ratio_of_bits() -> None:
    v3, llama = load_config(V3), load_config("Llama-3.1-70B")
    red = kv_reduction(v3, llama, model_bits="bf16", baseline_bits="bf16")
    assert red.factor == Fraction(kv_bytes(llama, 1000), kv_bytes(v3, 1000))
    assert red.reduction == 1 - 1 / red.factor
    with pytest.raises(ValueError, match="model_bits"):
        kv_reduction(v3, llama, model_bits=0)
    with pytest.raises(ValueError, match="unknown dtype"):
        kv_reduction(v3, llama, baseline_bits="fp6")
    with pytest.raises(ValueError, match="printed figure"):
        bits_for_published_reduction(v3, llama, "93,3%")


# --- decode cost -----------------------------------------------------------------------


def test_step_cost_reads_the_cache_kvlib_sizes() -> None:
    cfg = load_config(V3)
    shape = MLAShape.from_config(cfg)
    for dtype in ("bf16", "fp8", "fp32"):
        for path in ("naive", "absorbed"):
            cost = mla_step_cost(shape, 4096, path, kv_dtype=dtype)  # type: ignore[arg-type]
            assert cost.cache_bytes == 4096 * kv_bytes_per_token_per_layer(cfg, 0, dtype)
        naive = mla_step_cost(shape, 4096, "naive", kv_dtype=dtype)
        # What the naive path materializes is the decompressed cache of transformers 4.x.
        decompressed = kv_bytes_by_layer(cfg, 4096, dtype, mla_layout="decompressed")[0]
        assert naive.decompressed_bytes == decompressed


def test_absorbed_decode_trades_flops_per_token_for_bytes() -> None:
    """Per cached token at decode: naive attends 2H(d_n + d_r + d_v) after decompressing
    2 d_c H (d_n + d_v); absorbed attends 2H(2 d_c + d_r) on the latent alone."""
    shape = MLAShape.from_config(load_config(V3))
    naive, absorbed = (mla_step_cost(shape, 32_768, p) for p in ("naive", "absorbed"))
    per_token = Fraction(absorbed.attention_flops, naive.attention_flops)
    assert per_token == Fraction(2 * 512 + 64, 128 + 64 + 128)  # 3.4x more attention FLOPs
    assert naive.flops > 50 * absorbed.flops  # but no decompression of 32k latents
    assert absorbed.decompressed_bytes == 0 < naive.decompressed_bytes


def test_chunk_size_where_decompressing_becomes_cheaper() -> None:
    """S new tokens over T cached: decompressing costs 2 (T - S) more FLOPs per kv_b weight,
    absorbing 2 S T H (2 d_c - d_n - d_v) more in attention (d_r cancels). Naive is cheaper
    once S > T d_c (d_n + d_v) / (d_c (d_n + d_v) + T (2 d_c - d_n - d_v)): about 171 new
    tokens for DeepSeek-V3, which is why vLLM decompresses for prefill and absorbs for decode."""
    shape = MLAShape.from_config(load_config(V3))
    tokens = 100_000
    low_rank = 512 * (128 + 128)
    crossover = Fraction(tokens * low_rank, low_rank + tokens * (2 * 512 - 128 - 128))
    assert 170 < crossover < 171
    for new, naive_cheaper in ((int(crossover), False), (int(crossover) + 1, True), (1, False)):
        naive = mla_step_cost(shape, tokens, "naive", query_tokens=new)
        absorbed = mla_step_cost(shape, tokens, "absorbed", query_tokens=new)
        assert (naive.flops < absorbed.flops) is naive_cheaper, new


def test_step_cost_refuses_bad_arguments() -> None:
    shape = MLAShape.from_config(load_config(V3))
    with pytest.raises(ValueError, match="path must be"):
        mla_step_cost(shape, 10, "fused")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds context_tokens"):
        mla_step_cost(shape, 10, "naive", query_tokens=11)
    with pytest.raises(ValueError, match="context_tokens"):
        mla_step_cost(shape, 0, "naive")
    with pytest.raises(ValueError, match="kv_lora_rank"):
        MLAShape(7168, 128, 0, 64, 128, 128)


# --- the sparse indexer on DeepSeek-V3.2 -----------------------------------------------

V32 = {
    **{k: v for k, v in raw(V3).items() if k != "quantization_config"},
    "model_type": "deepseek_v32",
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 2048,
}


def test_sparse_read_cost_with_vllms_fp8_layout() -> None:
    """vLLM stores DeepSeek-V3.2 at 656 B of latent and 132 B of indexer key per token per
    layer in fp8 (kvlib.sizing); the indexer reads every key, attention k latents."""
    cfg = load_config(V32)
    per_layer = kv_bytes_per_token_per_layer(cfg, 0, "fp8")
    assert per_layer == 656 + 132
    shape, indexer = MLAShape.from_config(cfg), IndexerShape.from_config(cfg)
    assert indexer == IndexerShape(64, 128, 2048)
    entry = vllm_latent_entry_bytes(cfg, "fp8_ds_mla")
    for tokens in (1_000, 2_048, 131_072):
        sparse = latent_read_cost(shape, tokens, entry, indexer, 132)
        dense = latent_read_cost(shape, tokens, entry)
        chosen = min(tokens, 2048)
        assert sparse.bytes_read == tokens * 132 + chosen * entry
        assert dense.bytes_read == tokens * entry
        assert sparse.attention_flops * tokens == dense.attention_flops * chosen
    # At 128k tokens the indexer's keys are most of what is read.
    long = latent_read_cost(shape, 131_072, entry, indexer, 132)
    assert long.indexer_bytes > 10 * long.attention_bytes
    with pytest.raises(ConfigError, match="index_n_heads"):
        IndexerShape.from_config(load_config(V3))


# --- tensor-parallel versus data-parallel attention ------------------------------------

# A DeepSeek-V3 with every feature of the real one (query LoRA, dense then MoE layers,
# shared experts, router) small enough to build on the meta device.
SMALL_V3 = {
    **{k: v for k, v in raw(V3).items() if k != "quantization_config"},
    "hidden_size": 96,
    "num_hidden_layers": 5,
    "first_k_dense_replace": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 12,
    "v_head_dim": 10,
    "intermediate_size": 40,
    "moe_intermediate_size": 20,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "vocab_size": 300,
}


def transformers_params(config: dict[str, Any]) -> dict[str, int]:
    """Parameters of the model transformers builds, grouped by module name, on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    hf = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(hf)
    groups: dict[str, int] = {}
    for name, param in model.named_parameters():
        for key in ("self_attn.", "mlp.experts.", "mlp.gate.", "q_a_proj", "kv_a_proj", "norm"):
            if key in name:
                groups[key] = groups.get(key, 0) + param.numel()
        groups["all"] = groups.get("all", 0) + param.numel()
    return groups


def test_weight_split_matches_the_modules_transformers_builds() -> None:
    cfg = load_config(SMALL_V3)
    built = transformers_params(SMALL_V3)
    assert param_count(cfg) == built["all"]
    assert MLAShape.from_config(cfg).attention_params * 5 == built["self_attn."]
    gpus = 4
    # DP attention: only the routed experts are split; the embedding and the LM head are
    # padded from 300 to 320 rows at any degree (vLLM's pad_vocab_size).
    routed = built["mlp.experts."]
    padded = 2 * (320 - 300) * cfg.hidden_size
    assert weight_bytes_per_gpu(cfg, gpus, "fp32", "dp") == 4 * (
        built["all"] - routed + padded
    ) + -(-4 * routed // gpus)
    # TP: vLLM replicates fused_qkv_a_proj (q_a_proj + kv_a_proj_with_mqa), the router
    # and the RMSNorm weights; everything else is split.
    replicated = built["q_a_proj"] + built["kv_a_proj"] + built["mlp.gate."] + built["norm"]
    # The embedding and the LM head are padded from 300 to 320 rows (vLLM pads a
    # vocab-parallel table to a multiple of 64) before they are split.
    padding = 2 * (320 - 300) * cfg.hidden_size
    assert weight_bytes_per_gpu(cfg, gpus, "fp32", "tp") == 4 * replicated + -(
        -4 * (built["all"] - replicated + padding) // gpus
    )


def test_weights_per_gpu_as_the_checkpoint_ships() -> None:
    """weight_dtype=None: DeepSeek-V3's fp8 blocks with scales and bf16 rest, split by rank."""
    v3 = load_config(V3)
    shipped = weight_bytes(v3, None)
    for attention in ("tp", "dp"):
        assert weight_bytes_per_gpu(v3, 1, None, attention) == shipped  # type: ignore[arg-type]
        per_gpu = weight_bytes_per_gpu(v3, 8, None, attention)  # type: ignore[arg-type]
        assert shipped / 8 < per_gpu < shipped
    # The scales and the bf16 embeddings make the shipped checkpoint heavier than 1 B/param.
    assert weight_bytes_per_gpu(v3, 8, None, "tp") > weight_bytes_per_gpu(v3, 8, "fp8", "tp")
    with pytest.raises(ValueError, match="dtype"):
        weight_bytes_per_gpu(v3, 8, "fp7", "tp")


def test_tp_replicates_the_latent_and_dp_does_not() -> None:
    v3, gpu = load_config(V3), get_gpu("H200")
    context = 32_768
    tp = node_seats(v3, gpu, 8, context, weight_dtype="fp8", attention="tp")
    dp = node_seats(v3, gpu, 8, context, weight_dtype="fp8", attention="dp")
    # vLLM's request_memory: ceil(0.92 x CUDA's total), 139.81 GiB on an H200.
    budget = math.ceil(13_981 * 2**30 // 100 * 0.92)
    free_tp = budget - weight_bytes_per_gpu(v3, 8, "fp8", "tp")
    free_dp = budget - weight_bytes_per_gpu(v3, 8, "fp8", "dp")
    # Under TP each GPU holds every sequence's whole latent: the node holds one GPU's worth.
    assert kv_bytes_per_gpu(v3, context, "bf16", 8) == kv_bytes(v3, context, "bf16")
    assert tp == seats(free_tp, kv_bytes(v3, context, "bf16"))
    assert dp == 8 * seats(free_dp, kv_bytes(v3, context, "bf16"))
    assert dp > 4 * tp  # more weights per GPU, but 8 GPUs' worth of cache
    # A GQA model's heads do split: its node holds 8 GPUs' worth under TP.
    llama = load_config("Llama-3.1-70B")
    free = budget - weight_bytes_per_gpu(llama, 8, "bf16", "tp")
    assert node_seats(llama, gpu, 8, context, attention="tp") == seats(
        free, kv_bytes(llama, context, "bf16") // 8
    )


def test_dcp_splits_tokens_and_removes_the_latent_replication() -> None:
    v3, gpu = load_config(V3), get_gpu("H200")
    context = 32_768
    # FullAttentionSpec.max_memory_usage_bytes: cdiv(max_model_len, dcp x pcp) tokens.
    assert dcp_tokens_per_gpu(32_769, 8) == 4097
    assert dcp_tokens_per_gpu(context, 4, pcp=2) == context // 8
    budget = math.ceil(13_981 * 2**30 // 100 * 0.92)
    free = budget - weight_bytes_per_gpu(v3, 8, "fp8", "tp")
    for dcp in (1, 2, 4, 8):
        got = dcp_node_seats(v3, gpu, 8, context, dcp, weight_dtype="fp8")
        assert got == seats(free, kv_bytes(v3, context // dcp, "bf16"))
    assert dcp_node_seats(v3, gpu, 8, context, 1, weight_dtype="fp8") == node_seats(
        v3, gpu, 8, context, weight_dtype="fp8", attention="tp"
    )
    # DCP 8 holds as many as DP attention would with TP's weights: more than DP.
    dcp8 = dcp_node_seats(v3, gpu, 8, context, 8, weight_dtype="fp8")
    assert dcp8 > node_seats(v3, gpu, 8, context, weight_dtype="fp8", attention="dp")
    # vLLM's docs bound dcp by tp / H_kv: 2 for Llama-3.1-70B's 8 KV heads on 16 GPUs.
    llama = load_config("Llama-3.1-70B")
    with pytest.raises(ValueError, match="dcp=4 must divide"):
        dcp_node_seats(llama, gpu, 16, context, 4)
    with pytest.raises(ValueError, match="dcp=3 must divide"):
        dcp_node_seats(v3, gpu, 8, context, 3)


def test_node_seats_refuses_bad_arguments() -> None:
    v3, gpu = load_config(V3), get_gpu("H200")
    assert node_seats(v3, gpu, 1, 1000, weight_dtype="bf16") == 0  # weights do not fit
    with pytest.raises(ValueError, match="attention must be"):
        weight_bytes_per_gpu(v3, 8, "fp8", "pp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        node_seats(v3, gpu, 8, 1000, gpu_memory_utilization=1.5)


def test_prefill_flops_sum_the_decode_steps_of_a_causal_prompt() -> None:
    """Each prefill term is the sum over query positions of one query's cost."""
    from kvlib.mla import IndexerShape, MLAShape, latent_read_cost, prefill_path_flops

    shape = MLAShape(hidden_size=64, num_heads=4, kv_lora_rank=32, qk_rope_head_dim=8,
                     qk_nope_head_dim=16, v_head_dim=16, q_lora_rank=24)
    indexer = IndexerShape(num_heads=2, head_dim=16, top_k=5)
    tokens = 12
    got = prefill_path_flops(shape, tokens, indexer)
    fold = 2 * tokens * shape.kv_b_params
    per_query = [latent_read_cost(shape, t, 1, indexer, 1) for t in range(1, tokens + 1)]
    dense = [latent_read_cost(shape, t, 1) for t in range(1, tokens + 1)]
    assert got.absorbed_sparse == fold + sum(c.attention_flops for c in per_query)
    assert got.indexer == sum(c.indexer_flops for c in per_query)
    assert got.absorbed_dense == fold + sum(c.attention_flops for c in dense)
    naive_pair = 2 * shape.num_heads * (16 + 8 + 16)
    assert got.naive == fold + naive_pair * tokens * (tokens + 1) // 2
    assert got.naive_sparse == fold + naive_pair * sum(c.selected_tokens for c in per_query)
    assert prefill_path_flops(shape, tokens).naive_sparse == got.naive  # no cap
    # The sparse cap: beyond k tokens, each query adds exactly 2 H k (2 d_c + d_r).
    longer = prefill_path_flops(shape, tokens + 1, indexer)
    cap = 2 * shape.num_heads * indexer.top_k * (2 * 32 + 8)
    assert longer.absorbed_sparse - got.absorbed_sparse == cap + 2 * shape.kv_b_params
    assert prefill_path_flops(shape, tokens).indexer == 0


def test_vllm_latent_entry_bytes_and_the_refused_dtype() -> None:
    v3 = load_config(V3)
    assert vllm_latent_entry_bytes(v3, "auto") == 2 * 576
    assert vllm_latent_entry_bytes(v3, "fp8") == 576
    assert vllm_latent_entry_bytes(v3, "fp8_ds_mla") == 512 + 4 * 4 + 64 * 2
    with pytest.raises(ValueError, match="no page size"):
        vllm_latent_entry_bytes(v3, "nvfp4_ds_mla")
    with pytest.raises(ValueError, match="unknown MLA cache dtype"):
        vllm_latent_entry_bytes(v3, "int3")
