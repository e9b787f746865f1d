"""A model's ``config.json`` for a challenge, drawn for each student.

A challenge that asks for the cache a model holds gives the student a whole
config file to read, not the three numbers that matter. The file follows the
format ``transformers`` writes for Gemma 3 text models (``model_type``
``gemma3_text``): an explicit ``layer_types`` list in which every
``sliding_window_pattern``-th layer is full attention and the others slide, a
``head_dim`` that is not ``hidden_size / num_attention_heads``, the dtype in
``torch_dtype``, and the fields a real file carries that the cache does not
depend on. The prompt and the hidden test build the same file from the same
drawn numbers. Standard library only: hidden tests import it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["config_text", "sliding_config"]

# Fields of a Gemma 3 text config that do not change the cache: they are there
# because a real file has them, and a reader must learn to skip them.
_FIXED: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "final_logit_softcapping": None,
    "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
    "max_position_embeddings": 131_072,
    "model_type": "gemma3_text",
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10_000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1_000_000.0,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.53.0",
    "use_cache": True,
    "vocab_size": 262_208,
}


def sliding_config(
    *,
    layers: int,
    full_every: int,
    kv_heads: int,
    heads: int,
    head_dim: int,
    hidden_size: int,
    window: int,
) -> dict[str, Any]:
    """A Gemma 3-format config: layer ``i`` is full attention when ``(i + 1) % full_every == 0``.

    That is Gemma 3's own rule for ``sliding_window_pattern`` (6 in the
    released models); ``layer_types`` spells it out layer by layer.
    """
    for name, value in (("layers", layers), ("full_every", full_every), ("kv_heads", kv_heads),
                        ("heads", heads), ("head_dim", head_dim),
                        ("hidden_size", hidden_size), ("window", window)):
        if type(value) is not int or value < 1:
            raise ValueError(f"sliding_config: {name} must be a positive int, got {value!r}")
    if heads % kv_heads:
        raise ValueError(f"sliding_config: heads ({heads}) must be a multiple of kv_heads "
                         f"({kv_heads})")
    layer_types = [
        "full_attention" if (i + 1) % full_every == 0 else "sliding_attention"
        for i in range(layers)
    ]
    shape = {
        "head_dim": head_dim,
        "hidden_size": hidden_size,
        "intermediate_size": 4 * hidden_size,
        "layer_types": layer_types,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": window,
        "sliding_window_pattern": full_every,
    }
    return dict(sorted({**_FIXED, **shape}.items()))


def config_text(config: dict[str, Any]) -> str:
    """``config`` as a ``config.json`` reads, with ``layer_types`` wrapped four to a line."""
    marker = "__LAYER_TYPES__"
    text = json.dumps({**config, "layer_types": marker}, indent=2)
    types = config.get("layer_types") or []
    rows = [", ".join(json.dumps(t) for t in types[i : i + 4]) for i in range(0, len(types), 4)]
    listed = "[\n    " + ",\n    ".join(rows) + "\n  ]"
    return text.replace(json.dumps(marker), listed)
