"""kvlib.weights.layouts: every weight tensor of a model, against the model transformers builds.

Each config is built by transformers 5.23 on the meta device (no memory, no
download) and its parameters summed; kvlib's count from the same config must be
equal. The configs are the bundled real ones plus the layouts of other families
kvlib claims (LayerNorm and plain MLPs, biases, MoE with dense layers, a vision
tower). Families kvlib has no layout for must report no count, with the reason.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import pytest

from kvlib.config import bundled_config_path, bundled_models, load_config
from kvlib.weights.layouts import UnknownLayout, known_families, weight_groups
from kvlib.weights.params import active_param_count, count_params, param_count

pytestmark = pytest.mark.reference

# Module layouts of real checkpoints (their architecture fields), by family.
FAMILIES: dict[str, dict[str, Any]] = {
    # EleutherAI/pythia-1.4b: LayerNorm, fused QKV with biases, untied embed_out.
    "gpt_neox": {
        "model_type": "gpt_neox", "hidden_size": 2048, "num_hidden_layers": 24,
        "num_attention_heads": 16, "intermediate_size": 8192, "vocab_size": 50304,
        "rotary_pct": 0.25, "use_parallel_residual": True, "tie_word_embeddings": False,
    },
    # microsoft/phi-2: one LayerNorm per parallel block, biased projections and LM head.
    "phi": {
        "model_type": "phi", "hidden_size": 2560, "num_hidden_layers": 32,
        "num_attention_heads": 32, "intermediate_size": 10240, "vocab_size": 51200,
        "partial_rotary_factor": 0.4, "tie_word_embeddings": False,
    },
    "phi-qk-layernorm": {
        "model_type": "phi", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000,
        "qk_layernorm": True, "tie_word_embeddings": False,
    },
    # Qwen/Qwen2.5-7B-Instruct: biases on q, k, v only.
    "qwen2": {
        "model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
        "vocab_size": 152064, "tie_word_embeddings": False,
    },
    # Qwen/Qwen3-30B-A3B: 128 experts, 8 a token, q/k norms.
    "qwen3_moe": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
        "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
    },
    "qwen3_moe-dense-layers": {
        "model_type": "qwen3_moe", "hidden_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 256, "moe_intermediate_size": 64, "num_experts": 8,
        "num_experts_per_tok": 2, "vocab_size": 1000, "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    },
    # microsoft/Phi-3-mini-4k-instruct: fused qkv_proj and gate_up_proj.
    "phi3": {
        "model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 8192,
        "vocab_size": 32064, "tie_word_embeddings": False, "pad_token_id": None,
    },
    # Llama with every bias switched on (Llama-architecture fine-tunes use them).
    "llama-biases": {
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
        "vocab_size": 1000, "attention_bias": True, "mlp_bias": True,
    },
    # gpt-oss geometry with attention_bias switched off (GptOssConfig's default is on).
    "gpt_oss-no-attention-bias": {
        "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 100, "attention_bias": False, "sliding_window": 8,
    },
    # tiiuae/falcon-40b: new decoder architecture, two LayerNorms, grouped KV heads.
    "falcon-new-architecture": {
        "model_type": "falcon", "hidden_size": 8192, "num_hidden_layers": 60,
        "num_attention_heads": 128, "num_kv_heads": 8, "new_decoder_architecture": True,
        "vocab_size": 65024, "parallel_attn": True, "bias": False,
    },
    # deepseek-ai/DeepSeek-V2-Lite: MLA without a query LoRA, one dense layer first.
    "deepseek_v2-lite": {
        "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "intermediate_size": 10944,
        "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512,
        "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 102400, "n_group": 1, "topk_group": 1,
        "tie_word_embeddings": False,
    },
    # google/gemma-3-4b-it: a Gemma 3 text model plus a SigLIP vision tower and projector.
    "gemma3-with-vision": {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
            "head_dim": 256, "sliding_window": 1024, "vocab_size": 262208,
        },
        "vision_config": {
            "model_type": "siglip_vision_model", "hidden_size": 1152,
            "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
            "image_size": 896, "patch_size": 14, "vision_use_head": False,
        },
        "mm_tokens_per_image": 256,
    },
}

UNKNOWN = {
    # Gemma 3n: per-layer embeddings, AltUp and LAuReL blocks kvlib does not lay out.
    "gemma3n_text": {
        "model_type": "gemma3n_text", "hidden_size": 64, "num_hidden_layers": 10,
        "num_kv_shared_layers": 5, "num_attention_heads": 2, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 128, "vocab_size": 1000, "sliding_window": 8,
        "vocab_size_per_layer_input": 1000, "hidden_size_per_layer_input": 8,
        "laurel_rank": 4,
    },
    "cohere2": {
        "model_type": "cohere2", "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 1000, "sliding_window": 8,
    },
}


def transformers_count(config: Mapping[str, Any]) -> int:
    """Parameters of the model transformers builds from ``config`` on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in config.items() if not k.startswith("_")}
    fields.pop("quantization_config", None)  # count the layout, not its storage
    model_type = fields.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **fields)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def bundled(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(bundled_config_path(name).read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("name", bundled_models())
def test_bundled_counts_equal_transformers(name: str) -> None:
    assert param_count(load_config(name)) == transformers_count(bundled(name))


@pytest.mark.parametrize("key", sorted(FAMILIES))
def test_other_families_equal_transformers(key: str) -> None:
    assert param_count(load_config(FAMILIES[key])) == transformers_count(FAMILIES[key])


def test_families_cover_what_they_claim() -> None:
    types = {load_config(c).model_type for c in FAMILIES.values()}
    assert {"gpt_neox", "phi", "qwen2", "qwen3_moe", "phi3", "falcon", "deepseek_v2"} <= types
    vision = load_config(FAMILIES["gemma3-with-vision"])
    tower = sum(g.count for g in weight_groups(vision) if g.part == "vision")
    assert tower > 400_000_000  # SigLIP-So400m: the tower is counted, not left out
    # A tied table is the LM head: every text weight multiplies, the tower runs per image.
    assert active_param_count(vision) == param_count(vision) - tower


@pytest.mark.parametrize("key", sorted(UNKNOWN))
def test_unknown_layouts_give_no_count_and_say_why(key: str) -> None:
    transformers_count(UNKNOWN[key])  # a real family transformers builds
    cfg = load_config(UNKNOWN[key])
    count = count_params(cfg)
    assert count.total is None and count.active is None
    assert key in count.note and "cannot count" in count.note
    with pytest.raises(UnknownLayout, match=key):
        param_count(cfg)


def test_an_unknown_vision_tower_is_not_left_out() -> None:
    text = dict(FAMILIES["gemma3-with-vision"])
    text["vision_config"] = {**text["vision_config"], "model_type": "clip_vision_model"}
    count = count_params(load_config(text))
    assert count.total is None and "clip_vision_model" in count.note


def test_known_families_are_the_builders() -> None:
    assert {"llama", "gpt2", "falcon", "deepseek_v3", "gpt_oss"} <= set(known_families())
    assert "gemma3n_text" not in known_families()


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
def test_moe_totals_and_active_match_the_model_cards(
    name: str, total_b: float, active_b: float
) -> None:
    cfg = load_config(name)
    assert param_count(cfg) / 1e9 == pytest.approx(total_b, abs=0.05)
    assert active_param_count(cfg) / 1e9 == pytest.approx(active_b, abs=0.05)


# --- every family kvlib lays out, with each of its boolean switches flipped ------------

# Switches that change nothing transformers builds, or that build another model class.
_NOT_LAYOUT = frozenset({"return_dict", "output_hidden_states", "output_attentions",
                         "torchscript", "use_cache", "is_encoder_decoder", "is_decoder",
                         "add_cross_attention", "tie_encoder_decoder"})
_SMALL = {"hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 100,
          "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
          "n_embd": 64, "n_layer": 2, "n_head": 4}


def flag_variants(family: str) -> list[tuple[str, dict[str, Any]]]:
    """The family's default config class, shrunk, then once per boolean field flipped."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    defaults = cls().to_dict()
    small = {k: v for k, v in _SMALL.items() if k in defaults}
    # Special token ids point into the real vocabulary, past the shrunk one.
    small |= {k: None for k in ("pad_token_id", "bos_token_id", "eos_token_id") if k in defaults}
    flags = sorted(k for k, v in defaults.items() if isinstance(v, bool) and k not in _NOT_LAYOUT)
    cases = [("defaults", small)] + [(f, {**small, f: not defaults[f]}) for f in flags]
    return [(name, cls(**fields).to_dict()) for name, fields in cases]


@pytest.mark.parametrize("family", sorted(known_families()))
def test_every_switch_of_every_known_family_equals_transformers(family: str) -> None:
    """Biases, tied embeddings, parallel blocks, q/k norms...: a switch kvlib ignores
    shows as a count that differs from the model transformers builds. A config kvlib
    refuses (its default is not a real model: no experts per token) is skipped."""
    from kvlib.config import ConfigError

    compared = 0
    for name, fields in flag_variants(family):
        fields = {**fields, "model_type": family}
        try:
            ours = param_count(load_config(fields))
        except ConfigError:
            continue
        assert ours == transformers_count(fields), name
        compared += 1
    assert compared or family == "deepseek_v2"
