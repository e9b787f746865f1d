"""kvlib.weights.quantized: the quantized bundled checkpoints, tensor by tensor, against the
model transformers builds on the meta device.

Each tensor is sized by the format's own rule (fp8: a byte a weight and an fp32 scale
per 128 x 128 block of every linear layer; MXFP4: half a byte a weight and a byte per
32 for the experts); the sum must be kvlib's shipped bytes.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import pytest

from kvlib.config import bundled_config_path, load_config
from kvlib.weights.params import shipped_weights

pytestmark = pytest.mark.reference


def _meta_model(name: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(bundled_config_path(name).read_text())
    fields = {k: v for k, v in data.items() if not k.startswith("_")}
    fields.pop("quantization_config")
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config)


def _expert_matrices(name: str, shape: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(copies, rows, cols) of a fused expert tensor, or None for anything else."""
    if ".experts." in name and len(shape) == 3 and not name.endswith("_bias"):
        return shape[0], shape[1], shape[2]
    return None


def test_deepseek_v3_fp8_is_its_linear_layers_in_blocks() -> None:
    import torch

    model = _meta_model("DeepSeek-V3")
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    expected = 0
    for name, p in model.named_parameters():
        experts = _expert_matrices(name, tuple(p.shape))
        if experts is not None:
            copies, rows, cols = experts
        elif name in linear and name != "lm_head.weight":
            copies, (rows, cols) = 1, tuple(p.shape)
        else:
            expected += 2 * p.numel()  # bf16, the checkpoint's torch_dtype
            continue
        expected += copies * (rows * cols + 4 * math.ceil(rows / 128) * math.ceil(cols / 128))
    assert shipped_weights(load_config("DeepSeek-V3")).bytes == expected


def test_gpt_oss_mxfp4_is_its_experts_in_blocks_of_32() -> None:
    model = _meta_model("gpt-oss-20b")
    expected = 0
    for name, p in model.named_parameters():
        experts = _expert_matrices(name, tuple(p.shape))
        if experts is None:
            expected += 2 * p.numel()
            continue
        copies, a, b = experts
        # Both expert matrices have hidden = intermediate = 2880 = 90 blocks of 32,
        # so the scales are the same whichever dimension is the input.
        expected += copies * (a * b // 2 + a * b // 32)
    assert shipped_weights(load_config("gpt-oss-20b")).bytes == expected
