"""Closed-form waits of M/M/1 and M/M/c queues, with two priority classes and shedding.

The model: requests arrive as a Poisson process at ``lambda`` per second,
each holds one of ``c`` servers (batch slots) for an exponential time of mean
``S`` seconds (rate ``mu = 1/S``), and wait in one queue when all are busy.

- Utilization ``rho = lambda * S / c``; the queue is stable only if ``rho < 1``.
- Offered load ``a = lambda * S`` (Erlangs). Erlang's C formula gives the
  probability that an arrival waits (all ``c`` busy, by PASTA)::

      C(c, a) = B / (1 - rho * (1 - B)),   B = Erlang B, by the recursion
      B_0 = 1,  B_k = a * B_{k-1} / (k + a * B_{k-1})

  (M/M/1: ``C = rho``.)
- Wait in queue, first come first served: ``P(W > t) = C * exp(-(c*mu - lambda) * t)``,
  so ``E[W] = C / (c*mu - lambda)`` and the ``q``-quantile is
  ``max(0, ln(C / (1 - q)) / (c*mu - lambda))``; M/M/1: ``E[W] = rho * S / (1 - rho)``.

  Sources: L. Kleinrock, *Queueing Systems, Vol. 1: Theory* (Wiley, 1975),
  ch. 3 (M/M/1 and M/M/m in equilibrium, Erlang's C formula); M. Harchol-Balter,
  *Performance Modeling and Design of Computer Systems* (Cambridge, 2013),
  ch. 14 (M/M/k: P_Q and E[T_Q] = P_Q / (k*mu - lambda)); D. Gross, J. Shortle,
  J. Thompson and C. Harris, *Fundamentals of Queueing Theory*, 4th ed.
  (Wiley, 2008), ch. 2 (M/M/c, including the waiting-time distribution).

- Two classes, paid served before free, non-preemptive (a running request is
  never evicted), first come first served within a class, same service time:
  every arrival still finds all servers busy with probability ``C(c, a)`` of
  the *total* load, and

      E[W_paid] = C / (c*mu - lambda_paid)
      E[W_free] = C / (c*mu * (1 - rho_paid) * (1 - rho))
      P(W_paid > t) = C * exp(-(c*mu - lambda_paid) * t)

  (A. Cobham, "Priority assignment in waiting line problems", *Journal of the
  Operations Research Society of America* 2(1), 1954, for the means; R. H. Davis, "Waiting-time
  distribution of a multi-server, priority queuing system", *Operations
  Research* 14(1), 1966, for the distribution. The paid tail follows because,
  while all servers are busy, the paid queue is an M/M/1 queue with arrival
  rate ``lambda_paid`` and service rate ``c*mu``, so the paid requests ahead
  of an arrival are geometric with ratio ``lambda_paid / (c*mu)``.)

Every formula here is checked against the simulator of
:mod:`kvlib.serving.simulate` within a batch-means confidence interval.
This module uses the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "PriorityStats",
    "QueueStats",
    "UnstableQueueError",
    "erlang_c",
    "mm1",
    "mmc",
    "paid_p95_after_shedding",
    "priority_mmc",
    "rates_for_paid_waits",
    "shed_fraction_for_paid_wait",
    "shed_fraction_for_utilization",
    "utilization",
]


class UnstableQueueError(ValueError):
    """Utilization at or above 1: the queue grows without bound, no steady-state wait exists."""


def _rate(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number per second, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite rate >= 0 per second, got {value!r}")
    return float(value)


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def _servers(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"servers must be a whole number >= 1, got {value!r}")
    return value


def _quantile(q: float) -> float:
    if isinstance(q, bool) or not isinstance(q, int | float) or not 0 < q < 1:
        raise ValueError(f"q must be a probability strictly between 0 and 1, got {q!r}")
    return float(q)


def utilization(arrivals_per_s: float, service_s: float, servers: int = 1) -> float:
    """``rho = lambda * S / c``: the fraction of server time busy (may be >= 1)."""
    lam, s = _rate("arrivals_per_s", arrivals_per_s), _seconds("service_s", service_s)
    return lam * s / _servers(servers)


def _check_stable(rho: float, arrivals_per_s: float, service_s: float, servers: int) -> None:
    if rho >= 1:
        raise UnstableQueueError(
            f"utilization = arrivals x service / servers = {arrivals_per_s:g} x {service_s:g} s "
            f"/ {servers} = {rho:.3f} >= 1: requests arrive faster than the servers finish them, "
            "the queue grows without bound and no steady-state wait exists. Add servers, "
            "shorten the service or shed load until utilization < 1."
        )


def erlang_c(servers: int, offered_load: float) -> float:
    """Erlang's C: probability that an arrival waits in M/M/c at ``offered_load = lambda*S``."""
    c, a = _servers(servers), _rate("offered_load", offered_load)
    _check_stable(a / c, a, 1.0, c)
    b = 1.0
    for k in range(1, c + 1):  # Erlang B by recursion: no factorials, no overflow
        b = a * b / (k + a * b)
    return b / (1 - (a / c) * (1 - b))


