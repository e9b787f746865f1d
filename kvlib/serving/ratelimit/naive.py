"""The racy token bucket: GET the state, decide in Python, SET it back. For teaching only.

Two gateways that GET between each other's GET and SET both spend the same
tokens, so under concurrency it admits more than the limit. The window is two
network round trips plus the Python in between; nothing is added to widen it.
Use :class:`kvlib.serving.ratelimit.RedisTokenBucket` instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvlib._validate import require_positive
from kvlib.serving.bucket import EPSILON_TOKENS, Decision, check_cost
from kvlib.serving.ratelimit.connection import DEFAULT_TIMEOUT_S, connect

if TYPE_CHECKING:
    import redis

__all__ = ["NaiveRedisTokenBucket"]


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
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.client = connect(client, require_positive(timeout_s, "timeout_s"))
        self.key = key
        self.capacity = require_positive(capacity, "capacity")
        self.refill_per_s = require_positive(refill_per_s, "refill_per_s")
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
