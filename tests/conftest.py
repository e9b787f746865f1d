"""Shared fixtures: the bundled model configs."""

from __future__ import annotations

import pytest
from hypothesis import settings

from kvlib.config import ModelConfig, bundled_models, load_config

# Hypothesis checks what a function returns, never how fast: its default 200 ms deadline
# is a wall-clock limit, and the shared 2-core machines that run these tests are noisy.
settings.register_profile("course", deadline=None)
settings.load_profile("course")


@pytest.fixture
def example_config() -> dict[str, object]:
    """Chapter 1's worked example: 40 layers, 8 KV heads of 128 dims."""
    return {
        "model_type": "llama",
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 5120,
        "vocab_size": 32000,
    }


@pytest.fixture(params=bundled_models())
def bundled(request: pytest.FixtureRequest) -> ModelConfig:
    """Each bundled real config in turn."""
    return load_config(request.param)