def _tail_quantile(p_wait: float, decay_per_s: float, q: float) -> float:
    """Smallest t with ``p_wait * exp(-decay * t) <= 1 - q`` (0 if few arrivals wait)."""
    if p_wait <= 1 - q:
        return 0.0
    return math.log(p_wait / (1 - q)) / decay_per_s


@dataclass(frozen=True)
class QueueStats:
    """Steady-state waits in queue of an M/M/c queue (first come, first served)."""

    arrivals_per_s: float
    service_s: float
    servers: int
    utilization: float
    p_wait: float
    mean_wait_s: float
    p95_wait_s: float

    @property
    def decay_per_s(self) -> float:
        """``c*mu - lambda``: the rate at which the wait's tail falls off."""
        return self.servers / self.service_s - self.arrivals_per_s

    def wait_exceeds(self, t_s: float) -> float:
        """``P(W > t) = C * exp(-(c*mu - lambda) * t)``."""
        return self.p_wait * math.exp(-self.decay_per_s * t_s) if t_s >= 0 else 1.0

    def wait_percentile_s(self, q: float) -> float:
        """The ``q``-quantile of the wait in queue, e.g. ``q=0.99`` for p99."""
        return _tail_quantile(self.p_wait, self.decay_per_s, _quantile(q))


def mmc(arrivals_per_s: float, service_s: float, servers: int) -> QueueStats:
    """M/M/c waits; raises :class:`UnstableQueueError` when utilization >= 1."""
    lam, s, c = _rate("arrivals_per_s", arrivals_per_s), _seconds("service_s", service_s), servers
    rho = utilization(lam, s, c)
    _check_stable(rho, lam, s, c)
    p_wait = erlang_c(c, lam * s)
    decay = c / s - lam
    return QueueStats(lam, s, c, rho, p_wait, p_wait / decay, _tail_quantile(p_wait, decay, 0.95))


def mm1(arrivals_per_s: float, service_s: float) -> QueueStats:
    """M/M/1 waits: ``P(wait) = rho``, ``E[W] = rho * S / (1 - rho)``."""
    return mmc(arrivals_per_s, service_s, 1)


@dataclass(frozen=True)
class PriorityStats:
    """Waits of paid (served first) and free requests sharing one M/M/c pool."""

    paid_per_s: float
    free_per_s: float
    service_s: float
    servers: int
    utilization: float
    p_wait: float  # an arrival of either class finds every server busy
    paid_mean_wait_s: float
    paid_p95_wait_s: float
    free_mean_wait_s: float

    def paid_wait_percentile_s(self, q: float) -> float:
        """The ``q``-quantile of a paid request's wait."""
        decay = self.servers / self.service_s - self.paid_per_s
        return _tail_quantile(self.p_wait, decay, _quantile(q))


def priority_mmc(
    paid_per_s: float, free_per_s: float, service_s: float, servers: int
) -> PriorityStats:
    """Two classes, paid before free (non-preemptive), in one M/M/c pool."""
    lp, lf = _rate("paid_per_s", paid_per_s), _rate("free_per_s", free_per_s)
    s, c = _seconds("service_s", service_s), _servers(servers)
    rho, rho_paid = (lp + lf) * s / c, lp * s / c
    if rho >= 1:
        raise UnstableQueueError(
            f"utilization = (paid {lp:g} + free {lf:g}/s) x {s:g} s / {c} = {rho:.3f} >= 1: the "
            f"free queue grows without bound (paid alone would use {rho_paid:.3f}). Shed free "
            "requests at the gateway or add servers until utilization < 1."
        )
    p_wait = erlang_c(c, (lp + lf) * s)
    rate = c / s
    paid_decay = rate - lp
    return PriorityStats(
        lp, lf, s, c, rho, p_wait,
        paid_mean_wait_s=p_wait / paid_decay,
        paid_p95_wait_s=_tail_quantile(p_wait, paid_decay, 0.95),
        free_mean_wait_s=p_wait / (rate * (1 - rho_paid) * (1 - rho)),
    )  # fmt: skip


def shed_fraction_for_utilization(
    paid_per_s: float, free_per_s: float, service_s: float, servers: int, target: float
) -> float:
    """Share of free arrivals to refuse so that utilization <= ``target`` (0 if none).

    ``(lambda_paid + (1 - f) * lambda_free) * S / c <= target`` gives
    ``f = 1 - (target * c / S - lambda_paid) / lambda_free``.
    """
    lp, lf = _rate("paid_per_s", paid_per_s), _rate("free_per_s", free_per_s)
    s, c = _seconds("service_s", service_s), _servers(servers)
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target < 1:
        raise ValueError(f"target utilization must be strictly between 0 and 1, got {target!r}")
    room_per_s = target * c / s - lp  # free arrivals per second the target leaves room for
    if room_per_s < 0:
        raise ValueError(
            f"paid traffic alone uses {lp * s / c:.3f} of the pool, above the target {target:g}: "
            "shedding the free tier cannot meet it. Add servers or raise the target."
        )
    if lf == 0 or room_per_s >= lf:
        return 0.0
    return 1 - room_per_s / lf


