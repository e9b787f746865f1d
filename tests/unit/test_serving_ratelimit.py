"""Token buckets in a real Redis (kvlib.serving.ratelimit): the Lua script agrees with the
in-process rule, charges RPM and TPM together, fails closed with the server's address,
and holds the limit under concurrent writers, where a GET-then-SET bucket does not.

Every test runs against Debian's redis-server started on loopback by
``tests/redis_support.py``; nothing is mocked. No assertion depends on how fast this
machine is: the race is forced with ``CLIENT PAUSE ... WRITE`` (reads go through, writes
wait), and bounds on refills are computed from clocks read around the calls.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import pytest
import redis
from redis_support import MIN_ATTEMPTS, contend, free_port, running_redis

import kvlib.serving.ratelimit
from kvlib.serving.bucket import Decision, TokenBucket
from kvlib.serving.ratelimit import (
    LimiterUnavailableError,
    NaiveRedisTokenBucket,
    RedisRateLimiter,
    RedisTokenBucket,
)

# Generous socket timeouts wherever a timeout is not what a test checks: a loaded machine
# can stall a round trip to Redis for longer than the limiter's default 0.25 s.
PATIENT_S = 5.0


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


def server_time_s(client: redis.Redis) -> float:
    """Redis's own clock (``TIME``), the one the Lua script refills by."""
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def test_the_in_process_bucket_is_also_importable_from_ratelimit() -> None:
    assert kvlib.serving.ratelimit.TokenBucket is TokenBucket
    assert kvlib.serving.ratelimit.Decision is Decision


# --- the same rule in Redis -----------------------------------------------------------


def test_lua_bucket_agrees_with_the_in_process_bucket(redis_url: str) -> None:
    """A random sequence of waits, costs and settlements: same decisions, same tokens."""
    rng = random.Random(7)
    clock = FakeClock()
    local = TokenBucket(50, 4.0, clock=clock)
    shared = RedisTokenBucket(redis_url, "parity", 50, 4.0, clock=clock, timeout_s=PATIENT_S)
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
    """No client clock: the script refills by Redis's TIME, read here around the calls."""
    admin = redis.Redis.from_url(redis_url)
    rate = 0.5
    bucket = RedisTokenBucket(redis_url, "server-clock", 5, rate, timeout_s=PATIENT_S)
    began = server_time_s(admin)
    decisions = [bucket.try_acquire() for _ in range(9)]
    elapsed = server_time_s(admin) - began
    assert all(d.admitted for d in decisions[:5])  # a new key is a full bucket
    # Every later admit needs a token refilled on the server's clock: at most rate x elapsed.
    assert sum(d.admitted for d in decisions[5:]) <= rate * elapsed
    last = decisions[-1]
    if not last.admitted:  # its wait is the server's own arithmetic on the server's clock
        assert last.retry_after_s == pytest.approx((1 - last.remaining) / rate, abs=1e-6)
        assert 0 < last.retry_after_s <= 1 / rate
    ttl_ms = admin.pttl("server-clock")
    # The key expires once the bucket would be full again (plus a second): idle = absent.
    assert 0 < ttl_ms <= math.ceil((5 - last.remaining) / rate * 1000) + 1_000


