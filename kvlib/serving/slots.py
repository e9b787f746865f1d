"""From seats to slots: the queue in front of one engine, with a decode step that slows as
the batch fills.

The pool's servers are ``c = min(max_num_seqs, seats)`` (chapter 1's seats, vLLM's
``max_num_seqs``). A request holds its slot while it generates its output; each
step reads the weights once and every running sequence's cache (chapter 4's
bandwidth bound), so with ``n`` sequences running a request's mean service is
``S(n) = tokens x step(n)``.

The queue is then a birth-death chain with a load-dependent service rate
(Kleinrock, *Queueing Systems* Vol. 1, 1975, §3.1, the general birth-death
equilibrium ``p_n = p_0 prod lambda / mu_k``; Harchol-Balter 2013, ch. 14 for M/M/k),
taking output lengths as exponential so the chain is Markov:

- ``mu_n = n / S(n)`` for ``n <= c`` (each of ``n`` running requests finishes at
  rate ``1 / S(n)``), ``mu_n = c / S(c)`` for ``n > c``;
- an arrival waits when all ``c`` slots are busy (Poisson arrivals see time
  averages), ``P(wait) = p_c / (1 - lambda S(c) / c)``;
- while all are busy, departures come at ``r = c / S(c)`` and the line is first
  come first served, so ``P(W > t) = P(wait) exp(-(r - lambda) t)``, as in M/M/c
  with ``S(c)`` in place of ``S``.

With ``S(n) = S`` for every ``n`` this is exactly M/M/c
(:func:`kvlib.serving.erlang.mmc`). For service times that are not exponential,
:func:`allen_cunneen_wait_s` scales the M/M/c mean wait by ``(C_a^2 + C_s^2) / 2``
(Allen, *Probability, Statistics, and Queueing Theory*, 2nd ed., 1990, §6.4; Whitt,
"Approximations for the GI/G/m queue", 1993), checked against the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvlib._validate import is_int, is_number
from kvlib.serving.erlang import (
    QueueStats,
    UnstableQueueError,
    require_quantile,
    require_rate,
    require_seconds,
    tail_quantile_s,
)

__all__ = [
    "LoadDependentStats",
    "allen_cunneen_wait_s",
    "in_flight",
    "load_dependent_mmc",
    "max_arrivals_for_wait",
    "pool_slots",
    "service_s",
]


def pool_slots(max_num_seqs: int, seats: int) -> int:
    """``c = min(max_num_seqs, seats)``: the requests that can decode at once."""
    for name, value in (("max_num_seqs", max_num_seqs), ("seats", seats)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    return min(max_num_seqs, seats)


def service_s(output_tokens: float, tokens_per_s: float) -> float:
    """``S = output tokens / per-sequence decode rate``: how long a request holds its slot."""
    tokens = require_seconds("output_tokens", output_tokens)  # a positive number
    return tokens / require_seconds("tokens_per_s", tokens_per_s)


def in_flight(arrivals_per_s: float, time_in_system_s: float) -> float:
    """Little's law, ``L = lambda x W``: requests in flight on average (J. D. C. Little,
    "A proof for the queuing formula L = lambda W", *Operations Research* 9(3), 1961)."""
    return require_rate("arrivals_per_s", arrivals_per_s) * require_seconds(
        "time_in_system_s", time_in_system_s
    )


@dataclass(frozen=True)
class LoadDependentStats(QueueStats):
    """Steady-state waits in queue when the service time depends on the batch:
    ``service_s`` is ``S(c)``, a request's mean service when every slot is busy, and
    ``utilization`` is ``lambda S(c) / c``, the load against the full pool's rate."""

    mean_running: float  # requests decoding at once, on average (the mean batch)


def _require_services(service_s_by_batch: Sequence[float]) -> list[float]:
    if len(service_s_by_batch) < 1:
        raise ValueError("service_s_by_batch must give S(n) for n = 1 .. c: got an empty list")
    return [
        require_seconds(f"service_s_by_batch[{i}]", s) for i, s in enumerate(service_s_by_batch)
    ]


def load_dependent_mmc(
    arrivals_per_s: float, service_s_by_batch: Sequence[float]
) -> LoadDependentStats:
    """Waits of ``c = len(service_s_by_batch)`` slots whose mean service with ``n`` running
    is ``service_s_by_batch[n - 1]``; raises :class:`UnstableQueueError` when
    ``lambda >= c / S(c)``.
    """
    lam = require_rate("arrivals_per_s", arrivals_per_s)
    services = _require_services(service_s_by_batch)
    c, full = len(services), services[-1]
    rho = lam * full / c
    if rho >= 1:
        raise UnstableQueueError(
            f"arrivals {lam:g}/s x S(c) = {full:g} s / {c} slots = {rho:.3f} >= 1: with every "
            f"slot busy the pool finishes {c / full:g} requests/s, fewer than arrive. The "
            "queue grows without bound; add slots, shorten outputs or shed load."
        )
    # log p_n - log p_0 = sum_k log(lambda / mu_k), mu_k = k / S(k): logs avoid overflow.
    logs = [0.0]
    for k in range(1, c + 1):
        logs.append(logs[-1] + math.log(lam * services[k - 1] / k) if lam > 0 else -math.inf)
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    tail = weights[c] / (1 - rho)  # p_c + p_c rho + p_c rho^2 + ...
    total = sum(weights[:c]) + tail
    p_wait = tail / total
    running = (sum(n * w for n, w in enumerate(weights[:c])) + c * tail) / total
    decay = c / full - lam
    return LoadDependentStats(
        lam, full, c, rho, p_wait, p_wait / decay, tail_quantile_s(p_wait, decay, 0.95), running
    )


def max_arrivals_for_wait(
    service_s_by_batch: Sequence[float], target_wait_s: float, q: float = 0.95
) -> float:
    """The largest arrival rate whose ``q``-quantile wait is at most ``target_wait_s``.

    The wait rises with the arrival rate, so a bisection between 0 and the
    pool's saturation rate ``c / S(c)`` finds it.
    """
    services = _require_services(service_s_by_batch)
    goal, q = require_seconds("target_wait_s", target_wait_s), require_quantile(q)
    lo, hi = 0.0, len(services) / services[-1]
    for _ in range(100):
        mid = (lo + hi) / 2
        if load_dependent_mmc(mid, services).wait_percentile_s(q) <= goal:
            lo = mid
        else:
            hi = mid
    return lo


def allen_cunneen_wait_s(
    mmc_mean_wait_s: float, service_cv2: float, arrival_cv2: float = 1.0
) -> float:
    """M/G/c (or G/G/c) mean wait: ``W_MMc x (C_a^2 + C_s^2) / 2``.

    ``C_s^2`` is the squared coefficient of variation of the service time
    (variance / mean^2: 1 for exponential, 0 for fixed output lengths);
    ``C_a^2 = 1`` for Poisson arrivals. An approximation, exact for M/M/c and
    for M/G/1 (Pollaczek-Khinchine).
    """
    wait = float(mmc_mean_wait_s)
    if not math.isfinite(wait) or wait < 0:
        raise ValueError(f"mmc_mean_wait_s must be a finite number of seconds >= 0, got {wait!r}")
    for name, value in (("service_cv2", service_cv2), ("arrival_cv2", arrival_cv2)):
        if not is_number(value) or not value >= 0:
            raise ValueError(f"{name} must be a squared coefficient of variation >= 0")
    return wait * (arrival_cv2 + service_cv2) / 2
