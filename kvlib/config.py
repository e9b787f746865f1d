"""Model architecture from a Hugging Face ``config.json``: the fields that size a KV cache.

``load_config`` accepts a path, a dict or the name of a bundled config and
returns a frozen :class:`ModelConfig`. Missing fields take the defaults that
``transformers`` gives them; contradictory or missing required fields raise
:class:`ConfigError` naming the field and what was expected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvlib import _layer_types, _layers
from kvlib._fields import ConfigError, get_bool, get_int, get_optional_int, text_config
from kvlib._layers import LayerKind, LayerSpec

__all__ = [
    "ConfigError",
    "LayerKind",
    "LayerSpec",
    "MLAConfig",
    "ModelConfig",
    "bundled_config_path",
    "bundled_models",
    "load_config",
]

_DATA_DIR = Path(__file__).parent / "data" / "configs"

# config.json spellings of the checkpoint dtype, to kvlib's short names.
_DTYPE_NAMES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
}


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head Latent Attention dimensions (DeepSeek-V2/V3, Kimi K2).

    vLLM, SGLang and transformers 5 cache one latent vector of
    ``kv_lora_rank + qk_rope_head_dim`` elements per token per layer; transformers
    4.x cached the decompressed per-head keys (``qk_nope_head_dim +
    qk_rope_head_dim``) and values (``v_head_dim``) instead, 71x more for DeepSeek-V3.
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None

    @property
    def latent_dim(self) -> int:
        """Elements vLLM caches per token per layer: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """Per-head key width after decompression: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelConfig:
    """The architecture fields of one decoder model, normalised across families.

    ``layers[i]`` is the cache shape of layer ``i`` (:class:`LayerSpec`);
    ``num_key_value_heads`` and ``head_dim`` are those of the first layer of
    standard attention. ``raw`` is the (text) config as read, with
    transformers' defaults filled in, for fields only some families have.
    """

    name: str
    model_type: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    layers: tuple[LayerSpec, ...]
    sliding_window: int | None
    mla: MLAConfig | None
    vocab_size: int | None
    intermediate_size: int
    tie_word_embeddings: bool
    dtype: str | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """The attention kind of every layer, in order."""
        return tuple(layer.kind for layer in self.layers)

    @property
    def num_sliding_layers(self) -> int:
        """How many layers use a sliding window."""
        return self.layer_kinds.count("sliding")

    @property
    def num_full_layers(self) -> int:
        """How many layers keep every token (full attention or MLA)."""
        return sum(kind in ("full", "mla") for kind in self.layer_kinds)

    @property
    def attention_type(self) -> str:
        """``"MHA"``, ``"GQA"``, ``"MQA"`` or ``"MLA"``, from the head counts."""
        if self.mla is not None:
            return "MLA"
        if self.num_key_value_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_key_value_heads == 1 else "GQA"


def bundled_models() -> list[str]:
    """Names of the real model configs shipped in ``kvlib/data/configs``."""
    return sorted(p.stem for p in _DATA_DIR.glob("*.json"))


def bundled_config_path(name: str) -> Path:
    """Path of a bundled config by name (case-insensitive)."""
    for path in _DATA_DIR.glob("*.json"):
        if path.stem.lower() == name.lower():
            return path
    raise ConfigError(
        f"no config file or bundled model named {name!r}: give a path to a config.json "
        f"or one of {', '.join(bundled_models())}"
    )


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> ModelConfig:
    """Read a config from a ``config.json`` path, a dict, or a bundled model name."""
    if isinstance(source, Mapping):
        return from_dict(source, name=str(source.get("_name_or_path", "custom")))
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        path = bundled_config_path(str(source))
    return from_dict(_read_json(path), name=_name_for(path))


def _name_for(path: Path) -> str:
    return path.parent.name if path.name == "config.json" else path.stem


def _read_json(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def from_dict(data: Mapping[str, Any], *, name: str = "custom") -> ModelConfig:
    """Build a :class:`ModelConfig` from a parsed ``config.json``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
    text = text_config(data)
    mla = _mla(text)
    # An MLA head's query/key width is qk_nope + qk_rope, whatever hidden/heads gives.
    heads = _layers.attention_heads({**text, "head_dim": mla.qk_head_dim} if mla else text)
    window = _layers.sliding_window(text)
    types = _layer_types.layer_types(text, heads.num_layers, window)
    layers = _layers.layer_specs(text, types, heads, mla)
    model_type = text.get("model_type", data.get("model_type", "unknown"))
    return ModelConfig(
        name=name,
        model_type=str(model_type),
        num_hidden_layers=heads.num_layers,
        num_attention_heads=heads.num_heads,
        num_key_value_heads=heads.num_kv_heads,
        head_dim=heads.head_dim,
        hidden_size=heads.hidden_size,
        layers=layers,
        sliding_window=window if any(layer.kind == "sliding" for layer in layers) else None,
        mla=mla,
        vocab_size=get_optional_int(text, "vocab_size"),
        intermediate_size=_intermediate_size(text, heads.hidden_size),
        tie_word_embeddings=_tied(data, text),
        dtype=_dtype(data, text),
        raw=text,
    )


def _mla(text: Mapping[str, Any]) -> MLAConfig | None:
    """MLA is recognised from its fields, whatever ``model_type`` says."""
    if text.get("kv_lora_rank") is None:
        return None
    return MLAConfig(
        kv_lora_rank=get_int(text, "kv_lora_rank"),
        qk_rope_head_dim=get_int(text, "qk_rope_head_dim"),
        qk_nope_head_dim=get_int(text, "qk_nope_head_dim"),
        v_head_dim=get_int(text, "v_head_dim"),
        q_lora_rank=get_optional_int(text, "q_lora_rank"),
    )


def _intermediate_size(text: Mapping[str, Any], hidden_size: int) -> int:
    """MLP width; GPT-2 (``n_inner``) and Falcon default to 4 x hidden."""
    for key in ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim"):
        value = get_optional_int(text, key)
        if value is not None:
            return value
    return 4 * hidden_size


def _tied(data: Mapping[str, Any], text: Mapping[str, Any]) -> bool:
    # transformers' PretrainedConfig default is True; the outer config of a
    # multimodal wrapper carries the flag for the language model.
    if "tie_word_embeddings" in text:
        return get_bool(text, "tie_word_embeddings")
    if "tie_word_embeddings" in data:
        return get_bool(data, "tie_word_embeddings")
    return True


def _dtype(data: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    for source in (text, data):
        for key in ("dtype", "torch_dtype"):
            value = source.get(key)
            if isinstance(value, str) and value in _DTYPE_NAMES:
                return _DTYPE_NAMES[value]
    return None
