"""Token-bucket rate limits shared by every gateway, through Redis.

A customer's requests land on any of many gateway processes, so the bucket of
:mod:`kvlib.serving.bucket` (same rule, same formulas) must live where all of
them see it, and be checked and charged in one step. Redis runs a script to
completion before it serves any other command, so a Lua script that reads a
bucket, refills it to the server's clock (``TIME``), decides and writes it back
cannot be interleaved with another gateway's: concurrent gateways never spend
the same tokens twice (:class:`RedisTokenBucket`, :class:`RedisRateLimiter`).
:class:`NaiveRedisTokenBucket` (GET, decide in Python, SET) is kept only to show
the race.

A script may only touch keys that live on one node. On Redis Cluster a key's
node is set by its hash slot, ``CRC16(key) mod 16384``, computed on the part
between the first ``{`` and the next ``}`` when that part is not empty (the
"hash tag"; Redis Cluster specification, "Hash tags"). The limiter's two
buckets are therefore ``{key}:requests`` and ``{key}:tokens``: one slot, so the
one script may charge both, where ``key:requests`` and ``key:tokens`` would be
refused with ``CROSSSLOT`` on a cluster.

When Redis is unreachable or does not answer within the timeout, the limiters
fail *closed* by default: they raise :class:`LimiterUnavailableError` naming the
server's address, and the gateway must refuse the request (503, not 429: the
client did nothing wrong). ``fail_open=True`` admits instead and marks the
decision ``degraded``: right for a free tier you would rather serve unmetered
than refuse during a Redis outage, wrong for anything billed. No retries: a
retried script that had in fact run would charge twice. ``redis`` is imported
inside the functions, so importing this module needs only the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvlib._validate import require_positive
from kvlib.serving.bucket import (
    EPSILON_TOKENS,
    Decision,
    TokenBucket,
    burst_admits,
    per_minute,
    require_cost,
    settlement,
)

if TYPE_CHECKING:
    import redis

__all__ = [
    "LUA_SCRIPT",
    "Decision",
    "LimiterUnavailableError",
    "NaiveRedisTokenBucket",
    "RedisRateLimiter",
    "RedisTokenBucket",
    "TokenBucket",
    "burst_admits",
    "hash_slot",
    "limiter_keys",
    "per_minute",
]

DEFAULT_TIMEOUT_S = 0.25
CLUSTER_SLOTS = 16_384


class LimiterUnavailableError(ConnectionError):
    """Redis did not answer: the limiter cannot decide (fail closed: refuse the request)."""


def address(client: redis.Redis) -> str:
    """The server a client talks to, as ``host:port`` or ``unix:path``, for error messages."""
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def connect(client: redis.Redis | str, timeout_s: float) -> redis.Redis:
    """``client`` itself, or a new client for a ``redis://`` URL with short timeouts, no retries."""
    import redis as redis_py
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    if isinstance(client, str):
        return redis_py.Redis.from_url(
            client,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
    return client


def hash_slot(key: str) -> int:
    """Redis Cluster's slot of ``key``: ``CRC16(tag or key) mod 16384`` (hash tag: see above)."""
    raw = key.encode()
    start = raw.find(b"{")
    if start != -1:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    crc = 0  # CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), the CRC Redis Cluster uses
    for byte in raw:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % CLUSTER_SLOTS


def limiter_keys(key: str) -> tuple[str, str]:
    """The request and token buckets' keys, ``{key}:requests`` and ``{key}:tokens``: one slot.

    ``key`` must not contain braces itself: its own tag would then decide the slot.
    """
    if "{" in key or "}" in key:
        raise ValueError(
            f"key {key!r} contains a brace: the limiter wraps the key in braces as its "
            "Redis Cluster hash tag; pass the customer's id without braces"
        )
    return f"{{{key}}}:requests", f"{{{key}}}:tokens"


# One script for every Redis limiter: refill each bucket to now, then either charge all
# buckets their cost (mode 'take': only if every bucket holds it) or add a signed amount
# to them (mode 'adjust': reconciling an estimate, never refused, may go negative).
LUA_SCRIPT = """
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local take = ARGV[2] == 'take'
local n = #KEYS
local tokens, caps, rates, costs, stamps = {}, {}, {}, {}, {}
local wait = 0
for i = 1, n do
  local cap = tonumber(ARGV[3 * i]); local rate = tonumber(ARGV[3 * i + 1])
  local cost = tonumber(ARGV[3 * i + 2])
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local t = tonumber(state[1]); local ts = tonumber(state[2])
  if t == nil or ts == nil then t = cap; ts = now end
  if now > ts then
    t = math.min(cap, t + (now - ts) * rate / 1000000); ts = now
  end
  tokens[i], caps[i], rates[i], costs[i], stamps[i] = t, cap, rate, cost, ts
  if take and t + EPSILON < cost then wait = math.max(wait, (cost - t) / rate) end
end
local admitted = 0
if take and wait == 0 then admitted = 1 end
local out = {tostring(admitted), string.format('%.17g', wait)}
for i = 1, n do
  if admitted == 1 then tokens[i] = tokens[i] - costs[i] end
  if not take then tokens[i] = math.min(caps[i], tokens[i] - costs[i]) end
  redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', tokens[i]),
             'ts', string.format('%.17g', stamps[i]))
  -- an idle bucket refills to full and is then the same as no key at all
  local full_ms = math.ceil((caps[i] - tokens[i]) / rates[i] * 1000)
  redis.call('PEXPIRE', KEYS[i], full_ms + 1000)
  out[#out + 1] = string.format('%.17g', tokens[i])
end
return out
""".replace("EPSILON", repr(EPSILON_TOKENS))


class _Buckets:
    """Buckets charged together by the Lua script (one Redis hash each)."""

    def __init__(
        self,
        client: redis.Redis | str,
        keys: Sequence[str],
        limits: Sequence[tuple[float, float]],
        *,
        fail_open: bool,
        clock: Callable[[], float] | None,
        timeout_s: float,
    ) -> None:
        self.client = connect(client, require_positive(timeout_s, "timeout_s"))
        self.keys = list(keys)
        self.limits = [
            (require_positive(c, "capacity"), require_positive(r, "refill_per_s"))
            for c, r in limits
        ]
        self.fail_open = fail_open
        self.clock = clock
        self.script = self.client.register_script(LUA_SCRIPT)

    def run(self, mode: str, costs: Sequence[float]) -> tuple[bool, float, list[float]]:
        """(admitted, seconds to wait, tokens per bucket) after the script ran."""
        import redis as redis_py

        now = "" if self.clock is None else repr(round(self.clock() * 1e6))
        args: list[str] = [now, mode]
        for (capacity, rate), cost in zip(self.limits, costs, strict=True):
            args += [repr(capacity), repr(rate), repr(float(cost))]
        try:
            reply = self.script(keys=self.keys, args=args)
        except (redis_py.ConnectionError, redis_py.TimeoutError) as err:
            raise LimiterUnavailableError(
                f"rate limiter: Redis at {address(self.client)} did not answer ({err}). "
                + (
                    "Failing open: the request is admitted unmetered."
                    if self.fail_open
                    else "Failing closed: refuse the request (503), start redis-server there, "
                    "or construct the limiter with fail_open=True to admit while Redis is down."
                )
            ) from err
        values = [float(v) for v in reply]
        return values[0] == 1, values[1], values[2:]

    def take(self, costs: Sequence[float]) -> Decision:
        """Charge every bucket its cost, or none; the last bucket's tokens are ``remaining``."""
        try:
            admitted, wait_s, tokens = self.run("take", costs)
        except LimiterUnavailableError:
            if self.fail_open:
                return Decision(True, None, 0.0, degraded=True)
            raise
        requests = tokens[0] if len(tokens) > 1 else None
        return Decision(admitted, tokens[-1], wait_s, remaining_requests=requests)

    def adjust(self, deltas: Sequence[float], index: int) -> float | None:
        """Add ``-delta`` to each bucket; bucket ``index``'s tokens after (None: skipped)."""
        try:
            return self.run("adjust", deltas)[2][index]
        except LimiterUnavailableError:
            if self.fail_open:
                return None
            raise


class RedisTokenBucket:
    """A token bucket in Redis under ``key``, checked and charged by one Lua script.

    ``client`` is a ``redis.Redis`` or a ``redis://host:port/db`` URL (then the
    connection uses ``timeout_s`` and no retries). ``clock`` (seconds) replaces
    the server's ``TIME``; only for tests: every gateway must share one clock.
    """

    def __init__(
        self,
        client: redis.Redis | str,
        key: str,
        capacity: float,
        refill_per_s: float,
        *,
        fail_open: bool = False,
        clock: Callable[[], float] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self._buckets = _Buckets(
            client, [key], [(capacity, refill_per_s)], fail_open=fail_open, clock=clock,
            timeout_s=timeout_s,
        )
        self.capacity, self.refill_per_s = self._buckets.limits[0]

    def try_acquire(self, cost: float = 1.0) -> Decision:
        """Take ``cost`` tokens atomically if the bucket holds them; else 429 with Retry-After."""
        return self._buckets.take([require_cost(cost, self.capacity)])

    def tokens(self) -> float:
        """Tokens in the bucket now (a zero-cost check)."""
        return self._buckets.run("take", [0.0])[2][0]

    def reconcile(self, estimated_tokens: float, actual_tokens: float) -> float | None:
        """Refund (or charge) ``estimated - actual`` tokens; the tokens after, or ``None``
        when Redis is unreachable and the bucket fails open (the settlement is skipped)."""
        return self._buckets.adjust([settlement(estimated_tokens, actual_tokens)], 0)


class RedisRateLimiter:
    """Requests per minute and LLM tokens per minute, enforced together in Redis.

    ``admit(estimated_tokens)`` charges one request and the estimated tokens,
    to both buckets or to neither; ``complete(estimated, actual)`` settles the
    token bucket once the reply's real size is known. Each bucket holds a
    minute's allowance unless ``request_burst`` / ``token_burst`` say otherwise,
    and refills at ``limit / 60`` a second. The keys are :func:`limiter_keys`'s.
    """

    def __init__(
        self,
        client: redis.Redis | str,
        key: str,
        *,
        requests_per_minute: float,
        tokens_per_minute: float,
        request_burst: float | None = None,
        token_burst: float | None = None,
        fail_open: bool = False,
        clock: Callable[[], float] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        rpm = require_positive(requests_per_minute, "requests_per_minute")
        tpm = require_positive(tokens_per_minute, "tokens_per_minute")
        request_capacity = rpm if request_burst is None else request_burst
        token_capacity = tpm if token_burst is None else token_burst
        limits = [(request_capacity, per_minute(rpm)), (token_capacity, per_minute(tpm))]
        self._buckets = _Buckets(
            client, list(limiter_keys(key)), limits, fail_open=fail_open,
            clock=clock, timeout_s=timeout_s,
        )

    def admit(self, estimated_tokens: float) -> Decision:
        """Admit one request expected to use ``estimated_tokens`` (prompt + max output)."""
        cost = require_cost(estimated_tokens, self._buckets.limits[1][0], "estimated_tokens")
        return self._buckets.take([1.0, cost])

    def complete(self, estimated_tokens: float, actual_tokens: float) -> float | None:
        """Settle a finished request: refund or charge ``actual - estimated`` tokens.

        Returns the token bucket's tokens after (``None``: Redis unreachable, failing open).
        """
        return self._buckets.adjust([0.0, settlement(estimated_tokens, actual_tokens)], 1)


class NaiveRedisTokenBucket:
    """The racy bucket, for teaching only: GET the state, decide here, SET it back.

    Between this client's GET and SET another client can GET the same state,
    and both spend the same tokens: under concurrent gateways it admits more
    than the limit. The window is two network round trips plus the Python in
    between; nothing is added to widen it. Use :class:`RedisTokenBucket` instead.
    """

    def __init__(
        self,
        client: redis.Redis | str,
        key: str,
        capacity: float,
        refill_per_s: float,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.client = connect(client, require_positive(timeout_s, "timeout_s"))
        self.key = key
        self.capacity = require_positive(capacity, "capacity")
        self.refill_per_s = require_positive(refill_per_s, "refill_per_s")
        self.clock = clock

    def try_acquire(self, cost: float = 1.0) -> Decision:
        """GET, refill, decide, SET: correct alone, wrong under concurrency."""
        cost = require_cost(cost, self.capacity)
        now = self.clock()
        raw = self.client.get(self.key)
        tokens, last = (self.capacity, now) if raw is None else map(float, raw.split())
        tokens = min(self.capacity, tokens + max(0.0, now - last) * self.refill_per_s)
        admitted = tokens + EPSILON_TOKENS >= cost
        if admitted:
            tokens -= cost
        self.client.set(self.key, f"{tokens!r} {max(now, last)!r}")
        wait_s = 0.0 if admitted else (cost - tokens) / self.refill_per_s
        return Decision(admitted, tokens, wait_s)
