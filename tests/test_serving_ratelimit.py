"""Token buckets: the in-process rule (kvlib.serving.bucket), the same rule in Redis (one
Lua script, kvlib.serving.ratelimit), and the race a GET-then-SET bucket loses.

Every Redis test runs against Debian's redis-server started on loopback by
``tests/redis_support.py``; nothing is mocked.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_support import contend, free_port, running_redis

import kvlib.serving.ratelimit
from kvlib.serving.bucket import Decision, TokenBucket, burst_admits, per_minute
from kvlib.serving.ratelimit import (
    LimiterUnavailableError,
    NaiveRedisTokenBucket,
    RedisRateLimiter,
    RedisTokenBucket,
)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[str]:
    """A redis-server of this module's own, on a free loopback port."""
    with running_redis() as url:
        yield url


@pytest.fixture
def redis_url(redis_server: str) -> str:
    """The module's server, emptied before each test."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    return redis_server


class FakeClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- the rule, in process (kvlib.serving.bucket) ---------------------------------------


def test_the_in_process_bucket_is_also_importable_from_ratelimit() -> None:
    assert kvlib.serving.ratelimit.TokenBucket is TokenBucket
    assert kvlib.serving.ratelimit.Decision is Decision


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


@settings(max_examples=200, deadline=None)
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


# --- the same rule in Redis -----------------------------------------------------------


def test_lua_bucket_agrees_with_the_in_process_bucket(redis_url: str) -> None:
    """A random sequence of waits, costs and settlements: same decisions, same tokens."""
    rng = random.Random(7)
    clock = FakeClock()
    local = TokenBucket(50, 4.0, clock=clock)
    shared = RedisTokenBucket(redis_url, "parity", 50, 4.0, clock=clock)
    for _ in range(400):
        clock.now += rng.choice([0.0, 0.0, 0.05, 0.25, 1.0, 7.0])
        if rng.random() < 0.1:
            estimated, actual = rng.randint(0, 30), rng.randint(0, 30)
            left = shared.reconcile(estimated, actual)
            assert left == pytest.approx(local.reconcile(estimated, actual), abs=1e-6)
            continue
        cost = rng.choice([1, 1, 2, 5, 12.5, 50])
        want, got = local.try_acquire(cost), shared.try_acquire(cost)
        assert got.admitted == want.admitted
        assert got.remaining == pytest.approx(want.remaining, abs=1e-6)
        assert got.retry_after_s == pytest.approx(want.retry_after_s, abs=1e-6)


def test_lua_bucket_on_the_server_clock(redis_url: str) -> None:
    bucket = RedisTokenBucket(redis_url, "server-clock", capacity=5, refill_per_s=0.5)
    admitted = [bucket.try_acquire().admitted for _ in range(8)]
    assert admitted == [True] * 5 + [False] * 3
    refused = bucket.try_acquire()
    assert 1.9 < refused.retry_after_s <= 2.0  # one token at 0.5 a second
    ttl_ms = redis.Redis.from_url(redis_url).pttl("server-clock")
    assert 0 < ttl_ms <= 10_000 + 1_000  # gone once it would be full again


def test_rpm_and_tpm_are_charged_together_or_not_at_all(redis_url: str) -> None:
    clock = FakeClock()
    limiter = RedisRateLimiter(
        redis_url, "tier:free", requests_per_minute=3, tokens_per_minute=10_000, clock=clock
    )
    first = limiter.admit(estimated_tokens=8_000)
    assert first.admitted and first.remaining == 2_000 and first.remaining_requests == 2
    refused = limiter.admit(estimated_tokens=4_000)  # TPM refuses: 2,000 left
    assert not refused.admitted and refused.remaining_requests == 2
    assert refused.retry_after_s == pytest.approx(2_000 / (10_000 / 60))
    # The refused request took no request token: two more small ones fit the RPM.
    assert limiter.admit(estimated_tokens=100).admitted
    assert limiter.admit(estimated_tokens=100).admitted
    rpm_refused = limiter.admit(estimated_tokens=100)  # RPM refuses: 3 a minute
    assert not rpm_refused.admitted
    assert rpm_refused.retry_after_s == pytest.approx(60 / 3)
    # Completion settles the estimate: 8,000 estimated, 1,200 used.
    assert limiter.complete(8_000, 1_200) == pytest.approx(10_000 - 1_200 - 200)


def test_redis_bucket_validates_like_the_local_one(redis_url: str) -> None:
    bucket = RedisTokenBucket(redis_url, "v", capacity=10, refill_per_s=1)
    with pytest.raises(ValueError, match="exceeds the bucket's capacity of 10"):
        bucket.try_acquire(11)
    with pytest.raises(ValueError, match="refill_per_s must be a positive"):
        RedisTokenBucket(redis_url, "v", capacity=10, refill_per_s=0)


def test_unreachable_redis_fails_closed_naming_the_address() -> None:
    port = free_port()  # nothing listens there
    bucket = RedisTokenBucket(f"redis://127.0.0.1:{port}/0", "k", 10, 1)
    with pytest.raises(LimiterUnavailableError, match=f"Redis at 127.0.0.1:{port} .*closed"):
        bucket.try_acquire()
    limiter = RedisRateLimiter(
        f"redis://127.0.0.1:{port}/0", "k", requests_per_minute=60, tokens_per_minute=1e4
    )
    with pytest.raises(LimiterUnavailableError, match=f"127.0.0.1:{port}"):
        limiter.admit(100)


def test_unreachable_redis_can_fail_open() -> None:
    port = free_port()
    bucket = RedisTokenBucket(f"redis://127.0.0.1:{port}/0", "k", 10, 1, fail_open=True)
    decision = bucket.try_acquire()
    assert decision.admitted and decision.degraded and decision.remaining is None
    assert bucket.reconcile(10, 5) is None  # the settlement is skipped, not invented


def test_a_stalled_redis_times_out_and_fails_closed(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    bucket = RedisTokenBucket(redis_url, "stalled", 10, 1, timeout_s=0.1)
    bucket.try_acquire()  # connected and answering
    admin.execute_command("CLIENT", "PAUSE", 600, "ALL")  # the server stops answering
    began = time.monotonic()
    with pytest.raises(LimiterUnavailableError, match="Redis at 127.0.0.1:.*Timeout"):
        bucket.try_acquire()
    assert time.monotonic() - began < 0.5  # one attempt, no retries
    time.sleep(0.6)


# --- the race ---------------------------------------------------------------------------

WRITERS, CAPACITY, REFILL_PER_S, DURATION_S = 8, 50.0, 20.0, 0.5


def test_the_naive_bucket_is_right_alone(redis_url: str) -> None:
    """Sequentially, GET-then-SET gives the same answers: the bug is concurrency."""
    clock = FakeClock()
    naive = NaiveRedisTokenBucket(redis_url, "alone", CAPACITY, REFILL_PER_S, clock=clock)
    local = TokenBucket(CAPACITY, REFILL_PER_S, clock=clock)
    for step in range(300):
        clock.now += 0.01 * (step % 7)
        assert naive.try_acquire().admitted == local.try_acquire().admitted


def test_under_eight_writers_lua_holds_the_limit_and_naive_does_not(redis_server: str) -> None:
    lua, lua_attempts, lua_span = contend(
        "lua", redis_server, writers=WRITERS, capacity=CAPACITY,
        refill_per_s=REFILL_PER_S, duration_s=DURATION_S,
    )  # fmt: skip
    naive, naive_attempts, naive_span = contend(
        "naive", redis_server, writers=WRITERS, capacity=CAPACITY,
        refill_per_s=REFILL_PER_S, duration_s=DURATION_S,
    )  # fmt: skip
    lua_bound = CAPACITY + REFILL_PER_S * lua_span
    naive_bound = CAPACITY + REFILL_PER_S * naive_span
    # Enough contention that the limit mattered, then the two verdicts.
    assert lua_attempts > 4 * lua_bound and naive_attempts > 4 * naive_bound
    assert CAPACITY <= lua <= lua_bound + 1e-6
    assert naive > naive_bound, f"the naive bucket admitted {naive} <= {naive_bound:.1f}"
