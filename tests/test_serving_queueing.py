"""Closed forms of M/M/1, M/M/c and two priority classes, against independent formulas.

The simulator checks (formula inside a confidence interval) are in
``tests/test_serving_simulate.py``; here every formula is compared with a
second, independent statement of the same textbook result, computed exactly
where possible, and bad input is refused with the argument named.
"""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.serving.queueing import (
    UnstableQueueError,
    erlang_c,
    mm1,
    mmc,
    paid_p95_after_shedding,
    priority_mmc,
    rates_for_paid_waits,
    shed_fraction_for_paid_wait,
    shed_fraction_for_utilization,
    utilization,
)


def erlang_c_by_definition(c: int, a: Fraction) -> Fraction:
    """Kleinrock (1975) eq. for M/M/m: the stationary probability that all m are busy,
    from p_k = p_0 a^k / k! (k < m) and the geometric tail, in exact rationals."""
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) * c / (c - a)
    return tail / (head + tail)


@settings(max_examples=150, deadline=None)
@given(c=st.integers(1, 40), numerator=st.integers(1, 999))
def test_erlang_c_recursion_equals_the_definition(c: int, numerator: int) -> None:
    a = Fraction(numerator, 1000) * c  # utilization numerator/1000 < 1
    assert erlang_c(c, float(a)) == pytest.approx(float(erlang_c_by_definition(c, a)), rel=1e-9)


def test_erlang_c_on_a_large_pool_does_not_overflow() -> None:
    """Factorials of 2,000 overflow floats; the Erlang B recursion does not."""
    assert 0 < erlang_c(2_000, 1_990.0) < 1
    assert erlang_c(2_000, 1_000.0) < 1e-100


@settings(max_examples=100, deadline=None)
@given(rho=st.floats(0.01, 0.99), service_s=st.floats(0.01, 100))
def test_mm1_is_the_textbook_single_server(rho: float, service_s: float) -> None:
    stats = mm1(rho / service_s, service_s)
    assert stats.utilization == pytest.approx(rho)
    assert stats.p_wait == pytest.approx(rho)  # M/M/1: an arrival waits iff the server is busy
    assert stats.mean_wait_s == pytest.approx(rho * service_s / (1 - rho))
    # P(W > t) = rho * exp(-(1 - rho) t / S): the 95th percentile is S/(1-rho) ln(20 rho).
    p95 = max(0.0, service_s / (1 - rho) * math.log(20 * rho))
    assert stats.p95_wait_s == pytest.approx(p95, rel=1e-9, abs=1e-12)


def test_mm2_probability_of_waiting_closed_form() -> None:
    """M/M/2 has P_Q = 2 rho^2 / (1 + rho) (Harchol-Balter 2013, ch. 14 exercises)."""
    for rho in (0.1, 0.5, 0.8, 0.95):
        assert mmc(2 * rho, 1.0, 2).p_wait == pytest.approx(2 * rho**2 / (1 + rho))


def test_percentiles_invert_the_tail() -> None:
    stats = mmc(8.5, 1.0, 10)
    for q in (0.5, 0.9, 0.95, 0.99, 0.999):
        t = stats.wait_percentile_s(q)
        assert stats.wait_exceeds(t) == pytest.approx(1 - q) if t > 0 else stats.p_wait <= 1 - q
    assert stats.wait_percentile_s(0.95) == stats.p95_wait_s
    assert stats.wait_exceeds(0) == stats.p_wait


def test_the_tail_is_longer_than_the_mean_by_a_factor_that_grows_as_load_falls() -> None:
    """p95 / mean = ln(20 C) / C for M/M/c: worth stating because mean and p95 get confused."""
    for rho in (0.8, 0.9, 0.95):
        stats = mmc(rho * 10, 1.0, 10)
        assert stats.p_wait > 0.05  # else the p95 is 0 and the ratio is 0
        ratio = stats.p95_wait_s / stats.mean_wait_s
        assert ratio == pytest.approx(math.log(20 * stats.p_wait) / stats.p_wait)


