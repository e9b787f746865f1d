"""kvlib.capacity.crossover: the crossover utilization, checked against a month's two bills computed
separately, and the inputs it refuses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlib.capacity.crossover import crossover, dedicated_cost_per_million_tokens


@given(
    price=st.floats(0.1, 20),
    gpus=st.integers(1, 16),
    tokens_per_s=st.floats(10, 50_000),
    per_million=st.floats(0.01, 50),
)
def test_the_bills_are_equal_at_the_crossover(
    price: float, gpus: int, tokens_per_s: float, per_million: float
) -> None:
    point = crossover(price, gpus, tokens_per_s, per_million)
    x = point.utilization
    # A month of GPUs against the month's tokens at the per-token price, each summed alone.
    hours = 730.0
    gpu_bill = gpus * price * hours
    tokens = tokens_per_s * 3600 * hours
    if x <= 1:
        assert point.dedicated_pays == (x < 1)
        assert gpu_bill == pytest.approx(tokens * x / 1e6 * per_million)
        assert point.cost_per_million(x) == pytest.approx(per_million)
    else:
        # Even flat out, the GPUs cost more than the tokens they serve.
        assert gpu_bill > tokens / 1e6 * per_million
        assert not point.dedicated_pays


def test_cost_per_million_falls_as_one_over_utilization() -> None:
    full = dedicated_cost_per_million_tokens(2.0, 1, 1_000.0, 1.0)
    assert full == pytest.approx(2.0 * 1e6 / 3.6e6)  # $2 an hour for 3.6 M tokens an hour
    assert dedicated_cost_per_million_tokens(2.0, 1, 1_000.0, 0.25) == pytest.approx(4 * full)
    assert crossover(2.0, 1, 1_000.0, 1.0).cost_per_million_at_full_use == pytest.approx(full)


def test_more_tokens_per_gpu_lower_the_crossover() -> None:
    slow, fast = crossover(3.0, 2, 2_000.0, 0.5), crossover(3.0, 2, 4_000.0, 0.5)
    assert fast.utilization == pytest.approx(slow.utilization / 2)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0.0, 1, 100.0, 1.0), "gpu_hour_price"),
        ((1.0, 0, 100.0, 1.0), "gpus"),
        ((1.0, 1, -5.0, 1.0), "tokens_per_s"),
        ((1.0, 1, 100.0, float("nan")), "price_per_million_tokens"),
    ],
)
def test_bad_inputs_are_named(args: tuple[float, int, float, float], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        crossover(*args)
    with pytest.raises(ValueError, match="utilization"):
        dedicated_cost_per_million_tokens(1.0, 1, 100.0, 1.5)
