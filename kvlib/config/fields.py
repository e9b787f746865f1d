"""Typed reads of ``config.json`` fields, each failure naming the field and the fix.

Also the one table of model families: :func:`family` maps a ``model_type`` to
the text model's config type (a multimodal wrapper such as ``gemma3`` to
``gemma3_text``), and every rule keyed by family (defaults, layer types,
parameter layout) looks the family up through it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvlib._validate import is_int

__all__ = [
    "ConfigError",
    "derives",
    "family",
    "first_int",
    "get_bool",
    "get_int",
    "get_optional_int",
    "require_first_int",
    "text_config",
]

_DEFAULTS_PATH = Path(__file__).resolve().parents[1] / "data" / "config_defaults.json"

# Multimodal wrappers keep the language model's fields under one of these keys.
_TEXT_KEYS = ("text_config", "llm_config", "language_config")


class ConfigError(ValueError):
    """A config.json field is missing, malformed or contradicts another field."""


@functools.cache
def _defaults() -> Mapping[str, Any]:
    loaded: Mapping[str, Any] = json.loads(_DEFAULTS_PATH.read_text(encoding="utf-8"))
    return loaded


def family(model_type: str | None) -> str:
    """The text model's ``model_type`` for any spelling of a family.

    A multimodal wrapper (``gemma3``, ``llama4``, ``qwen3_5``...) maps to its
    text config type, as transformers' ``sub_configs["text_config"]`` names it
    (extracted into ``config_defaults.json``); anything else is itself.
    """
    name = model_type or ""
    mapped: str = _defaults()["text_model_type"].get(name, name)
    return mapped


def derives(model_type: str, field: str) -> bool:
    """Whether transformers' config class for this text family fills in the per-layer
    list ``field`` (``layer_types``, ``indexer_types``) itself when a config.json has
    none: a rule kvlib must know or refuse to guess (extracted from the pinned release
    into ``config_defaults.json``)."""
    return model_type in _defaults()[f"derived_{field}"]


def text_config(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's fields, with transformers' defaults for those the file omits.

    Multimodal wrappers nest them under ``text_config`` (Gemma 3, Llava...). A
    field absent from the file takes the default of its transformers config
    class (``kvlib/data/config_defaults.json``, extracted from the pinned
    release): a Gemma 3 ``text_config`` often has no ``num_attention_heads``.
    The ``model_type`` of the result is the text family (:func:`family`), for a
    nested text config and for a flat file that names the wrapper alike.
    """
    key = next((k for k in _TEXT_KEYS if data.get(k) is not None), None)
    text = data if key is None else data[key]
    if not isinstance(text, Mapping):
        raise ConfigError(f"field {key!r} must be an object, got {type(text).__name__}")
    model_type = _model_type(text) or (_model_type(data) if text is not data else None)
    if model_type is None:
        return text
    model_type = family(model_type)
    defaults = _defaults()["models"].get(model_type, {})
    return {**defaults, **text, "model_type": model_type}


def _model_type(data: Mapping[str, Any]) -> str | None:
    value = data.get("model_type")
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"field 'model_type' must be a string, got {value!r}")
    return value


def get_int(
    data: Mapping[str, Any], key: str, *, default: int | None = None, minimum: int = 1
) -> int:
    """A required integer field (``default`` when absent), at least ``minimum``."""
    value = get_optional_int(data, key, minimum=minimum)
    if value is not None:
        return value
    if default is not None:
        return default
    raise ConfigError(f"missing field {key!r}: add it to the config (an integer >= {minimum})")


def get_optional_int(data: Mapping[str, Any], key: str, *, minimum: int = 1) -> int | None:
    """An integer field that may be absent or null."""
    value = data.get(key)
    if value is None:
        return None
    # JSON has one number type: accept 4096.0, refuse 4096.5, true and "4096".
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise ConfigError(f"field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"field {key!r} must be >= {minimum}, got {value}")
    return value


def get_bool(data: Mapping[str, Any], key: str, *, default: bool = False) -> bool:
    """A boolean field; absent or null gives ``default``."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"field {key!r} must be true or false, got {value!r}")
    return value


def first_int(data: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of several spellings of one field that is present (GPT-2's ``n_layer``...)."""
    values = (get_optional_int(data, key) for key in keys)
    return next((value for value in values if value is not None), None)


def require_first_int(data: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    """Like :func:`first_int` but the field is required."""
    value = first_int(data, keys)
    if value is None:
        spelled = " or ".join(repr(k) for k in keys)
        raise ConfigError(f"missing field {spelled}: add {keys[0]!r} (a positive integer)")
    return value
