"""kvlib.serving.queueing: one import for the queueing formulas; its two priority classes
and shedding against independent results: Kleinrock's conservation law, plain M/M/c when
one class is empty, the shed formula landing on its target, and chapter 5's incident
solved and checked."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlib.serving.erlang
import kvlib.serving.queueing
from kvlib.serving.erlang import UnstableQueueError, mmc, utilization
from kvlib.serving.queueing import (
    paid_p95_after_shedding,
    priority_mmc,
    rates_for_paid_waits,
    shed_fraction_for_paid_wait,
    shed_fraction_for_utilization,
)


def test_queueing_re_exports_erlang() -> None:
    """The chapters, `kvlib queue` and the graded notebooks import from queueing."""
    names = set(kvlib.serving.queueing.__all__)
    module = kvlib.serving.erlang
    public = {n for n in module.__all__ if not n.startswith("require_")} - {"tail_quantile_s"}
    assert public <= names, public - names
    for name in public:
        assert getattr(kvlib.serving.queueing, name) is getattr(module, name)


def test_closed_forms_import_only_the_standard_library() -> None:
    """Light enough for a grader's process: no numpy, no redis at import."""
    code = (
        "import sys, kvlib.serving.queueing, kvlib.serving.bucket, kvlib.serving.ratelimit,"
        " kvlib.commands.queue;"
        "print(sorted({'numpy', 'redis', 'simpy', 'torch'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


# --- two classes ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None, derandomize=True)
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


@settings(max_examples=100, deadline=None, derandomize=True)
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


# --- chapter 5's incident ---------------------------------------------------------------


def test_rates_for_the_incident_round_trip() -> None:
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