@pytest.mark.parametrize(
    ("arrivals", "service", "servers"), [(1.0, 1.0, 1), (10.0, 1.0, 10), (6.0, 2.0, 10)]
)
def test_utilization_at_or_above_one_is_refused(
    arrivals: float, service: float, servers: int
) -> None:
    with pytest.raises(UnstableQueueError, match=r"utilization = .* >= 1.*Add servers"):
        mmc(arrivals, service, servers)
    assert utilization(arrivals, service, servers) >= 1  # still reported, never a wait


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: mmc(-1.0, 1.0, 2), "arrivals_per_s must be a finite rate >= 0"),
        (lambda: mmc(1.0, 0.0, 2), "service_s must be a positive number of seconds"),
        (lambda: mmc(1.0, math.nan, 2), "service_s must be a positive number of seconds"),
        (lambda: mmc(1.0, 1.0, 0), "servers must be a whole number >= 1"),
        (lambda: mmc(1.0, 1.0, 2.5), "servers must be a whole number >= 1"),  # type: ignore[arg-type]
        (lambda: mmc(0.5, 1.0, 2).wait_percentile_s(95), "q must be a probability"),
    ],
)
def test_bad_input_names_the_argument(call: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        call()  # type: ignore[operator]


# --- two classes ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(c=st.integers(1, 30), rho=st.floats(0.05, 0.97), paid_share=st.floats(0.0, 1.0))
def test_priority_conserves_the_fcfs_mean_wait(c: int, rho: float, paid_share: float) -> None:
    """Kleinrock's conservation law: with equal service times, reordering the queue
    cannot change the load-weighted mean wait, so it equals the FCFS mean."""
    lam = rho * c / 2.0
    stats = priority_mmc(paid_share * lam, (1 - paid_share) * lam, 2.0, c)
    mixed = paid_share * stats.paid_mean_wait_s + (1 - paid_share) * stats.free_mean_wait_s
    assert mixed == pytest.approx(mmc(lam, 2.0, c).mean_wait_s, rel=1e-9)
    fcfs = mmc(lam, 2.0, c).mean_wait_s * (1 + 1e-12)  # up to rounding
    assert stats.paid_mean_wait_s <= fcfs and fcfs * (1 - 2e-12) <= stats.free_mean_wait_s


def test_paid_only_traffic_is_plain_mmc() -> None:
    stats = priority_mmc(7.0, 0.0, 1.0, 10)
    plain = mmc(7.0, 1.0, 10)
    assert stats.paid_mean_wait_s == pytest.approx(plain.mean_wait_s)
    assert stats.paid_p95_wait_s == pytest.approx(plain.p95_wait_s)


def test_priority_refuses_a_jammed_pool_and_says_what_paid_alone_uses() -> None:
    with pytest.raises(UnstableQueueError, match=r"free queue grows.*paid alone would use 0.400"):
        priority_mmc(2.0, 4.0, 2.0, 10)


# --- shedding ------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(paid=st.floats(0.1, 3.0), free=st.floats(0.1, 10.0), target=st.floats(0.5, 0.95))
def test_shedding_lands_exactly_on_the_target_utilization(
    paid: float, free: float, target: float
) -> None:
    servers, service_s = 10, 2.0
    if paid * service_s / servers >= target:
        with pytest.raises(ValueError, match="shedding the free tier cannot meet it"):
            shed_fraction_for_utilization(paid, free, service_s, servers, target)
        return
    shed = shed_fraction_for_utilization(paid, free, service_s, servers, target)
    after = utilization(paid + (1 - shed) * free, service_s, servers)
    if shed == 0:
        assert after <= target
    else:
        assert 0 < shed < 1 and after == pytest.approx(target)


def test_shedding_for_a_paid_p95_target() -> None:
    paid, free, service_s, servers = 0.8, 2.2, 2.0, 7
    target = 0.2
    shed = shed_fraction_for_paid_wait(paid, free, service_s, servers, target)
    assert 0 < shed < 1
    assert paid_p95_after_shedding(paid, free, service_s, servers, shed) == pytest.approx(target)
    assert paid_p95_after_shedding(paid, free, service_s, servers, shed * 0.9) > target
    assert shed_fraction_for_paid_wait(paid, free, service_s, servers, 100.0) == 0.0
    with pytest.raises(ValueError, match="every free request shed"):
        shed_fraction_for_paid_wait(3.0, free, service_s, servers, target)  # paid alone: 0.86


# --- the course brief's incident -------------------------------------------------------


def test_rates_for_the_brief_incident_round_trip() -> None:
    """97 ms paid p95 on 10 servers, 850 ms on 7 (30% lost), 2 s mean service."""
    paid, free = rates_for_paid_waits(10, 7, 2.0, 0.097, 0.850)
    before, after = priority_mmc(paid, free, 2.0, 10), priority_mmc(paid, free, 2.0, 7)
    assert before.paid_p95_wait_s == pytest.approx(0.097, rel=1e-6)
    assert after.paid_p95_wait_s == pytest.approx(0.850, rel=1e-6)
    assert 0 < before.utilization < after.utilization < 1


@pytest.mark.parametrize("service_s", [3.0, 4.0, 8.0])
def test_rates_for_mean_waits_round_trip(service_s: float) -> None:
    """Read as means, the same two waits fit longer services. Near saturation the paid
    mean stays finite while the solver's guard value is inf: that edge is no solution."""
    paid, free = rates_for_paid_waits(10, 7, service_s, 0.097, 0.850, q=None)
    assert priority_mmc(paid, free, service_s, 10).paid_mean_wait_s == pytest.approx(0.097)
    assert priority_mmc(paid, free, service_s, 7).paid_mean_wait_s == pytest.approx(0.850)


def test_a_large_pool_cannot_produce_the_incident() -> None:
    with pytest.raises(ValueError, match="no mix of paid and free traffic"):
        rates_for_paid_waits(20, 14, 1.0, 0.097, 0.850)


def test_closed_forms_import_only_the_standard_library() -> None:
    """Light enough for a grader's process: no numpy, no redis at import."""
    code = (
        "import sys, kvlib.serving.queueing, kvlib.serving.bucket, kvlib.serving.ratelimit,"
        " kvlib.commands.queue;"
        "print(sorted({'numpy', 'redis', 'simpy', 'torch'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
