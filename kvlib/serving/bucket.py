"""The token bucket, in one process: the rule every rate limiter of the course follows.

A token bucket holds at most ``capacity`` tokens and gains ``refill_per_s``
tokens a second, continuously, until full. A request costing ``c`` tokens is
admitted when the bucket holds at least ``c``, and then ``c`` tokens are
taken; otherwise it is refused with HTTP 429 (RFC 6585 §4) and the seconds
until ``c`` tokens are back,

    retry_after_s = (c - tokens) / refill_per_s,

sent as ``Retry-After`` (whole seconds, rounded up: RFC 9110 §10.2.3). From
full, a burst of ``n`` simultaneous requests of cost 1 gets ``min(n,
floor(capacity))`` admits; arrivals spread over ``T`` seconds, no faster than
the refill keeps up with, get ``min(n, floor(capacity + refill_per_s * T))``.
Provider limits are quoted per minute (requests per minute, RPM; LLM tokens
per minute, TPM): :func:`per_minute` converts, because a per-minute figure used
as a per-second rate admits 60 times too much.

LLM-token limits charge an estimate at admission (prompt tokens plus the
request's ``max_tokens``) and :meth:`TokenBucket.reconcile` settles it with the
tokens actually used. :mod:`kvlib.serving.ratelimit` keeps the same rule in Redis.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvlib._validate import WrongTypeError, is_int, is_number, require_positive

__all__ = [
    "EPSILON_TOKENS",
    "Decision",
    "TokenBucket",
    "burst_admits",
    "require_cost",
    "per_minute",
    "settlement",
]

# Tokens are floats: refills of r * dt land a hair below a whole number (49.999...),
# so a bucket counts as holding `cost` when it is within this many tokens of it.
EPSILON_TOKENS = 1e-9


def per_minute(limit_per_minute: float) -> float:
    """A per-minute limit (RPM or TPM) as a refill rate per second: ``limit / 60``."""
    return require_positive(limit_per_minute, "limit_per_minute") / 60.0


@dataclass(frozen=True)
class Decision:
    """The limiter's answer for one request.

    ``remaining``: tokens left after it (a two-bucket limiter's LLM-token bucket;
    its request bucket's is ``remaining_requests``), None when unknown (failing
    open). ``retry_after_s``: 0 when admitted, else the seconds until the cost is
    back in every bucket it needs.
    """

    admitted: bool
    remaining: float | None
    retry_after_s: float
    degraded: bool = False  # admitted without a check: the limiter was unreachable
    remaining_requests: float | None = None

    @property
    def status_code(self) -> int:
        """200 when admitted, 429 (Too Many Requests) when refused."""
        return 200 if self.admitted else 429

    def headers(self) -> dict[str, str]:
        """HTTP headers for a refusal: ``Retry-After`` in whole seconds, rounded up."""
        if self.admitted:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


def require_cost(cost: float, capacity: float, what: str = "cost") -> float:
    """A request's cost in tokens, refused if negative or larger than the bucket can ever hold."""
    if not is_number(cost) or not math.isfinite(cost):
        raise ValueError(f"{what} must be a finite number of tokens, got {cost!r}")
    if cost < 0:
        raise ValueError(f"{what} must be at least 0 tokens, got {cost!r}")
    if cost > capacity:
        raise ValueError(
            f"{what} of {cost:g} tokens exceeds the bucket's capacity of {capacity:g}: it could "
            "never be admitted. Raise the capacity (burst) or split the request."
        )
    return float(cost)


def settlement(estimated_tokens: float, actual_tokens: float) -> float:
    """``actual - estimated``: the tokens still to charge (negative: to refund), checked."""
    for name, value in (("estimated_tokens", estimated_tokens), ("actual_tokens", actual_tokens)):
        if not is_number(value):
            raise WrongTypeError(f"{name} must be a number of tokens, got {type(value).__name__}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(actual_tokens) - float(estimated_tokens)


class TokenBucket:
    """A token bucket in this process; ``clock()`` gives seconds (default ``time.monotonic``).

    Starts full unless ``tokens`` is given. Thread-safe.
    """

    def __init__(
        self,
        capacity: float,
        refill_per_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        tokens: float | None = None,
    ) -> None:
        self.capacity = require_positive(capacity, "capacity")
        self.refill_per_s = require_positive(refill_per_s, "refill_per_s")
        self._clock = clock
        self._tokens = self.capacity if tokens is None else float(tokens)
        if not self._tokens <= self.capacity:
            raise ValueError(f"tokens ({tokens!r}) must not exceed capacity ({capacity!r})")
        self._last_s = clock()
        self._lock = threading.Lock()

    def _refill(self) -> float:
        now = self._clock()
        if now > self._last_s:  # a clock that steps back refills nothing
            gained = (now - self._last_s) * self.refill_per_s
            self._tokens = min(self.capacity, self._tokens + gained)
            self._last_s = now
        return self._tokens

    def tokens(self) -> float:
        """Tokens in the bucket now (after the refill since the last call)."""
        with self._lock:
            return self._refill()

    def try_acquire(self, cost: float = 1.0) -> Decision:
        """Take ``cost`` tokens if the bucket holds them (200); else a 429 with Retry-After."""
        cost = require_cost(cost, self.capacity)
        with self._lock:
            tokens = self._refill()
            if tokens + EPSILON_TOKENS >= cost:
                self._tokens = tokens - cost
                return Decision(True, self._tokens, 0.0)
            return Decision(False, tokens, (cost - tokens) / self.refill_per_s)

    def admits_for_burst(self, requests: int, cost: float = 1.0) -> int:
        """Admit a burst of ``requests`` arriving now, each of ``cost``; return how many got in."""
        if not is_int(requests) or requests < 0:
            raise ValueError(f"requests must be a whole number >= 0, got {requests!r}")
        return sum(self.try_acquire(cost).admitted for _ in range(requests))

    def reconcile(self, estimated_tokens: float, actual_tokens: float) -> float:
        """Settle a request admitted on an estimate: refund or charge the difference.

        Tokens become ``min(capacity, tokens + estimated - actual)``; an
        under-estimate can leave the bucket negative (a debt the refill pays
        off before the next admit). Returns the tokens after settling.
        """
        delta = settlement(estimated_tokens, actual_tokens)
        with self._lock:
            tokens = self._refill()
            self._tokens = min(self.capacity, tokens - delta)
            return self._tokens


def burst_admits(
    capacity: float,
    refill_per_s: float,
    arrival_times_s: Iterable[float],
    *,
    cost: float = 1.0,
    tokens: float | None = None,
) -> int:
    """How many of the requests arriving at ``arrival_times_s`` (sorted) a bucket admits.

    The bucket starts full (or with ``tokens``) at the first arrival.
    """
    times = list(arrival_times_s)
    if any(b < a for a, b in zip(times, times[1:], strict=False)):
        raise ValueError("arrival_times_s must be sorted")
    if not times:
        return 0
    now = [times[0]]
    bucket = TokenBucket(capacity, refill_per_s, clock=lambda: now[0], tokens=tokens)
    admitted = 0
    for t in times:
        now[0] = t
        admitted += bucket.try_acquire(cost).admitted
    return admitted