def test_rpm_and_tpm_are_charged_together_or_not_at_all(redis_url: str) -> None:
    clock = FakeClock()
    limiter = RedisRateLimiter(
        redis_url, "tier:free", requests_per_minute=3, tokens_per_minute=10_000, clock=clock,
        timeout_s=PATIENT_S,
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
    bucket = RedisTokenBucket(redis_url, "v", capacity=10, refill_per_s=1, timeout_s=PATIENT_S)
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
    """Redis holds the script (CLIENT PAUSE WRITE): one attempt, a timeout, no retry."""
    admin = redis.Redis.from_url(redis_url)
    bucket = RedisTokenBucket(redis_url, "stalled", 10, 1, timeout_s=0.5)
    bucket.try_acquire()  # connected and answering
    connections = admin.info("stats")["total_connections_received"]
    admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")  # scripts wait, reads do not
    try:
        with pytest.raises(LimiterUnavailableError, match="Redis at 127.0.0.1:.*Timeout"):
            bucket.try_acquire()
        # A retry would have reconnected (the timed-out connection is dropped): none did.
        assert admin.info("stats")["total_connections_received"] == connections
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")


# --- the race ---------------------------------------------------------------------------

WRITERS, CAPACITY, REFILL_PER_S, DURATION_S = 8, 50.0, 20.0, 0.5


def test_the_naive_bucket_is_right_alone(redis_url: str) -> None:
    """Sequentially, GET-then-SET gives the same answers: the bug is concurrency."""
    clock = FakeClock()
    naive = NaiveRedisTokenBucket(
        redis_url, "alone", CAPACITY, REFILL_PER_S, clock=clock, timeout_s=PATIENT_S
    )
    local = TokenBucket(CAPACITY, REFILL_PER_S, clock=clock)
    for step in range(300):
        clock.now += 0.01 * (step % 7)
        assert naive.try_acquire().admitted == local.try_acquire().admitted


def test_eight_writer_processes_never_push_the_lua_bucket_past_its_limit(
    redis_server: str,
) -> None:
    """Eight processes hammer one key: never more than capacity + refill x elapsed."""
    admitted, attempts, span = contend(
        "lua", redis_server, writers=WRITERS, capacity=CAPACITY,
        refill_per_s=REFILL_PER_S, duration_s=DURATION_S,
    )
    assert CAPACITY <= admitted <= CAPACITY + REFILL_PER_S * span + 1e-6
    # The limit mattered: at least 8 x 100 attempts, far more than the bucket could admit
    # (it would take a span of (800 - 50) / 20 = 37.5 s for them to fit).
    assert attempts > admitted


@pytest.mark.parametrize("kind", ["naive", "lua"])
def test_reads_that_overtake_writes_make_get_then_set_over_admit(
    redis_server: str, kind: str
) -> None:
    """Eight writer processes, their first attempts held at Redis until all eight are there.

    Every naive writer has read the full bucket before any writes it back: eight admits
    for one token's decrement, and later races only add more. The Lua writers wait with
    their whole scripts, which then run one after another. The refill is negligible
    (1 token in 1,000 s), so the correct count is the capacity, exactly.
    """
    refill = 1e-3
    admitted, attempts, span = contend(
        kind, redis_server, writers=WRITERS, capacity=CAPACITY, refill_per_s=refill,
        duration_s=0.2, hold_writes=True,
    )
    bound = CAPACITY + refill * span
    assert attempts >= WRITERS * MIN_ATTEMPTS > bound  # every token asked for many times over
    if kind == "lua":
        assert admitted == CAPACITY
    else:
        # All eight first reads saw the full bucket: 8 admitted, the count down by 1 only.
        assert admitted >= CAPACITY + WRITERS - 1 > bound


# --- Redis Cluster: both buckets in one hash slot ---------------------------------------


def test_hash_slot_matches_the_redis_cluster_documentation() -> None:
    # The examples of Redis's CLUSTER KEYSLOT page: a plain key, and two keys whose
    # shared hash tag puts them in one slot.
    assert kvlib.serving.ratelimit.hash_slot("somekey") == 11058
    assert kvlib.serving.ratelimit.hash_slot("foo{hash_tag}") == 2515
    assert kvlib.serving.ratelimit.hash_slot("bar{hash_tag}") == 2515
    # An empty tag is no tag: the whole key is hashed.
    assert kvlib.serving.ratelimit.hash_slot("{}x") != kvlib.serving.ratelimit.hash_slot("x")


def test_the_limiter_keys_share_a_cluster_slot() -> None:
    requests_key, tokens_key = kvlib.serving.ratelimit.limiter_keys("tier:free")
    assert (requests_key, tokens_key) == ("{tier:free}:requests", "{tier:free}:tokens")
    slot = kvlib.serving.ratelimit.hash_slot
    assert slot(requests_key) == slot(tokens_key) == slot("tier:free")
    # Without the tag the two names land in different slots (CROSSSLOT on a cluster).
    assert slot("tier:free:requests") != slot("tier:free:tokens")
    with pytest.raises(ValueError, match="contains a brace"):
        kvlib.serving.ratelimit.limiter_keys("{tier}")


def test_the_limiter_writes_the_tagged_keys(redis_url: str) -> None:
    limiter = RedisRateLimiter(
        redis_url, "acme", requests_per_minute=60, tokens_per_minute=6_000,
        clock=FakeClock(), timeout_s=PATIENT_S,
    )
    assert limiter.admit(estimated_tokens=100).admitted
    client = redis.Redis.from_url(redis_url)
    assert sorted(k.decode() for k in client.keys("*")) == ["{acme}:requests", "{acme}:tokens"]
    client.close()
