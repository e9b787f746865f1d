"""Closed-form waits of the M/M/1 and M/M/c queues, first come first served.

The model: requests arrive as a Poisson process at ``lambda`` per second,
each holds one of ``c`` servers (batch slots) for an exponential time of mean
``S`` seconds (rate ``mu = 1/S``), and wait in one queue when all are busy.

- Utilization ``rho = lambda * S / c``; the queue is stable only if ``rho < 1``.
- Offered load ``a = lambda * S`` (Erlangs). Erlang's C formula gives the
  probability that an arrival waits (all ``c`` busy, by PASTA)::

      C(c, a) = B / (1 - rho * (1 - B)),   B = Erlang B, by the recursion
      B_0 = 1,  B_k = a * B_{k-1} / (k + a * B_{k-1})

  (M/M/1: ``C = rho``.)
- Wait in queue: ``P(W > t) = C * exp(-(c*mu - lambda) * t)``, so
  ``E[W] = C / (c*mu - lambda)`` and the ``q``-quantile is
  ``max(0, ln(C / (1 - q)) / (c*mu - lambda))``; M/M/1: ``E[W] = rho * S / (1 - rho)``.

Sources: L. Kleinrock, *Queueing Systems, Vol. 1: Theory* (Wiley, 1975), ch. 3
(M/M/1 and M/M/m in equilibrium, Erlang's C formula); M. Harchol-Balter,
*Performance Modeling and Design of Computer Systems* (Cambridge, 2013), ch. 14
(M/M/k: P_Q and E[T_Q] = P_Q / (k*mu - lambda)); D. Gross, J. Shortle, J. Thompson
and C. Harris, *Fundamentals of Queueing Theory*, 4th ed. (Wiley, 2008), ch. 2
(M/M/c, including the waiting-time distribution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlib._validate import WrongTypeError, is_int, is_number

__all__ = [
    "QueueStats",
    "UnstableQueueError",
    "require_quantile",
    "require_rate",
    "require_seconds",
    "require_servers",
    "erlang_c",
    "mm1",
    "mmc",
    "tail_quantile_s",
    "utilization",
]


class UnstableQueueError(ValueError):
    """Utilization at or above 1: the queue grows without bound, no steady-state wait exists."""


def require_rate(name: str, value: float) -> float:
    """``value`` as a float rate per second, or a TypeError/ValueError naming ``name``."""
    if not is_number(value):
        raise WrongTypeError(f"{name} must be a number per second, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite rate >= 0 per second, got {value!r}")
    return float(value)


def require_seconds(name: str, value: float) -> float:
    """``value`` as a positive float number of seconds, or an error naming ``name``."""
    if not is_number(value):
        raise WrongTypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def require_servers(value: int) -> int:
    """``value`` if it is a whole number of servers >= 1, else a ValueError."""
    if not is_int(value) or value < 1:
        raise ValueError(f"servers must be a whole number >= 1, got {value!r}")
    return value


def require_quantile(q: float) -> float:
    """``q`` if it is a probability strictly between 0 and 1, else a ValueError."""
    if not is_number(q) or not 0 < q < 1:
        raise ValueError(f"q must be a probability strictly between 0 and 1, got {q!r}")
    return float(q)


def utilization(arrivals_per_s: float, service_s: float, servers: int = 1) -> float:
    """``rho = lambda * S / c``: the fraction of server time busy (may be >= 1)."""
    lam, s = require_rate("arrivals_per_s", arrivals_per_s), require_seconds("service_s", service_s)
    return lam * s / require_servers(servers)


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
    c, a = require_servers(servers), require_rate("offered_load", offered_load)
    _check_stable(a / c, a, 1.0, c)
    return erlang_c_checked(c, a)


def erlang_c_checked(servers: int, offered_load: float) -> float:
    """:func:`erlang_c` for arguments already checked (``servers >= 1``, ``0 <= offered_load
    < servers``): what a solver that calls it thousands of times uses."""
    c, a, b = servers, offered_load, 1.0
    for k in range(1, c + 1):  # Erlang B by recursion: no factorials, no overflow
        b = a * b / (k + a * b)
    return b / (1 - (a / c) * (1 - b))


def tail_quantile_s(p_wait: float, decay_per_s: float, q: float) -> float:
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
        return tail_quantile_s(self.p_wait, self.decay_per_s, require_quantile(q))


def mmc(arrivals_per_s: float, service_s: float, servers: int) -> QueueStats:
    """M/M/c waits; raises :class:`UnstableQueueError` when utilization >= 1."""
    lam = require_rate("arrivals_per_s", arrivals_per_s)
    s, c = require_seconds("service_s", service_s), servers
    rho = utilization(lam, s, c)
    _check_stable(rho, lam, s, c)
    p_wait = erlang_c(c, lam * s)
    decay = c / s - lam
    return QueueStats(lam, s, c, rho, p_wait, p_wait / decay, tail_quantile_s(p_wait, decay, 0.95))


def mm1(arrivals_per_s: float, service_s: float) -> QueueStats:
    """M/M/1 waits: ``P(wait) = rho``, ``E[W] = rho * S / (1 - rho)``."""
    return mmc(arrivals_per_s, service_s, 1)
