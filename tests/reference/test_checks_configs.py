"""The config.json chapter 1 draws for each student: what transformers caches for it.

The hidden test of the config challenge takes its right answer from
``kvlib.sizing.kv_bytes``; here that figure is checked against the bytes a
random-weight ``transformers`` Gemma 3 model built from the same file holds
(shrunk as in the reference tests, with a 16-token window so a short prompt
crosses it), and against the rule the prompt states: full layers keep every
token, sliding layers ``sliding_window - 1``.
"""

from __future__ import annotations

import json

import pytest
import refmodels

from course.checks import config_text, sliding_config
from kvlib.config import from_dict
from kvlib.sizing import kv_bytes, kv_bytes_by_layer

pytestmark = pytest.mark.reference

WINDOW = 16


def _config(layers: int, full_every: int, shape: tuple[int, int, int, int], window: int) -> dict:
    heads, kv_heads, head_dim, hidden = shape
    return sliding_config(layers=layers, full_every=full_every, kv_heads=kv_heads, heads=heads,
                          head_dim=head_dim, hidden_size=hidden, window=window)


@pytest.mark.parametrize(
    ("layers", "full_every", "shape"),
    [(26, 6, (4, 1, 256, 1152)), (7, 2, (64, 8, 64, 2880)), (9, 4, (32, 16, 128, 5376))],
)
def test_transformers_holds_what_kvlib_counts(
    layers: int, full_every: int, shape: tuple[int, int, int, int]
) -> None:
    config = _config(layers, full_every, shape, WINDOW)
    cfg = from_dict(config)
    model = refmodels.build_model(refmodels.shrink(config), "bf16")
    for prompt, steps in ((WINDOW + 20, 0), (WINDOW - 2, 3)):
        measured = refmodels.measure(model, prompt, decode_tokens=steps)
        assert list(measured.layer_bytes) == kv_bytes_by_layer(cfg, prompt + steps, "bf16")
        assert measured.sliding == tuple(t == "sliding_attention" for t in config["layer_types"])


def test_the_prompts_rule() -> None:
    """Full layers keep T tokens, sliding ones W - 1: the formula the prompt states."""
    heads, kv_heads, head_dim, hidden = 8, 4, 256, 2560
    config = _config(34, 6, (heads, kv_heads, head_dim, hidden), 1024)
    full = config["layer_types"].count("full_attention")
    assert (full, config["layer_types"][5], config["layer_types"][0]) == (
        5, "full_attention", "sliding_attention"
    )
    per_token = 2 * kv_heads * head_dim * 2
    tokens = 65_536
    expected = full * per_token * tokens + (34 - full) * per_token * 1023
    assert kv_bytes(from_dict(config), tokens, "bf16") == expected


def test_text_is_the_config() -> None:
    config = _config(26, 6, (4, 1, 256, 1152), 512)
    text = config_text(config)
    assert json.loads(text) == config
    assert text.count('"sliding_attention"') == 26 - 4
    assert max(len(line) for line in text.splitlines()) < 100  # readable in a notebook


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("layers", 0, "layers must be a positive int"), ("head_dim", 64.0, "head_dim must be"),
     ("kv_heads", 3, "multiple of kv_heads")],
)
def test_bad_input_names_the_field(field: str, value: object, message: str) -> None:
    fields = dict(layers=4, full_every=2, kv_heads=2, heads=4, head_dim=64, hidden_size=256,
                  window=8)
    with pytest.raises(ValueError, match=message):
        sliding_config(**{**fields, field: value})
