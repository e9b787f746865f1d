"""A model's architecture from a Hugging Face ``config.json``: :class:`ModelConfig`.

Missing fields take the defaults that ``transformers`` gives them; contradictory
or missing required fields raise :class:`ConfigError` naming the field and what
was expected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvlib.config.fields import ConfigError, first_int, get_bool, get_optional_int, text_config
from kvlib.config.guards import (
    MAX_CONFIG_BYTES,
    MAX_NESTING,
    check_generates,
    check_modelled,
    check_sizes,
    nesting_depth,
)
from kvlib.config.layer_types import layer_types
from kvlib.config.layers import attention_heads, sliding_window, specs_from_types
from kvlib.config.parts import (
    IndexerShape,
    Layout,
    MLAShape,
    MoEConfig,
    QuantizationConfig,
    VisionTower,
    indexer_from,
    layout_from,
    mla_from,
    moe_from,
    quantization_from,
    vision_from,
)
from kvlib.dtypes import canonical_dtype
from kvlib.specs import CacheSpec, SlidingWindow

__all__ = [
    "ModelConfig",
    "bundled_config_path",
    "bundled_models",
    "from_dict",
    "load_config",
]

_DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "configs"

# The MLP width; GPT-2 (``n_inner``) and Falcon may give none: then 4 x hidden.
_MLP_WIDTH = ("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")
# The context the model was trained for, or None when the file gives none.
_POSITIONS = ("max_position_embeddings", "n_positions", "max_sequence_length")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture fields of one decoder model, normalised across families.

    ``layers[i]`` is the cache spec of layer ``i``. ``num_key_value_heads`` and
    ``head_dim`` are the attention shape of the config (for MLA, the query/key
    head width ``qk_nope + qk_rope``). ``raw`` is the text config as read, with
    transformers' defaults filled in, kept for display only.
    """

    name: str
    model_type: str
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    layers: tuple[CacheSpec, ...]
    sliding_window: int | None  # W of the sliding layers (largest), None without any
    mla: MLAShape | None
    indexer: IndexerShape | None
    moe: MoEConfig | None
    layout: Layout
    vision: VisionTower | None
    quantization: QuantizationConfig | None
    vocab_size: int | None
    intermediate_size: int
    tie_word_embeddings: bool
    dtype: str | None
    max_position_embeddings: int | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    def __hash__(self) -> int:
        """The compared fields' hash, worked out once: the views cached per config
        (:func:`kvlib.view.model_view`) look the config up on every call, and hashing
        every layer's spec each time cost more than the lookups saved."""
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the cached hash: string hashes are salted per process."""
        return {key: value for key, value in self.__dict__.items() if key != "_hash"}

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """The cache kind of every layer, in order (for display and counting)."""
        return tuple(layer.kind for layer in self.layers)

    @property
    def num_sliding_layers(self) -> int:
        """How many layers keep a window of recent tokens only."""
        return sum(layer.cap_tokens is not None for layer in self.layers)

    @property
    def num_full_layers(self) -> int:
        """How many layers keep every token (full attention or an MLA latent)."""
        return sum(
            layer.cap_tokens is None and layer.bytes_per_token("bf16") > 0 for layer in self.layers
        )

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
    """Read a config from a ``config.json`` path, a folder holding one, a dict, or a
    bundled model name."""
    if isinstance(source, Mapping):
        return from_dict(source, name=str(source.get("_name_or_path", "custom")))
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        path = bundled_config_path(str(source))
    name = path.parent.name if path.name == "config.json" else path.stem
    return from_dict(_read_json(path), name=name)


def _read_json(path: Path) -> Mapping[str, Any]:
    """The JSON object in ``path``; one ConfigError line for an unreadable, oversized,
    invalid, too deeply nested or duplicate-keyed file."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path} is {size:,} bytes: a config.json is a few kilobytes (at most "
                f"{MAX_CONFIG_BYTES:,} read); pass the model's config.json, not another file"
            )
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {exc.start:,}): save the config as UTF-8 JSON"
        ) from None
    if nesting_depth(text) > MAX_NESTING:
        raise ConfigError(
            f"{path} nests objects or lists more than {MAX_NESTING} deep (a config.json is a "
            "few levels deep): check the file"
        )
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except RecursionError:
        raise ConfigError(
            f"{path} nests objects or lists too deeply to read (a config.json is a few "
            "levels deep): check the file"
        ) from None
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc.args[0]}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


class _DuplicateKey(Exception):
    """A key given twice in one JSON object."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing a repeated key: a JSON reader silently keeps the last
    one, and a hand-edited config with two layer counts sizes the wrong model."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(
                f"key {key!r} is given twice ({_short(data[key])}, then {_short(value)}); a "
                "JSON reader keeps the last silently: delete the wrong one"
            )
        data[key] = value
    return data


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def from_dict(data: Mapping[str, Any], *, name: str = "custom") -> ModelConfig:
    """Build a :class:`ModelConfig` from a parsed ``config.json``."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a JSON object, got {type(data).__name__}")
    text = text_config(data)
    check_sizes(text)
    check_generates(data, text)
    heads = attention_heads(text)
    mla = mla_from(text, heads.hidden_size, heads.num_heads)
    types = layer_types(text, heads.num_layers, sliding_window(text))
    check_modelled(text, types, heads.head_dim, mla is not None)
    layers = specs_from_types(text, types, heads, mla)
    windows = {layer.window for layer in layers if isinstance(layer, SlidingWindow)}
    return ModelConfig(
        name=name,
        model_type=str(text.get("model_type", data.get("model_type", "unknown"))),
        num_hidden_layers=heads.num_layers,
        num_attention_heads=heads.num_heads,
        num_key_value_heads=heads.num_kv_heads,
        head_dim=heads.head_dim,
        hidden_size=heads.hidden_size,
        layers=layers,
        sliding_window=max(windows) if windows else None,
        mla=mla,
        indexer=indexer_from(text) if "indexed_attention" in types else None,
        moe=moe_from(text, heads.num_layers),
        layout=layout_from(text),
        vision=vision_from(data),
        quantization=quantization_from(data) or quantization_from(text),
        vocab_size=get_optional_int(text, "vocab_size"),
        intermediate_size=first_int(text, _MLP_WIDTH) or 4 * heads.hidden_size,
        tie_word_embeddings=_tied(data, text),
        dtype=_dtype(data, text),
        max_position_embeddings=first_int(text, _POSITIONS),
        raw=text,
    )


def _tied(data: Mapping[str, Any], text: Mapping[str, Any]) -> bool:
    # transformers' PretrainedConfig default is True; the outer config of a
    # multimodal wrapper carries the flag for the language model.
    source = next((s for s in (text, data) if "tie_word_embeddings" in s), None)
    return True if source is None else get_bool(source, "tie_word_embeddings")


def _dtype(data: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    """``torch_dtype`` (or ``dtype``): the precision the unquantized tensors ship in."""
    values = (source.get(key) for source in (text, data) for key in ("dtype", "torch_dtype"))
    return next((d for d in map(canonical_dtype, values) if d is not None), None)
