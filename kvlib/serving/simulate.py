"""A GPU pool with a gateway, simulated: the check on every closed form of the queueing module.

The pool has ``servers`` batch slots; a request holds one slot for its whole
service time, which here does not depend on how full the batch is. Paid
requests are served before free ones, without evicting a running request
(non-preemptive priority), first come first served within a class. The
gateway (:class:`Gateway`) may refuse a free arrival (HTTP 429) before it
reaches the pool.

Two simulators of that model, fed the same :class:`ArrivalTrace`, give the
same waits up to floating-point rounding: :func:`simulate_pool_simpy` (SimPy's
``PriorityResource``, the field's standard tool and the reference) and
:func:`simulate_pool` (a heap of slot release times and two FIFO queues, fast
enough for a million arrivals in seconds). :func:`lindley_waits` is the
single-server FIFO case in closed recursion (Lindley, 1952):
``W[n+1] = max(0, W[n] + S[n] - A[n+1])``.

Waits of successive requests are correlated (a long queue stays long for a
while), so the textbook standard error of a mean is too small. :func:`batch_means`
drops a warm-up, cuts the rest of the run into contiguous batches, computes the
statistic (a mean or a quantile) per batch and treats the batch values as roughly
independent: their mean +- ``t * sd / sqrt(batches)`` (A. M. Law, *Simulation
Modeling and Analysis*, 5th ed., McGraw-Hill 2015, ch. 9, batch means).
:func:`t_quantile` gives Student's t without scipy.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from kvlib.serving.bucket import TokenBucket
from kvlib.serving.erlang import require_seconds, require_servers

__all__ = [
    "ArrivalTrace",
    "Estimate",
    "Gateway",
    "PoolRun",
    "batch_means",
    "lindley_waits",
    "poisson_workload",
    "simulate_pool",
    "simulate_pool_simpy",
    "t_quantile",
]

Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5).

    Within 2e-4 of the tables for ``df >= 9`` at ``p <= 0.995``.
    """
    if df < 9:
        raise ValueError(f"t_quantile needs df >= 9 for its accuracy, got {df}")
    z = NormalDist().inv_cdf(p)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / float(df) ** (k + 1) for k, term in enumerate(terms))


@dataclass(frozen=True)
class Estimate:
    """A simulated statistic and its confidence interval ``value +- half_width``."""

    value: float
    half_width: float
    confidence: float
    batches: int

    @property
    def low(self) -> float:
        return self.value - self.half_width

    @property
    def high(self) -> float:
        return self.value + self.half_width

    def contains(self, x: float) -> bool:
        """Whether ``x`` lies inside the interval."""
        return self.low <= x <= self.high


def batch_means(
    values: Floats,
    *,
    q: float | None = None,
    batches: int = 20,
    confidence: float = 0.95,
    warmup_fraction: float = 0.05,
) -> Estimate:
    """The mean (or ``q``-quantile) of ``values`` after the first ``warmup_fraction`` (the
    pool starts empty), +- ``t(confidence, batches - 1) * sd / sqrt(batches)`` over batches.

    A quantile that sits at the atom of zero waits (``P(W > 0)`` near ``1 - q``)
    is poorly estimated this way: each batch's quantile jumps between 0 and a
    positive value. Compare such quantiles through ``P(W > t)`` instead.
    """
    if batches < 10:
        raise ValueError(f"batches must be at least 10, got {batches}")
    data = np.asarray(values, dtype=float)[int(len(values) * warmup_fraction) :]
    if len(data) < 10 * batches:
        raise ValueError(f"{len(data)} values after warm-up are too few for {batches} batches")
    parts = np.array_split(data, batches)
    stats = np.array([np.quantile(p, q) if q is not None else p.mean() for p in parts])
    half = t_quantile(0.5 + confidence / 2, batches - 1) * stats.std(ddof=1) / math.sqrt(batches)
    return Estimate(float(stats.mean()), float(half), confidence, batches)


@dataclass(frozen=True)
class ArrivalTrace:
    """Requests in arrival order: when they arrive, their class, their service, a coin."""

    arrival_s: Floats
    paid: Bools
    service_s: Floats
    coin: Floats  # uniform on [0, 1): the gateway's random draw for this request

    def __len__(self) -> int:
        return len(self.arrival_s)


def poisson_workload(
    paid_per_s: float, free_per_s: float, service_s: float, arrivals: int, seed: int
) -> ArrivalTrace:
    """``arrivals`` requests: Poisson at ``paid + free`` per second, exponential services.

    Each is paid with probability ``paid / (paid + free)``, which splits the
    stream into two independent Poisson streams.
    """
    total = paid_per_s + free_per_s
    if not (paid_per_s >= 0 and free_per_s >= 0 and total > 0 and math.isfinite(total)):
        raise ValueError(
            f"paid_per_s and free_per_s must be >= 0 with a positive sum, got "
            f"{paid_per_s!r} and {free_per_s!r}"
        )
    require_seconds("service_s", service_s)
    if arrivals < 1:
        raise ValueError(f"arrivals must be at least 1, got {arrivals!r}")
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / total, arrivals))
    paid = rng.random(arrivals) < paid_per_s / total
    return ArrivalTrace(arrival, paid, rng.exponential(service_s, arrivals), rng.random(arrivals))


