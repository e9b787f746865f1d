"""Shared fixtures (the bundled model configs) and the order tests run in (the site last)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings

from kvlib.config import ModelConfig, bundled_models, load_config

_SITE_BUILD = pytest.StashKey[threading.Thread | None]()

# Hypothesis checks what a function returns, never how fast: its default 200 ms deadline
# is a wall-clock limit, and the shared 2-core machines that run these tests are noisy.
settings.register_profile("course", deadline=None)
settings.load_profile("course")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need the built site run last, and the build starts now in the
    background, so that the other tests run while it executes the book's notebooks."""
    site = [item for item in items if item.get_closest_marker("site")]
    if not site:
        return
    items[:] = [item for item in items if not item.get_closest_marker("site")] + site
    from site_helpers import site_is_current, start_site_build

    if site_is_current():
        return
    config.stash[_SITE_BUILD] = start_site_build()
    # The build is the longest chain (its notebooks, then the site's browser tests): the
    # tests that overlap it yield the CPU to it.
    os.nice(5)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Wait for a background build: a process that left it running would drop the lock
    while the build still writes _build/html."""
    build = session.config.stash.get(_SITE_BUILD, None)
    if build is not None:
        build.join()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread: the tests' models are tiny, and on a shared two-core
    machine a second thread costs more in synchronisation than it gains."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
