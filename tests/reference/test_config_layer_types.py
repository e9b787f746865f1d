"""kvlib.config.layer_types against every config class of the pinned transformers.

When a config.json has no ``layer_types``, transformers' config class fills them in
(``__post_init__``). For every family whose class does, kvlib must derive the same
list or refuse the config; it must never guess. Each class is built with its
defaults and with other depths and windows, ``layer_types`` dropped from its
``to_dict()``, and the dict given to kvlib.
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
from transformers import CONFIG_MAPPING

from kvlib.config import ConfigError, load_config
from kvlib.config.fields import derives, text_config
from kvlib.config.layer_types import _GENERIC, _RULES, layer_types
from kvlib.config.layers import sliding_window

pytestmark = pytest.mark.reference

# Depths and windows each class is also built with (its defaults come first).
VARIANTS: tuple[dict[str, Any], ...] = (
    {},
    {"num_hidden_layers": 13},
    {"num_hidden_layers": 13, "sliding_window": 64},
    {"num_hidden_layers": 12, "sliding_window": None},
)
# The families whose config class derives layer_types, as the extraction from the pinned
# release recorded them. Read from the table, not found by building every config class:
# that took seconds in each pytest worker's collection. The first test checks the table's
# list against the classes themselves.
DERIVED: list[str] = json.loads(
    resources.files("kvlib").joinpath("data", "config_defaults.json").read_text())[
    "derived_layer_types"]


@functools.cache
def text_classes() -> dict[str, type]:
    """Text config class by text model_type, for every class that derives layer_types."""
    found: dict[str, type] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            for model_type in sorted(CONFIG_MAPPING.keys()):
                try:
                    text = CONFIG_MAPPING[model_type]().get_text_config()
                except Exception:  # a class that needs arguments
                    continue
                if isinstance(getattr(text, "layer_types", None), list) and text.layer_types:
                    found.setdefault(text.model_type, type(text))
        finally:
            logging.disable(logging.NOTSET)
    return found


def derived_cases(cls: type) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """(config dict without layer_types, transformers' layer_types) per variant."""
    for variant in VARIANTS:
        try:
            config = cls(**variant)
            expected = list(config.layer_types)
            data = config.to_dict()
        except Exception:  # a variant the class rejects
            continue
        data.pop("layer_types", None)
        data["model_type"] = config.model_type
        yield data, expected


def kvlib_types(data: dict[str, Any], num_layers: int) -> list[str]:
    text = text_config(data)
    return layer_types(text, num_layers, sliding_window(text))


def test_the_extracted_list_is_transformers_own() -> None:
    missing = [name for name in text_classes() if not derives(name, "layer_types")]
    assert not missing, "config_defaults.json is stale: run scripts/gen_config_defaults.py"
    assert sorted(text_classes()) == DERIVED, "run scripts/gen_config_defaults.py"
    assert len(text_classes()) > 50


@pytest.mark.parametrize("model_type", DERIVED)
def test_same_layer_types_or_a_refusal(model_type: str) -> None:
    """Layers kvlib turns into "dummy" (shared KV) are compared at the other layers; a
    family kvlib has a rule for is compared in one variant at least."""
    compared = 0
    for data, expected in derived_cases(text_classes()[model_type]):
        try:
            ours = kvlib_types(data, len(expected))
        except ConfigError as exc:
            if "no 'layer_types'" in str(exc):  # the refusal to guess a rule
                assert model_type not in _GENERIC and model_type not in _RULES, exc
            continue  # or a field this variant leaves inconsistent, named in the error
        kept = [(a, b) for a, b in zip(ours, expected, strict=True) if a != "dummy"]
        assert [a for a, _ in kept] == [b for _, b in kept], (data.get("num_hidden_layers"), data)
        compared += 1
    assert compared or (model_type not in _RULES and model_type not in _GENERIC)


@pytest.mark.parametrize("model_type", sorted(_GENERIC))
def test_each_generic_family_is_derived_and_matches(model_type: str) -> None:
    """The families kvlib lets through its generic rule: transformers derives their
    layer_types, and kvlib's list equals it in every variant (no refusal)."""
    assert model_type in text_classes()
    for data, expected in derived_cases(text_classes()[model_type]):
        assert kvlib_types(data, len(expected)) == expected


def test_gpt_oss_without_layer_types_equals_the_shipped_list() -> None:
    shipped = load_config("gpt-oss-20b").raw
    data = {k: v for k, v in shipped.items() if k != "layer_types"}
    assert kvlib_types(data, 24) == list(shipped["layer_types"])


@pytest.mark.parametrize("model_type", ["jamba", "falcon_h1", "zamba2", "minimax", "dots1"])
def test_an_unknown_rule_is_refused_naming_the_fix(model_type: str) -> None:
    data, _ = next(derived_cases(text_classes()[model_type]))
    with pytest.raises(ConfigError, match=r"no 'layer_types'.*add the 'layer_types' list"):
        kvlib_types(data, int(data["num_hidden_layers"]))
