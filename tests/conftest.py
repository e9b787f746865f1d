"""Shared fixtures: the bundled model configs."""

from __future__ import annotations

import pytest

from kvlib.config import ModelConfig, bundled_models, load_config


@pytest.fixture(params=bundled_models())
def bundled(request: pytest.FixtureRequest) -> ModelConfig:
    """Each bundled real config in turn."""
    return load_config(request.param)
