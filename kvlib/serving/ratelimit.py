"""Token-bucket rate limits shared by every gateway, through Redis.

A provider runs many gateway processes, and a customer's requests land on any
of them, so the bucket of :mod:`kvlib.serving.bucket` (same rule, same
formulas) must live where all of them see it, and be checked and charged in
one step:

- :class:`RedisTokenBucket` and :class:`RedisRateLimiter`: the state lives in
  Redis and one Lua script reads, refills (to the server's clock, ``TIME``),
  decides and writes it. Redis runs a script to completion before any other
  command, so concurrent gateways can never spend the same tokens twice.
  :class:`RedisRateLimiter` checks a request bucket (RPM) and a token bucket
  (TPM) together: a request is admitted on its *estimated* tokens, charged to
  both buckets or to neither, and :meth:`~RedisRateLimiter.complete`
  reconciles the estimate with the tokens the reply actually used.
- :class:`NaiveRedisTokenBucket`: GET the state, decide in Python, SET it back.
  Two gateways that GET between each other's GET and SET both spend the same
  tokens. It is kept only to show that race; never use it.

When Redis is unreachable or does not answer within the timeout, the Redis
limiters fail *closed* by default: they raise :class:`LimiterUnavailableError`
naming the server's address, and the gateway must refuse the request (503, not
429: the client did nothing wrong). ``fail_open=True`` admits instead and marks
the decision ``degraded``: right for a free tier you would rather serve
unmetered than refuse during a Redis outage, wrong for anything billed. No
retries: a retried script that had in fact run would charge twice.

The in-process :class:`TokenBucket`, :class:`Decision`, :func:`per_minute` and
:func:`burst_admits` are re-exported from :mod:`kvlib.serving.bucket`.
``redis`` is imported inside the Redis classes only, so importing this module
needs nothing beyond the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvlib.serving.bucket import (
    EPSILON_TOKENS,
    Decision,
    TokenBucket,
    burst_admits,
    check_cost,
    per_minute,
    require_positive,
    settlement,
)

if TYPE_CHECKING:
    import redis

__all__ = [
    "Decision",
    "LimiterUnavailableError",
    "NaiveRedisTokenBucket",
    "RedisRateLimiter",
    "RedisTokenBucket",
    "TokenBucket",
    "burst_admits",
    "per_minute",
]

_DEFAULT_TIMEOUT_S = 0.25


class LimiterUnavailableError(ConnectionError):
    """Redis did not answer: the limiter cannot decide (fail closed: refuse the request)."""


# One script for every Redis limiter: refill each bucket to now, then either charge all
# buckets their cost (mode 'take': only if every bucket holds it) or add a signed amount
# to them (mode 'adjust': reconciling an estimate, never refused, may go negative).
_LUA = """
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


def _address(client: redis.Redis) -> str:
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _connect(client: redis.Redis | str, timeout_s: float) -> redis.Redis:
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
        self.client = _connect(client, require_positive("timeout_s", timeout_s))
        self.keys = list(keys)
        self.limits = [
            (require_positive("capacity", c), require_positive("refill_per_s", r))
            for c, r in limits
        ]
        self.fail_open = fail_open
        self.clock = clock
        self.script = self.client.register_script(_LUA)

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
                f"rate limiter: Redis at {_address(self.client)} did not answer ({err}). "
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
        timeout_s: float = _DEFAULT_TIMEOUT_S,
    ) -> None:
        self._buckets = _Buckets(
            client, [key], [(capacity, refill_per_s)], fail_open=fail_open, clock=clock,
            timeout_s=timeout_s,
        )  # fmt: skip
        self.capacity, self.refill_per_s = self._buckets.limits[0]

    def try_acquire(self, cost: float = 1.0) -> Decision:
        """Take ``cost`` tokens atomically if the bucket holds them; else 429 with Retry-After."""
        return self._buckets.take([check_cost(cost, self.capacity)])

    def tokens(self) -> float:
        """Tokens in the bucket now (a zero-cost check)."""
        return self._buckets.run("take", [0.0])[2][0]

    def reconcile(self, estimated_tokens: float, actual_tokens: float) -> float | None:
        """Refund (or charge) ``estimated - actual`` tokens; the tokens after.

        ``None`` when Redis is unreachable and the bucket fails open (the
        settlement is skipped); failing closed raises instead.
        """
        return self._buckets.adjust([settlement(estimated_tokens, actual_tokens)], 0)


class RedisRateLimiter:
    """Requests per minute and LLM tokens per minute, enforced together in Redis.

    ``admit(estimated_tokens)`` charges one request and the estimated tokens,
    to both buckets or to neither; ``complete(estimated, actual)`` settles the
    token bucket once the reply's real size is known. Each bucket holds a
    minute's allowance unless ``request_burst`` / ``token_burst`` say otherwise,
    and refills at ``limit / 60`` a second.
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
        timeout_s: float = _DEFAULT_TIMEOUT_S,
    ) -> None:
        rpm = require_positive("requests_per_minute", requests_per_minute)
        tpm = require_positive("tokens_per_minute", tokens_per_minute)
        request_capacity = rpm if request_burst is None else request_burst
        token_capacity = tpm if token_burst is None else token_burst
        limits = [(request_capacity, per_minute(rpm)), (token_capacity, per_minute(tpm))]
        self._buckets = _Buckets(
            client, [f"{key}:requests", f"{key}:tokens"], limits, fail_open=fail_open,
            clock=clock, timeout_s=timeout_s,
        )  # fmt: skip

    def admit(self, estimated_tokens: float) -> Decision:
        """Admit one request expected to use ``estimated_tokens`` (prompt + max output)."""
        token_capacity = self._buckets.limits[1][0]
        cost = check_cost(estimated_tokens, token_capacity, "estimated_tokens")
        return self._buckets.take([1.0, cost])

    def complete(self, estimated_tokens: float, actual_tokens: float) -> float | None:
        """Settle a finished request: refund or charge ``actual - estimated`` tokens.

        Returns the token bucket's tokens after (``None``: Redis unreachable, failing open).
        """
        return self._buckets.adjust([0.0, settlement(estimated_tokens, actual_tokens)], 1)


class NaiveRedisTokenBucket:
    """The racy bucket: GET the state, decide here, SET it back. For teaching only.

    Between this client's GET and SET another client can GET the same state,
    and both spend the same tokens: under concurrent gateways it admits more
    than the limit. The window is two network round trips plus the Python in
    between; nothing is added to widen it.
    """

    def __init__(
        self,
        client: redis.Redis | str,
        key: str,
        capacity: float,
        refill_per_s: float,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = _DEFAULT_TIMEOUT_S,
    ) -> None:
        self.client = _connect(client, require_positive("timeout_s", timeout_s))
        self.key = key
        self.capacity = require_positive("capacity", capacity)
        self.refill_per_s = require_positive("refill_per_s", refill_per_s)
        self.clock = clock

    def try_acquire(self, cost: float = 1.0) -> Decision:
        """GET, refill, decide, SET: correct alone, wrong under concurrency."""
        cost = check_cost(cost, self.capacity)
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
