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

The package's modules: :mod:`~kvlib.serving.ratelimit.connection` (the client, its
address and the unavailable-limiter error), :mod:`~kvlib.serving.ratelimit.atomic` (the
Lua script and the two limiters built on it), :mod:`~kvlib.serving.ratelimit.naive`
(the racy bucket). The in-process :class:`TokenBucket`, :class:`Decision`,
:func:`per_minute` and :func:`burst_admits` are re-exported from
:mod:`kvlib.serving.bucket`. ``redis`` is imported inside the Redis classes only, so
importing this package needs nothing beyond the standard library.
"""

from __future__ import annotations

from kvlib.serving.bucket import Decision, TokenBucket, burst_admits, per_minute
from kvlib.serving.ratelimit.atomic import (
    RedisRateLimiter,
    RedisTokenBucket,
    hash_slot,
    limiter_keys,
)
from kvlib.serving.ratelimit.connection import LimiterUnavailableError
from kvlib.serving.ratelimit.naive import NaiveRedisTokenBucket

__all__ = [
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
