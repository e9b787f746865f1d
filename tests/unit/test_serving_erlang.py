"""Closed forms of M/M/1 and M/M/c (kvlib.serving.erlang), against independent statements.

The simulator checks (formula inside a confidence interval) are in
``tests/unit/test_serving_simulate.py``; here every formula is compared with a
second, independent statement of the same textbook result, computed exactly
where possible, and bad input is refused with the argument named.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.serving.erlang import UnstableQueueError, erlang_c, mm1, mmc, utilization


def erlang_c_by_definition(c: int, a: Fraction) -> Fraction:
    """Kleinrock (1975) eq. for M/M/m: the stationary probability that all m are busy,
    from p_k = p_0 a^k / k! (k < m) and the geometric tail, in exact rationals."""
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) * c / (c - a)
    return tail / (head + tail)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(c=st.integers(1, 40), numerator=st.integers(1, 999))
def test_erlang_c_recursion_equals_the_definition(c: int, numerator: int) -> None:
    a = Fraction(numerator, 1000) * c  # utilization numerator/1000 < 1
    assert erlang_c(c, float(a)) == pytest.approx(float(erlang_c_by_definition(c, a)), rel=1e-9)


def test_erlang_c_on_a_large_pool_does_not_overflow() -> None:
    """Factorials of 2,000 overflow floats; the Erlang B recursion does not."""
    assert 0 < erlang_c(2_000, 1_990.0) < 1
    assert erlang_c(2_000, 1_000.0) < 1e-100


@settings(max_examples=100, deadline=None, derandomize=True)
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
