"""The token bucket in one process (kvlib.serving.bucket): the rule every limiter of the
course follows, its closed form for a paced burst, Retry-After and the settlement of an
estimate. The same rule in Redis is tested in ``tests/unit/test_serving_ratelimit.py``.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.serving.bucket import Decision, TokenBucket, burst_admits, per_minute


class FakeClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_full_bucket_admits_its_capacity_then_refuses_with_retry_after() -> None:
    clock = FakeClock()
    bucket = TokenBucket(capacity=10, refill_per_s=2.0, clock=clock)
    assert bucket.admits_for_burst(25) == 10
    refused = bucket.try_acquire()
    assert not refused.admitted and refused.status_code == 429
    assert refused.retry_after_s == pytest.approx(0.5)  # one token at 2 a second
    assert refused.headers() == {"Retry-After": "1"}  # whole seconds, rounded up
    clock.now += 0.5
    assert bucket.try_acquire().admitted
    clock.now += 100
    assert bucket.tokens() == 10  # the refill stops at capacity


def test_retry_after_is_the_time_until_the_cost_is_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(capacity=1_000, refill_per_s=per_minute(6_000), clock=clock)
    assert bucket.try_acquire(900).admitted  # 100 left
    refused = bucket.try_acquire(400)
    assert refused.retry_after_s == pytest.approx(300 / 100)  # 300 short at 100 a second
    assert refused.headers() == {"Retry-After": "3"}
    clock.now += 3.0
    assert bucket.try_acquire(400).admitted


def test_per_minute_limits_are_sixty_times_smaller_per_second() -> None:
    assert per_minute(600) == 10.0
    clock = FakeClock()
    bucket = TokenBucket(capacity=50, refill_per_s=per_minute(600), clock=clock)
    assert bucket.admits_for_burst(100) == 50
    clock.now += 3.0
    assert bucket.admits_for_burst(100) == 30  # 10 a second, not 600 (which would refill 50)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    capacity=st.integers(1, 60),
    refill=st.integers(1, 50),
    faster=st.integers(1, 4),
    requests=st.integers(1, 400),
)
def test_paced_burst_admits_match_the_closed_form(
    capacity: int, refill: int, faster: int, requests: int
) -> None:
    """Arrivals every 1/(faster * refill) s: min(n, floor(capacity + refill * T))."""
    spacing = 1.0 / (faster * refill)
    times = [1_000.0 + i * spacing for i in range(requests)]
    span = times[-1] - times[0]
    expected = min(requests, math.floor(capacity + refill * span + 1e-9))
    assert burst_admits(capacity, refill, times) == expected


def test_reconcile_refunds_an_over_estimate_and_charges_an_under_estimate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(capacity=10_000, refill_per_s=100.0, clock=clock)
    assert bucket.try_acquire(4_000).admitted  # admitted on the estimate
    assert bucket.reconcile(estimated_tokens=4_000, actual_tokens=1_500) == 8_500
    assert bucket.reconcile(estimated_tokens=0, actual_tokens=20_000) == -11_500  # a debt
    refused = bucket.try_acquire(1)
    assert refused.retry_after_s == pytest.approx(11_501 / 100)
    assert bucket.reconcile(estimated_tokens=50_000, actual_tokens=0) == 10_000  # capped


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"capacity": 0, "refill_per_s": 1}, "capacity must be a positive"),
        ({"capacity": 5, "refill_per_s": -1}, "refill_per_s must be a positive"),
        ({"capacity": 5, "refill_per_s": math.inf}, "refill_per_s must be a positive"),
        ({"capacity": 5, "refill_per_s": 1, "tokens": 6}, "must not exceed capacity"),
    ],
)
def test_bad_bucket_parameters_are_named(kwargs: dict[str, float], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        TokenBucket(**kwargs)  # type: ignore[arg-type]


def test_a_request_larger_than_the_bucket_is_refused_with_the_fix() -> None:
    bucket = TokenBucket(capacity=100, refill_per_s=1)
    with pytest.raises(ValueError, match="exceeds the bucket's capacity of 100.*split"):
        bucket.try_acquire(101)
    with pytest.raises(ValueError, match="cost must be at least 0"):
        bucket.try_acquire(-1)


def test_decision_headers() -> None:
    assert Decision(True, 3.0, 0.0).headers() == {}
    assert Decision(False, 0.2, 0.01).headers() == {"Retry-After": "1"}
    assert Decision(False, 0.0, 61.2).headers() == {"Retry-After": "62"}
