"""Refused requests come back: what shedding saves when clients retry.

A 429 is not the end of a request: clients retry. If each attempt is refused
at random with probability ``f`` and a client tries at most ``1 + k`` times,
the attempts are independent coin flips, so::

    served share           = 1 - f^(k+1)
    attempts per request   = (1 - f^(k+1)) / (1 - f)
    admitted load          = lambda x (1 - f^(k+1))

With unlimited retries (``k`` -> infinity) every request is served in the end
and the admitted load does not fall at all: shedding only delays it and
multiplies the gateway's traffic by ``1 / (1 - f)``. To admit a share
``1 - f*`` of requests the gateway must refuse ``f = f*^(1/(k+1))`` of attempts.

A **retry budget** caps retries at a share ``beta`` of first attempts
(Google's SRE book, "Handling Overload": a per-client budget of 10%; gRPC's
retry throttling, proposal A6, and Finagle's ``RetryBudget`` do the same with a
token bucket of retries). Retries then add at most ``beta`` to the load:
:func:`admitted_share_with_budget`.

*When* retries come back matters as much as how many: a whole-second
``Retry-After`` sends every client refused in one burst back at the same
instant, where they meet the same empty bucket again; exponential backoff
with "full jitter" (wait a uniform time in ``[0, min(cap, base x 2^n)]``;
M. Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog, 2015)
spreads them. :func:`simulate_retries` replays a burst against a
:class:`~kvlib.serving.bucket.TokenBucket` under either policy.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass

from kvlib._validate import is_number, require_int
from kvlib.serving.bucket import TokenBucket

__all__ = [
    "RetryPolicy",
    "RetryRun",
    "admitted_share_with_budget",
    "attempts_per_request",
    "refuse_share_for_admitted",
    "served_share",
    "simulate_retries",
]


def _share(name: str, value: float, *, top_open: bool = False) -> float:
    if not is_number(value) or not (0 <= value < 1 if top_open else 0 <= value <= 1):
        bound = "< 1" if top_open else "<= 1"
        raise ValueError(f"{name} must be a share, 0 <= {name} {bound}, got {value!r}")
    return float(value)


def _retries(max_retries: int | None) -> int | None:
    return None if max_retries is None else require_int(max_retries, "max_retries")


def served_share(refuse_share: float, max_retries: int | None) -> float:
    """``1 - f^(k+1)``: requests admitted within ``1 + k`` attempts (``None``: unlimited)."""
    f, k = _share("refuse_share", refuse_share), _retries(max_retries)
    if k is None:
        return 1.0 if f < 1 else 0.0
    return 1 - f ** (k + 1)


def attempts_per_request(refuse_share: float, max_retries: int | None) -> float:
    """``(1 - f^(k+1)) / (1 - f)``: attempts the gateway sees per request."""
    f = _share("refuse_share", refuse_share, top_open=True)
    return served_share(f, max_retries) / (1 - f)


def refuse_share_for_admitted(admitted_share: float, max_retries: int | None) -> float:
    """The share of attempts to refuse so that ``admitted_share`` of requests get in.

    ``f = (1 - admitted)^(1/(k+1))``; with unlimited retries no random refusal
    lowers the admitted load, and a ValueError says so.
    """
    a, k = _share("admitted_share", admitted_share), _retries(max_retries)
    if k is None:
        raise ValueError(
            "with unlimited retries every refused request comes back until admitted: random "
            "refusals cannot lower the admitted load. Cap retries (max_retries) or use a "
            "retry budget."
        )
    return float((1 - a) ** (1 / (k + 1)))


def admitted_share_with_budget(
    refuse_share: float, max_retries: int | None, budget_ratio: float
) -> float:
    """Admitted requests per first attempt when retries may be at most ``budget_ratio``
    of first attempts: ``(1 - f) (1 + min(beta, wanted))``, ``wanted`` the retries per
    request the clients would send, ``f (1 - f^k) / (1 - f)`` (``f / (1 - f)`` unlimited).

    The budget is taken to drop retries at random, so each retry is refused with
    the same ``f`` as a first attempt.
    """
    f = _share("refuse_share", refuse_share, top_open=True)
    beta = _share("budget_ratio", budget_ratio)
    wanted = attempts_per_request(f, max_retries) - 1
    return (1 - f) * (1 + min(beta, wanted))


@dataclass(frozen=True)
class RetryPolicy:
    """How a refused client waits before its next attempt.

    ``kind="retry_after"``: exactly the ``Retry-After`` header, whole seconds
    rounded up; ``kind="backoff"``: a uniform time in ``[0, min(cap_s, base_s x
    2^n)]`` after the ``n``-th refusal (full jitter). ``max_attempts`` counts the
    first one too.
    """

    kind: str = "retry_after"
    base_s: float = 0.5
    cap_s: float = 30.0
    max_attempts: int = 1_000

    def __post_init__(self) -> None:
        if self.kind not in ("retry_after", "backoff"):
            raise ValueError(f"kind must be 'retry_after' or 'backoff', got {self.kind!r}")
        if not self.base_s > 0 or not self.cap_s >= self.base_s:
            raise ValueError("base_s must be > 0 and cap_s >= base_s (seconds)")
        if isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts!r}")

    def wait_s(self, retry_after_s: float, refusals: int, rng: random.Random) -> float:
        """Seconds to wait after the ``refusals``-th refusal."""
        if self.kind == "retry_after":
            return float(max(1, math.ceil(retry_after_s)))
        return rng.uniform(0.0, min(self.cap_s, self.base_s * 2 ** (refusals - 1)))


@dataclass(frozen=True)
class RetryRun:
    """Every attempt of a replayed burst: when it came, and whether it was admitted."""

    attempt_s: tuple[float, ...]
    admitted: tuple[bool, ...]
    requests: int

    @property
    def attempts(self) -> int:
        """Attempts the gateway answered, first ones included."""
        return len(self.attempt_s)

    @property
    def served(self) -> int:
        """Requests admitted in the end."""
        return sum(self.admitted)

    def last_admit_s(self) -> float:
        """When the last request got in."""
        return max(t for t, ok in zip(self.attempt_s, self.admitted, strict=True) if ok)

    def peak_attempts(self, window_s: float = 0.1, after_s: float = 0.0) -> int:
        """The most attempts in any ``window_s`` bin later than ``after_s``: how spiky
        the gateway's load is once the first burst has passed."""
        bins = Counter(math.floor(t / window_s + 1e-9) for t in self.attempt_s if t > after_s)
        return max(bins.values(), default=0)


def simulate_retries(
    requests: int,
    capacity: float,
    refill_per_s: float,
    policy: RetryPolicy,
    *,
    seed: int = 0,
) -> RetryRun:
    """Replay ``requests`` first attempts, all at once, against a full bucket; refused
    ones retry under ``policy`` until admitted or out of attempts."""
    require_int(requests, "requests", 1)
    rng = random.Random(seed)
    now = [0.0]
    bucket = TokenBucket(capacity, refill_per_s, clock=lambda: now[0])
    heap = [(0.0, i, 1) for i in range(requests)]
    times: list[float] = []
    oks: list[bool] = []
    while heap:
        t, i, attempt = heapq.heappop(heap)
        now[0] = t
        decision = bucket.try_acquire()
        times.append(t)
        oks.append(decision.admitted)
        if not decision.admitted and attempt < policy.max_attempts:
            wait = policy.wait_s(decision.retry_after_s, attempt, rng)
            heapq.heappush(heap, (t + wait, i, attempt + 1))
    return RetryRun(tuple(times), tuple(oks), requests)
