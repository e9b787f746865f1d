"""kvlib.serving.slots: the load-dependent M/M/c reduces to Erlang's M/M/c when the step
does not slow, agrees with a direct simulation of its birth-death chain when it does, and
Allen-Cunneen's correction tracks the simulator for fixed output lengths."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from kvlib.serving.erlang import UnstableQueueError, mmc
from kvlib.serving.simulate import ArrivalTrace, batch_means, simulate_pool
from kvlib.serving.slots import (
    allen_cunneen_wait_s,
    in_flight,
    load_dependent_mmc,
    max_arrivals_for_wait,
    pool_slots,
    service_s,
)


@pytest.mark.parametrize(("lam", "s", "c"), [(0.3, 2.0, 1), (4.0, 2.0, 10), (50.0, 3.0, 180)])
def test_a_fixed_step_is_erlangs_mmc(lam: float, s: float, c: int) -> None:
    got, want = load_dependent_mmc(lam, [s] * c), mmc(lam, s, c)
    assert got.p_wait == pytest.approx(want.p_wait, rel=1e-9)
    assert got.mean_wait_s == pytest.approx(want.mean_wait_s, rel=1e-9)
    assert got.p95_wait_s == pytest.approx(want.p95_wait_s, rel=1e-9, abs=1e-12)
    assert got.mean_running == pytest.approx(lam * s, rel=1e-9)  # Little's law on the slots


def _simulate_chain(
    lam: float, services: list[float], events: int, seed: int
) -> tuple[float, float]:
    """Time-average P(all c busy) and mean running of the birth-death chain, by Gillespie."""
    rng, c = random.Random(seed), len(services)
    n, busy_time, running_time, total = 0, 0.0, 0.0, 0.0
    for _ in range(events):
        death = 0.0 if n == 0 else min(n, c) / services[min(n, c) - 1]
        rate = lam + death
        dt = rng.expovariate(rate)
        total += dt
        busy_time += dt * (n >= c)
        running_time += dt * min(n, c)
        n += 1 if rng.random() < lam / rate else -1
    return busy_time / total, running_time / total


def test_a_slowing_step_matches_a_simulation_of_the_chain() -> None:
    services, lam = [1.0, 1.3, 1.8], 1.3  # the step slows as the batch fills
    exact = load_dependent_mmc(lam, services)
    p_busy, running = _simulate_chain(lam, services, 400_000, seed=3)
    assert p_busy == pytest.approx(exact.p_wait, rel=0.03)  # arrivals see time averages
    assert running == pytest.approx(exact.mean_running, rel=0.02)
    # Slower steps wait longer than the batch-of-one service would promise.
    assert exact.mean_wait_s > mmc(lam, services[0], 3).mean_wait_s


def test_the_pool_saturates_at_c_over_s_of_c() -> None:
    services = [1.0, 1.5, 2.0, 2.5]  # saturation: 4 / 2.5 = 1.6 requests/s
    load_dependent_mmc(1.59, services)
    with pytest.raises(UnstableQueueError, match="finishes 1.6 requests/s"):
        load_dependent_mmc(1.6, services)


def test_max_arrivals_meets_the_target_and_no_more() -> None:
    services = [10.0 * (1 + 0.05 * n) for n in range(16)]
    rate = max_arrivals_for_wait(services, 0.5)
    assert load_dependent_mmc(rate, services).p95_wait_s == pytest.approx(0.5, rel=1e-6)
    assert load_dependent_mmc(rate * 1.01, services).p95_wait_s > 0.5


def test_allen_cunneen_tracks_fixed_service_times() -> None:
    # M/D/4 at 80%: the correction halves the M/M/4 wait; the simulator agrees to 10%.
    lam, s, c, count = 1.6, 2.0, 4, 400_000
    rng = np.random.default_rng(11)
    arrivals = np.cumsum(rng.exponential(1 / lam, count))
    workload = ArrivalTrace(arrivals, np.ones(count, bool), np.full(count, s), rng.random(count))
    simulated = batch_means(simulate_pool(workload, c).waits())
    approx = allen_cunneen_wait_s(mmc(lam, s, c).mean_wait_s, service_cv2=0.0)
    assert approx == pytest.approx(mmc(lam, s, c).mean_wait_s / 2)
    assert simulated.value == pytest.approx(approx, rel=0.10)


def test_seats_to_slots_helpers() -> None:
    assert pool_slots(256, 226) == 226 and pool_slots(256, 1_000) == 256
    assert service_s(500, 50.0) == pytest.approx(10.0)
    assert in_flight(120 / 60, 30.0) == pytest.approx(60.0)  # 120 a minute held 30 s
    with pytest.raises(ValueError, match="max_num_seqs must be a whole number"):
        pool_slots(0, 10)
    with pytest.raises(ValueError, match=r"service_s_by_batch\[1\] must be a positive"):
        load_dependent_mmc(1.0, [1.0, -1.0])
    with pytest.raises(ValueError, match="service_cv2 must be"):
        allen_cunneen_wait_s(1.0, -0.5)
    assert math.isfinite(load_dependent_mmc(0.0, [1.0, 2.0]).mean_wait_s)
