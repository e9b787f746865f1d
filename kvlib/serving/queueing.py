"""Queueing formulas for a pool of batch slots, in one import: M/M/1 and M/M/c, first come
first served (:mod:`kvlib.serving.erlang`, re-exported), and two priority classes in one
M/M/c pool, shedding at the gateway, and the inverse problem.

Paid requests are served before free ones, non-preemptively (a running request
is never evicted: that would throw away its KV cache), first come first served
within a class, with the same service time. Every arrival still finds all
servers busy with probability ``C(c, a)`` of the *total* load
(:func:`kvlib.serving.erlang.erlang_c`), and with ``mu = 1/S``::

    E[W_paid] = C / (c*mu - lambda_paid)
    E[W_free] = C / (c*mu * (1 - rho_paid) * (1 - rho))
    P(W_paid > t) = C * exp(-(c*mu - lambda_paid) * t)

(A. Cobham, "Priority assignment in waiting line problems", *Journal of the
Operations Research Society of America* 2(1), 1954, for the means; R. H. Davis,
"Waiting-time distribution of a multi-server, priority queuing system",
*Operations Research* 14(1), 1966, for the distribution. The paid tail follows
because, while all servers are busy, the paid queue is an M/M/1 queue with
arrival rate ``lambda_paid`` and service rate ``c*mu``, so the paid requests
ahead of an arrival are geometric with ratio ``lambda_paid / (c*mu)``.)

Refusing a share ``f`` of free arrivals at random thins a Poisson stream into a
Poisson stream, so the pool then sees free arrivals at ``(1 - f) * lambda_free``
and the formulas above still hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kvlib._validate import is_number
from kvlib.serving.erlang import (
    QueueStats,
    UnstableQueueError,
    erlang_c,
    erlang_c_checked,
    mm1,
    mmc,
    require_quantile,
    require_rate,
    require_seconds,
    require_servers,
    tail_quantile_s,
    utilization,
)

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
        return _paid_wait_s(self.p_wait, self.paid_per_s, self.service_s, self.servers,
                            require_quantile(q))


def _paid_wait_s(p_wait: float, paid_per_s: float, service_s: float, servers: int,
                 q: float | None) -> float:
    """A paid request's wait from Erlang C's ``p_wait``: its mean (``q=None``),
    ``p_wait / (c/S - lambda_paid)``, or its ``q``-quantile, the tail falling off at that
    same rate (:func:`tail_quantile_s`)."""
    decay = servers / service_s - paid_per_s
    return p_wait / decay if q is None else tail_quantile_s(p_wait, decay, q)


def priority_mmc(
    paid_per_s: float, free_per_s: float, service_s: float, servers: int
) -> PriorityStats:
    """Two classes, paid before free (non-preemptive), in one M/M/c pool."""
    lp, lf = require_rate("paid_per_s", paid_per_s), require_rate("free_per_s", free_per_s)
    s, c = require_seconds("service_s", service_s), require_servers(servers)
    rho, rho_paid = (lp + lf) * s / c, lp * s / c
    if rho >= 1:
        raise UnstableQueueError(
            f"utilization = (paid {lp:g} + free {lf:g}/s) x {s:g} s / {c} = {rho:.3f} >= 1: the "
            f"free queue grows without bound (paid alone would use {rho_paid:.3f}). Shed free "
            "requests at the gateway or add servers until utilization < 1."
        )
    p_wait = erlang_c(c, (lp + lf) * s)
    return PriorityStats(
        lp, lf, s, c, rho, p_wait,
        paid_mean_wait_s=_paid_wait_s(p_wait, lp, s, c, None),
        paid_p95_wait_s=_paid_wait_s(p_wait, lp, s, c, 0.95),
        free_mean_wait_s=p_wait / (c / s * (1 - rho_paid) * (1 - rho)),
    )


def shed_fraction_for_utilization(
    paid_per_s: float, free_per_s: float, service_s: float, servers: int, target: float
) -> float:
    """Share of free arrivals to refuse so that utilization <= ``target`` (0 if none).

    ``(lambda_paid + (1 - f) * lambda_free) * S / c <= target`` gives
    ``f = 1 - (target * c / S - lambda_paid) / lambda_free``.
    """
    lp, lf = require_rate("paid_per_s", paid_per_s), require_rate("free_per_s", free_per_s)
    s, c = require_seconds("service_s", service_s), require_servers(servers)
    if not is_number(target) or not 0 < target < 1:
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
    """Paid p95 wait when the gateway refuses ``shed_fraction`` of free arrivals at random."""
    if isinstance(shed_fraction, bool) or not 0 <= shed_fraction <= 1:
        raise ValueError(f"shed_fraction must be between 0 and 1, got {shed_fraction!r}")
    free = (1 - shed_fraction) * require_rate("free_per_s", free_per_s)
    return priority_mmc(paid_per_s, free, service_s, servers).paid_p95_wait_s


def _paid_wait_or_inf(lp: float, lf: float, s: float, c: int, q: float | None) -> float:
    """The paid class's ``q``-quantile wait (``q=None``: its mean); inf if unstable.

    :func:`priority_mmc`'s paid wait on arguments its callers checked once: the solvers
    below call it hundreds of thousands of times."""
    load = (lp + lf) * s
    if load / c >= 1:
        return math.inf
    return _paid_wait_s(erlang_c_checked(c, load), lp, s, c, q)


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
    lp, lf = require_rate("paid_per_s", paid_per_s), require_rate("free_per_s", free_per_s)
    s, c = require_seconds("service_s", service_s), require_servers(servers)
    goal = float(paid_p95_s)
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

    The waits are the paid class's ``q``-quantile (``q=None``: the mean) on
    ``servers_before`` and on ``servers_after`` servers: two observations that pin
    down two unknowns. For each paid rate, bisection finds the free rate giving the
    first wait, then the paid rate giving the second. No mix may give both (a
    pool so large that losing servers barely moves the wait): ValueError.
    """
    c0, c1 = require_servers(servers_before), require_servers(servers_after)
    s = require_seconds("service_s", service_s)
    before = require_seconds("paid_wait_before_s", paid_wait_before_s)
    after = require_seconds("paid_wait_after_s", paid_wait_after_s)
    if q is not None:
        q = require_quantile(q)
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