@dataclass(frozen=True)
class Gateway:
    """Which free arrivals the gateway refuses before they reach the pool.

    In this order: at random with probability ``shed_free``; when the free
    tier's token bucket (``free_bucket = (capacity, refill_per_s)``) is empty;
    when every slot is busy and ``free_queue_limit`` free requests already wait
    (0: a free request is admitted only if it can start at once). Paid requests
    always pass.
    """

    shed_free: float = 0.0
    free_bucket: tuple[float, float] | None = None
    free_queue_limit: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.shed_free <= 1:
            raise ValueError(f"shed_free must be between 0 and 1, got {self.shed_free!r}")
        if self.free_queue_limit is not None and self.free_queue_limit < 0:
            raise ValueError(f"free_queue_limit must be >= 0, got {self.free_queue_limit!r}")

    def meter(self) -> tuple[list[float], TokenBucket | None]:
        """A settable clock and the free tier's bucket on it (None without a bucket)."""
        now = [0.0]
        if self.free_bucket is None:
            return now, None
        capacity, refill_per_s = self.free_bucket
        return now, TokenBucket(capacity, refill_per_s, clock=lambda: now[0])

    def refuses(self, coin: float, bucket: TokenBucket | None, waiting: int, busy: bool) -> bool:
        """Whether a free arrival is refused, the rules in order (``waiting``: free
        requests already queued; ``busy``: every slot taken)."""
        if coin < self.shed_free:
            return True
        if bucket is not None and not bucket.try_acquire().admitted:
            return True
        return self.free_queue_limit is not None and busy and waiting >= self.free_queue_limit


@dataclass(frozen=True)
class PoolRun:
    """What happened to each request of a workload: admitted, and if so its wait."""

    workload: ArrivalTrace
    servers: int
    admitted: Bools
    wait_s: Floats  # NaN for requests the gateway refused

    def waits(self, paid: bool | None = None) -> Floats:
        """Waits of admitted requests (of one class, or both), in arrival order."""
        keep = self.admitted.copy()
        if paid is not None:
            keep &= self.workload.paid == paid
        return self.wait_s[keep]

    def refused_share(self, paid: bool = False) -> float:
        """The share of this class's arrivals the gateway refused."""
        mine = self.workload.paid == paid
        return float(np.mean(~self.admitted[mine])) if mine.any() else 0.0


def simulate_pool(workload: ArrivalTrace, servers: int, gateway: Gateway | None = None) -> PoolRun:
    """The pool, event by event, without SimPy: a heap of slot release times, two queues."""
    require_servers(servers)
    gate = gateway or Gateway()
    now, bucket = gate.meter()
    arrival, service = workload.arrival_s.tolist(), workload.service_s.tolist()
    paid, coin = workload.paid.tolist(), workload.coin.tolist()
    wait = [math.nan] * len(arrival)
    admitted = [False] * len(arrival)
    release = [0.0] * servers  # heap: when each slot is next free
    paid_queue: deque[int] = deque()
    free_queue: deque[int] = deque()

    def start_next() -> None:  # the earliest-free slot takes the head of the queue
        j = paid_queue.popleft() if paid_queue else free_queue.popleft()
        wait[j] = release[0] - arrival[j]
        heapq.heapreplace(release, release[0] + service[j])

    for i, t in enumerate(arrival):
        while (paid_queue or free_queue) and release[0] <= t:
            start_next()
        if not paid[i]:
            now[0] = t
            if gate.refuses(coin[i], bucket, len(free_queue), release[0] > t):
                continue
        admitted[i] = True
        if release[0] <= t:  # a slot is idle (the queues are empty here)
            wait[i] = 0.0
            heapq.heapreplace(release, t + service[i])
        else:
            (paid_queue if paid[i] else free_queue).append(i)
    while paid_queue or free_queue:
        start_next()
    return PoolRun(workload, servers, np.array(admitted), np.array(wait))


def simulate_pool_simpy(
    workload: ArrivalTrace, servers: int, gateway: Gateway | None = None
) -> PoolRun:
    """The same pool as a SimPy model: a ``PriorityResource`` of ``servers`` slots."""
    import simpy

    require_servers(servers)
    gate = gateway or Gateway()
    clock, bucket = gate.meter()
    env = simpy.Environment()
    slots = simpy.PriorityResource(env, capacity=servers)
    n = len(workload)
    wait = np.full(n, np.nan)
    admitted = np.zeros(n, dtype=bool)
    free_waiting = [0]

    def request(i: int, paid: bool) -> Any:
        arrived = env.now
        free_waiting[0] += not paid
        with slots.request(priority=0 if paid else 1) as slot:  # lower number first
            yield slot
            free_waiting[0] -= not paid
            wait[i] = env.now - arrived
            yield env.timeout(workload.service_s[i])

    def gateway_process() -> Any:
        for i in range(n):
            yield env.timeout(workload.arrival_s[i] - env.now)
            paid = bool(workload.paid[i])
            if not paid:
                clock[0] = env.now
                busy = slots.count == servers
                if gate.refuses(workload.coin[i], bucket, free_waiting[0], busy):
                    continue
            admitted[i] = True
            env.process(request(i, paid))

    env.process(gateway_process())
    env.run()
    return PoolRun(workload, servers, admitted, wait)


def lindley_waits(interarrival_s: Floats, service_s: Floats) -> Floats:
    """Waits in a single-server FIFO queue, vectorised: ``X - running_min(X)``.

    ``interarrival_s[n]`` is the gap between arrivals ``n-1`` and ``n`` (the
    first is ignored); ``X[0] = 0``, ``X[n] = sum_{k<n} (S[k] - A[k+1])``.
    """
    if len(interarrival_s) != len(service_s):
        raise ValueError("interarrival_s and service_s must have one entry per request")
    steps = np.asarray(service_s[:-1]) - np.asarray(interarrival_s[1:])
    walk = np.concatenate(([0.0], np.cumsum(steps)))
    waits: Floats = walk - np.minimum.accumulate(walk)
    return waits