def paid_p95_after_shedding(
    paid_per_s: float, free_per_s: float, service_s: float, servers: int, shed_fraction: float
) -> float:
    """Paid p95 wait when the gateway refuses ``shed_fraction`` of free arrivals at random.

    Random refusals thin a Poisson stream into a Poisson stream, so the pool
    sees free arrivals at ``(1 - f) * lambda_free`` and :func:`priority_mmc` applies.
    """
    if isinstance(shed_fraction, bool) or not 0 <= shed_fraction <= 1:
        raise ValueError(f"shed_fraction must be between 0 and 1, got {shed_fraction!r}")
    free = (1 - shed_fraction) * _rate("free_per_s", free_per_s)
    return priority_mmc(paid_per_s, free, service_s, servers).paid_p95_wait_s


def _paid_wait_or_inf(lp: float, lf: float, s: float, c: int, q: float | None) -> float:
    """The paid class's ``q``-quantile wait (``q=None``: its mean); inf if unstable."""
    if (lp + lf) * s >= c:
        return math.inf
    stats = priority_mmc(lp, lf, s, c)
    return stats.paid_mean_wait_s if q is None else stats.paid_wait_percentile_s(q)


def _bisect(f: Callable[[float], float], lo: float, hi: float, steps: int = 100) -> float:
    """A root of ``f`` between ``lo`` and ``hi``, where ``f`` changes sign."""
    rising = f(hi) > 0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if (f(mid) > 0) == rising:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2


def shed_fraction_for_paid_wait(
    paid_per_s: float, free_per_s: float, service_s: float, servers: int, paid_p95_s: float
) -> float:
    """Smallest share of free arrivals to refuse so the paid p95 wait is <= ``paid_p95_s``."""
    lp, lf = _rate("paid_per_s", paid_per_s), _rate("free_per_s", free_per_s)
    s, c, goal = _seconds("service_s", service_s), _servers(servers), float(paid_p95_s)
    if _paid_wait_or_inf(lp, lf, s, c, 0.95) <= goal:
        return 0.0
    if _paid_wait_or_inf(lp, 0.0, s, c, 0.95) > goal:
        raise ValueError(
            f"even with every free request shed, the paid p95 wait exceeds {goal:g} s: "
            "shedding cannot meet this target. Add servers or limit the paid tier."
        )
    return _bisect(lambda f: goal - _paid_wait_or_inf(lp, (1 - f) * lf, s, c, 0.95), 0.0, 1.0)


def rates_for_paid_waits(
    servers_before: int,
    servers_after: int,
    service_s: float,
    paid_wait_before_s: float,
    paid_wait_after_s: float,
    q: float | None = 0.95,
) -> tuple[float, float]:
    """Paid and free arrival rates that give these paid waits before and after a loss.

    The waits are the paid class's ``q``-quantile (default the p95; ``q=None``
    for the mean) on ``servers_before`` and on ``servers_after`` servers: two
    observations that pin down two unknowns. For each paid rate the free rate
    that gives the first wait is found by bisection, then the paid rate that
    gives the second. Raises ``ValueError`` when no mix of traffic gives both
    (for instance a pool so large that losing servers barely moves the wait).
    """
    c0, c1 = _servers(servers_before), _servers(servers_after)
    s = _seconds("service_s", service_s)
    before = _seconds("paid_wait_before_s", paid_wait_before_s)
    after = _seconds("paid_wait_after_s", paid_wait_after_s)
    if q is not None:
        q = _quantile(q)
    if not c1 < c0 or not after > before:
        raise ValueError(
            "servers_after must be fewer than servers_before, and paid_wait_after_s longer "
            "than paid_wait_before_s"
        )

    def wait(lp: float, lf: float, c: int) -> float:
        return _paid_wait_or_inf(lp, lf, s, c, q)

    def free_for(lp: float) -> float | None:
        if wait(lp, 0.0, c0) > before:
            return None
        lf = _bisect(lambda lf: wait(lp, lf, c0) - before, 0.0, c0 / s - lp)
        # The paid wait stays finite as the pool saturates; a "root" at the edge of
        # stability, where it jumps to inf, is not a solution.
        return lf if math.isclose(wait(lp, lf, c0), before, rel_tol=1e-6) else None

    def miss(lp: float) -> float:
        lf = free_for(lp)
        return math.inf if lf is None else wait(lp, lf, c1) - after

    grid = [c1 / s * i / 200 for i in range(1, 200)]
    misses = [miss(lp) for lp in grid]
    for i in range(len(grid) - 1):
        if (misses[i] > 0) != (misses[i + 1] > 0):
            lp = _bisect(miss, grid[i], grid[i + 1])
            lf = free_for(lp)
            if lf is not None and math.isclose(wait(lp, lf, c1), after, rel_tol=1e-6):
                return lp, lf
    which = "mean" if q is None else f"p{q * 100:g}"
    raise ValueError(
        f"no mix of paid and free traffic gives a paid {which} wait of {before:g} s on {c0} "
        f"servers and {after:g} s on {c1} (service {s:g} s): try fewer servers or a "
        "longer service time."
    )
