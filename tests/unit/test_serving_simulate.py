"""The pool simulators: SimPy and the fast path agree event for event, Lindley agrees with
both on one server, and every closed form of kvlib.serving.queueing lands inside the
simulation's batch-means confidence interval; the batch-means intervals and Student's t
against tables and against the truth on independent samples, where the interval's
coverage can be counted.

Every run is seeded, so each test is deterministic. The intervals are 99%: a correct
formula falls outside one about once in a hundred seeds, a wrong one by more than the
half-width (checked to be a few percent of the value) fails every time.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvlib.serving.erlang import mm1, mmc
from kvlib.serving.queueing import priority_mmc, rates_for_paid_waits
from kvlib.serving.simulate import (
    ArrivalTrace,
    Estimate,
    Gateway,
    batch_means,
    lindley_waits,
    poisson_workload,
    simulate_pool,
    simulate_pool_simpy,
    t_quantile,
)

CONFIDENCE = 0.99


def same_waits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(np.isnan(a), np.isnan(b)) and np.allclose(a, b, equal_nan=True))


@pytest.mark.parametrize(
    "gateway",
    [
        None,
        Gateway(shed_free=0.3),
        Gateway(free_bucket=(6.0, 1.8)),
        Gateway(shed_free=0.1, free_bucket=(8.0, 1.5), free_queue_limit=2),
        Gateway(free_queue_limit=0),
    ],
)
def test_fast_path_replays_the_simpy_model(gateway: Gateway | None) -> None:
    """Same workload, same gateway: the same requests admitted, the same waits."""
    workload = poisson_workload(1.0, 2.4, 2.0, 4_000, seed=11)  # offered utilization 0.97
    reference = simulate_pool_simpy(workload, 7, gateway)
    fast = simulate_pool(workload, 7, gateway)
    assert np.array_equal(reference.admitted, fast.admitted)
    assert same_waits(reference.wait_s, fast.wait_s)
    # The comparison means something: requests queued or were refused, many of them.
    assert (reference.waits() > 0).sum() + (~reference.admitted).sum() > 200
    assert gateway is None or 0.1 < reference.refused_share(paid=False) < 0.9


def test_lindley_recursion_is_the_one_server_pool() -> None:
    workload = poisson_workload(0.0, 0.8, 1.0, 200_000, seed=3)
    gaps = np.diff(workload.arrival_s, prepend=0.0)
    one = simulate_pool(ArrivalTrace(workload.arrival_s, workload.paid, workload.service_s,
                                     workload.coin), 1)
    assert np.allclose(lindley_waits(gaps, workload.service_s), one.wait_s, atol=1e-7)


def test_mm1_mean_and_p95_inside_the_interval() -> None:
    rho, service_s = 0.8, 1.0
    workload = poisson_workload(0.0, rho / service_s, service_s, 600_000, seed=5)
    waits = lindley_waits(np.diff(workload.arrival_s, prepend=0.0), workload.service_s)
    stats = mm1(rho / service_s, service_s)
    for q, exact in ((None, stats.mean_wait_s), (0.95, stats.p95_wait_s)):
        est = batch_means(waits, q=q, confidence=CONFIDENCE)
        assert est.half_width < 0.06 * exact
        assert est.contains(exact), f"q={q}: {exact:.4f} outside {est.low:.4f}..{est.high:.4f}"
    p_wait = batch_means((waits > 0).astype(float), confidence=CONFIDENCE)
    assert p_wait.contains(stats.p_wait)


@pytest.mark.parametrize(("servers", "rho"), [(4, 0.85), (10, 0.75)])
def test_mmc_fcfs_inside_the_interval(servers: int, rho: float) -> None:
    service_s = 2.0
    lam = rho * servers / service_s
    run = simulate_pool(poisson_workload(0.0, lam, service_s, 300_000, seed=servers), servers)
    stats = mmc(lam, service_s, servers)
    waits = run.waits()
    checks = [  # (estimate, closed form, the largest relative half-width accepted)
        (batch_means((waits > 0).astype(float), confidence=CONFIDENCE), stats.p_wait, 0.1),
        (batch_means(waits, confidence=CONFIDENCE), stats.mean_wait_s, 0.15),
        (batch_means(waits, q=0.95, confidence=CONFIDENCE), stats.p95_wait_s, 0.15),
        (batch_means(waits, q=0.99, confidence=CONFIDENCE), stats.wait_percentile_s(0.99), 0.25),
    ]
    for est, exact, rel in checks:
        assert est.half_width < rel * exact
        assert est.contains(exact), f"{exact:.4f} outside {est.low:.4f}..{est.high:.4f}"


def test_priority_classes_inside_the_interval() -> None:
    paid, free, service_s, servers = 1.2, 2.4, 2.0, 8  # utilization 0.9
    run = simulate_pool(poisson_workload(paid, free, service_s, 400_000, seed=8), servers)
    stats = priority_mmc(paid, free, service_s, servers)
    checks = [
        (batch_means(run.waits(paid=True), confidence=CONFIDENCE), stats.paid_mean_wait_s),
        (batch_means(run.waits(paid=True), q=0.95, confidence=CONFIDENCE), stats.paid_p95_wait_s),
        (batch_means(run.waits(paid=False), confidence=CONFIDENCE), stats.free_mean_wait_s),
        (batch_means((run.waits() > 0).astype(float), confidence=CONFIDENCE), stats.p_wait),
    ]
    for est, exact in checks:
        assert est.half_width < 0.15 * exact
        assert est.contains(exact), f"{exact:.4f} outside {est.low:.4f}..{est.high:.4f}"
    # Paid requests wait far less than they would first come first served, free ones more.
    fcfs = mmc(paid + free, service_s, servers).mean_wait_s
    assert stats.paid_mean_wait_s < 0.2 * fcfs and stats.free_mean_wait_s > 1.3 * fcfs


def test_the_incident_in_simulation() -> None:
    """Paid p95 of 97 ms on 10 servers becomes ~850 ms on 7, and shedding restores it."""
    service_s = 2.0
    paid, free = rates_for_paid_waits(10, 7, service_s, 0.097, 0.850)
    workload = poisson_workload(paid, free, service_s, 300_000, seed=97)
    for servers, exact in ((10, 0.097), (7, 0.850)):
        run = simulate_pool(workload, servers)
        est = batch_means(run.waits(paid=True), q=0.95, confidence=CONFIDENCE)
        assert est.contains(exact), f"{servers}: {exact} outside {est.low:.3f}..{est.high:.3f}"
        assert est.half_width < 0.25 * exact  # a p95 where only 7.5% wait is a noisy statistic
    # Shedding 40% of free arrivals on the 7 servers: the paid tail more than halves.
    shed = simulate_pool(workload, 7, Gateway(shed_free=0.4))
    exact = priority_mmc(paid, 0.6 * free, service_s, 7).paid_p95_wait_s
    est = batch_means(shed.waits(paid=True), q=0.95, confidence=CONFIDENCE)
    assert est.contains(exact) and est.high < 0.85 / 2
    assert shed.refused_share(paid=False) == pytest.approx(0.4, abs=0.005)
    assert shed.refused_share(paid=True) == 0


def test_gateway_rules() -> None:
    workload = poisson_workload(0.5, 3.0, 2.0, 50_000, seed=1)
    # A queue limit of 0: a free request is admitted only if a slot is idle.
    run = simulate_pool(workload, 7, Gateway(free_queue_limit=0))
    assert np.all(run.waits(paid=False) == 0) and 0.1 < run.refused_share() < 0.5
    # A limit of 3: never more than 3 free requests waiting, so a free request's wait
    # is at most the time for 4 slot releases; and some do wait.
    run = simulate_pool(workload, 7, Gateway(free_queue_limit=3))
    assert (run.waits(paid=False) > 0).mean() > 0.1 and run.refused_share() > 0.01
    # A token bucket for the free tier admits at most capacity + refill * time.
    capacity, refill = 20.0, 1.0
    run = simulate_pool(workload, 7, Gateway(free_bucket=(capacity, refill)))
    free_admits = int(np.sum(run.admitted & ~workload.paid))
    span = workload.arrival_s[-1] - workload.arrival_s[0]
    assert refill * span * 0.99 < free_admits <= capacity + refill * span


def test_workloads_are_seeded_and_checked() -> None:
    a = poisson_workload(1.0, 2.0, 1.0, 1_000, seed=4)
    b = poisson_workload(1.0, 2.0, 1.0, 1_000, seed=4)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(a.paid, b.paid)
    assert abs(a.paid.mean() - 1 / 3) < 0.05 and np.all(np.diff(a.arrival_s) > 0)
    with pytest.raises(ValueError, match="service_s must be a positive"):
        poisson_workload(1.0, 2.0, 0.0, 10, seed=1)
    with pytest.raises(ValueError, match="shed_free must be between 0 and 1"):
        Gateway(shed_free=1.5)


def test_student_t_quantiles_match_the_tables() -> None:
    """Abramowitz & Stegun Table 26.10 (two-sided 95% and 99% points)."""
    for p, df, table in [(0.975, 9, 2.262157), (0.995, 9, 3.249836), (0.975, 19, 2.093024),
                         (0.995, 19, 2.860935), (0.995, 39, 2.707913)]:
        assert t_quantile(p, df) == pytest.approx(table, abs=2e-4)


def test_batch_means_of_independent_draws_is_the_t_interval() -> None:
    """Independent N(0, 1) draws: the batch means are independent too, so the interval is
    Student's t on the 20 batch means, and it contains 0 with the stated confidence."""
    rng = np.random.default_rng(0)
    runs, inside = 200, 0
    for _ in range(runs):
        draws = rng.standard_normal(4_000)
        est = batch_means(draws, warmup_fraction=0.0)
        means = draws.reshape(20, -1).mean(axis=1)
        assert est.value == pytest.approx(means.mean())
        assert est.half_width == pytest.approx(
            t_quantile(0.975, 19) * means.std(ddof=1) / np.sqrt(20)
        )
        inside += est.contains(0.0)
    # Seeded, so this count is fixed; a 95% interval covers about 190 of 200.
    assert 180 <= inside <= 198


def test_quantiles_and_bad_arguments() -> None:
    data = np.arange(10_000, dtype=float)
    est = batch_means(data, q=0.5, warmup_fraction=0.0)
    assert isinstance(est, Estimate) and est.batches == 20 and est.confidence == 0.95
    assert est.low < est.value < est.high
    with pytest.raises(ValueError, match="batches must be at least 10"):
        batch_means(np.ones(1_000), batches=5)
    with pytest.raises(ValueError, match="too few for 20 batches"):
        batch_means(np.ones(100))
    with pytest.raises(ValueError, match="df >= 9"):
        t_quantile(0.975, 5)
