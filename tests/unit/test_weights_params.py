"""kvlib.weights.params: counts, weight bytes at a chosen precision, and weights as
checkpoints ship.

The shipped bytes of the quantized bundled checkpoints are checked against the figure
their makers publish (gpt-oss model card) here, and against the tensors of the model
transformers builds in ``tests/reference/test_weights_quantized.py``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from kvlib.config import ConfigError, bundled_config_path, load_config
from kvlib.units import GB, GiB
from kvlib.weights.params import (
    active_param_count,
    count_params,
    expert_weight_bytes,
    param_count,
    shipped_weights,
    weight_bytes,
)


def test_dense_active_leaves_out_only_the_embedding_lookup() -> None:
    cfg = load_config("Llama-3.1-8B")
    assert param_count(cfg) - active_param_count(cfg) == 128256 * 4096
    tied = load_config("Gemma-2-9B")  # tied: the table is also the LM head
    assert param_count(tied) == active_param_count(tied)


def test_weights_by_precision() -> None:
    cfg = load_config("Llama-3.1-8B")
    count = param_count(cfg)
    assert weight_bytes(cfg, "bf16") == 2 * count
    assert weight_bytes(cfg, "int8") == count
    assert weight_bytes(cfg, "int4") == count // 2


def test_group_scales_add_a_little() -> None:
    """Chapter 4's example: an 8B model is 16 GB at bf16 and about 4 GB at 4 bits; an fp16
    scale per 128 weights adds 2 / 128 bytes a weight (125 MB for 8B)."""
    cfg = load_config("Llama-3.1-8B")
    count = param_count(cfg)
    assert weight_bytes(cfg, "bf16") / GB == pytest.approx(16, abs=0.1)
    assert weight_bytes(cfg, "int4") / GB == pytest.approx(4, abs=0.05)
    scaled = weight_bytes(cfg, "int4", group_size=128)
    assert scaled - weight_bytes(cfg, "int4") == 2 * math.ceil(count / 128)
    with pytest.raises(ValueError, match="group_size"):
        weight_bytes(cfg, "int4", group_size=0)


def test_gpt_oss_ships_as_its_model_card_says() -> None:
    """gpt-oss model card (OpenAI, 2025), table 1: the 20b checkpoint is 12.8 GiB."""
    cfg = load_config("gpt-oss-20b")
    shipped = shipped_weights(cfg)
    assert shipped.format == "mxfp4"
    assert shipped.bytes is not None and round(shipped.bytes / GiB, 1) == 12.8
    assert weight_bytes(cfg, None) == shipped.bytes
    assert weight_bytes(cfg, "bf16") / GiB > 38  # what torch_dtype alone would suggest


def test_unquantized_checkpoints_ship_in_torch_dtype() -> None:
    cfg = load_config("Llama-3.1-8B")
    assert shipped_weights(cfg).bytes == weight_bytes(cfg, "bf16")
    assert shipped_weights(cfg).format == "bf16"


def _with_quantization(quantization: dict[str, Any]) -> Any:
    data = json.loads(bundled_config_path("Llama-3.1-8B").read_text())
    return load_config({**data, "quantization_config": quantization})


def test_gptq_counts_packed_weights_scales_zeros_and_g_idx() -> None:
    """AutoGPTQ QuantLinear: qweight (in x bits / 32, out) int32, qzeros (in / g, out x bits
    / 32) int32, scales (in / g, out) fp16, g_idx (in,) int32; the LM head stays bf16."""
    cfg = _with_quantization({"quant_method": "gptq", "bits": 4, "group_size": 128})
    h, width, layers = 4096, 14336, 32
    shapes = [(4096, h), (1024, h), (1024, h), (h, 4096), (width, h), (width, h), (h, width)]
    per_layer = 0
    for out, inp in shapes:
        qweight = inp * 4 // 32 * out * 4
        qzeros = inp // 128 * (out * 4 // 32) * 4
        scales = inp // 128 * out * 2
        per_layer += qweight + qzeros + scales + inp * 4
    rest = 2 * (2 * 128256 * h + h + layers * 2 * h)  # embeddings, LM head, norms at bf16
    assert shipped_weights(cfg).bytes == layers * per_layer + rest


def test_unmodelled_formats_are_not_guessed() -> None:
    cfg = _with_quantization({"quant_method": "bitsandbytes", "load_in_4bit": True})
    shipped = shipped_weights(cfg)
    assert shipped.bytes is None and "bitsandbytes" in shipped.note
    with pytest.raises(ConfigError, match="bitsandbytes"):
        weight_bytes(cfg, None)


def test_modules_to_not_convert_stay_unquantized() -> None:
    full = _with_quantization({"quant_method": "fp8", "weight_block_size": [128, 128]})
    kept = _with_quantization(
        {"quant_method": "fp8", "weight_block_size": [128, 128],
         "modules_to_not_convert": ["model.layers.*.self_attn"]}
    )
    attention = 32 * (4096 * 4096 * 2 + 1024 * 4096 * 2)  # q, o and k, v weights
    scales = 32 * 4 * (32 * 32 * 2 + 8 * 32 * 2)  # their 128 x 128 blocks
    assert shipped_weights(kept).bytes == (shipped_weights(full).bytes or 0) + attention - scales


def test_count_params_is_none_with_a_reason_for_unknown_layouts() -> None:
    cfg = load_config(
        {"model_type": "cohere2", "hidden_size": 64, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
         "sliding_window": 8}
    )
    count = count_params(cfg)
    assert count.total is None and "cohere2" in count.note


def test_expert_bytes_are_the_routed_experts() -> None:
    dense = load_config("Llama-3.1-8B")
    assert expert_weight_bytes(dense) == 0
    cfg = load_config("Mixtral-8x7B")
    per_expert = 3 * 4096 * 14336
    assert expert_weight_bytes(cfg, "bf16") == 2 * 32 * 8 * per_expert
