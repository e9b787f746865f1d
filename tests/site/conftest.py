"""The site's browser tour, made once per test run and read by the modules that check it."""

from __future__ import annotations

from typing import Any

import pytest
from site_helpers import ensure_site
from site_tour import shared_tour


@pytest.fixture(scope="session")
def site_tour() -> dict[str, Any]:
    """What Chromium saw on every page of the built site (tests/site_tour.py)."""
    return shared_tour(ensure_site())
