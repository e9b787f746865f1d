"""A GPU pool with a gateway, simulated: the check on every closed form of the queueing module.

The pool has ``servers`` batch slots (GPUs x slots per GPU); a request holds
one slot for its whole service time, which here does not depend on how full
the batch is. Requests come in two classes: paid ones are served before free
ones, without evicting a running request (non-preemptive priority), first
come first served within a class. The gateway may refuse a free arrival
(HTTP 429) before it reaches the pool: at random (a share ``shed_free``), when
a token bucket for the free tier is empty, or when it would have to wait
behind ``free_queue_limit`` other free requests.

Two simulators of that model, fed the same :class:`ArrivalTrace` (arrival times,
classes, service times and one random coin per request), give the same
waits, up to floating-point rounding:

- :func:`simulate_pool_simpy`: the discrete-event model written with SimPy's
  ``PriorityResource`` (the field's standard tool, and the reference);
- :func:`simulate_pool`: the same events with a heap of slot release times and
  two FIFO queues, fast enough for a million arrivals in seconds.

:func:`lindley_waits` is the single-server first-come-first-served case in
closed recursion (Lindley, 1952): ``W[n+1] = max(0, W[n] + S[n] - A[n+1])``,
which unrolls to the random walk ``X`` minus its running minimum, computed
by numpy without a Python loop.

:func:`batch_means`, :class:`Estimate` and :func:`t_quantile`, which turn a long,
autocorrelated run into a confidence interval, live in
:mod:`kvlib.serving.confidence` and are re-exported here.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvlib.serving.bucket import TokenBucket
from kvlib.serving.confidence import Estimate, batch_means, t_quantile

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

    Each request is paid with probability ``paid / (paid + free)``, which splits
    the stream into two independent Poisson streams. Seeded: the same
    arguments give the same workload.
    """
    total = paid_per_s + free_per_s
    if not (paid_per_s >= 0 and free_per_s >= 0 and total > 0 and math.isfinite(total)):
        raise ValueError(
            f"paid_per_s and free_per_s must be >= 0 with a positive sum, got "
            f"{paid_per_s!r} and {free_per_s!r}"
        )
    if not (service_s > 0 and math.isfinite(service_s)):
        raise ValueError(f"service_s must be a positive number of seconds, got {service_s!r}")
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
    if servers < 1:
        raise ValueError(f"servers must be at least 1, got {servers!r}")
    gate = gateway or Gateway()
    now, bucket = gate.meter()
    limit = math.inf if gate.free_queue_limit is None else gate.free_queue_limit
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
            if coin[i] < gate.shed_free:
                continue
            if bucket is not None and not bucket.try_acquire().admitted:
                continue
            if len(free_queue) >= limit and release[0] > t:  # it would wait behind `limit`
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

    if servers < 1:
        raise ValueError(f"servers must be at least 1, got {servers!r}")
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
                if workload.coin[i] < gate.shed_free:
                    continue
                if bucket is not None and not bucket.try_acquire().admitted:
                    continue
                limit = gate.free_queue_limit
                if limit is not None and free_waiting[0] >= limit and slots.count == servers:
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
