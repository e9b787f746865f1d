"""kvlib.params against the parameters transformers builds from each config."""

from __future__ import annotations

import json
import warnings

import pytest

from kvlib.config import bundled_config_path, bundled_models, load_config
from kvlib.params import active_param_count, param_count


def _transformers_param_count(name: str) -> int:
    """Build the model on the meta device (no memory, no download) and count parameters."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads(bundled_config_path(name).read_text())
    fields = {k: v for k, v in data.items() if not k.startswith("_")}
    fields.pop("quantization_config", None)  # count the unquantized layout
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.reference
@pytest.mark.parametrize("name", bundled_models())
def test_param_count_matches_transformers(name: str) -> None:
    assert param_count(load_config(name)) == _transformers_param_count(name)


@pytest.mark.parametrize(
    ("name", "total_b", "active_b"),
    [
        # OpenAI gpt-oss model card: 21B total, 3.6B active parameters.
        ("gpt-oss-20b", 20.9, 3.6),
        # DeepSeek-V3 technical report: 671B total, 37B activated per token.
        ("DeepSeek-V3", 671.0, 36.6),
        # Mistral: Mixtral 8x7B has 46.7B parameters (12.9B used per token with embeddings).
        ("Mixtral-8x7B", 46.7, 12.7),
    ],
)
def test_moe_totals_and_active(name: str, total_b: float, active_b: float) -> None:
    cfg = load_config(name)
    assert param_count(cfg) / 1e9 == pytest.approx(total_b, abs=0.05)
    assert active_param_count(cfg) / 1e9 == pytest.approx(active_b, abs=0.05)


def test_dense_active_leaves_out_only_the_embedding_lookup() -> None:
    cfg = load_config("Llama-3.1-8B")
    assert param_count(cfg) - active_param_count(cfg) == 128256 * 4096
    tied = load_config("Gemma-2-9B")  # tied: the table is also the LM head
    assert param_count(tied) == active_param_count(tied)
