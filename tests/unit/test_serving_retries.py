"""kvlib.serving.retries: the closed forms against independent coin flips, and the replay
of a burst under a whole-second Retry-After and under jittered exponential backoff."""

from __future__ import annotations

import random

import pytest

from kvlib.serving.retries import (
    RetryPolicy,
    admitted_share_with_budget,
    attempts_per_request,
    refuse_share_for_admitted,
    served_share,
    simulate_retries,
)


@pytest.mark.parametrize(("f", "k"), [(0.3, 0), (0.5, 2), (0.8, 5)])
def test_closed_forms_match_coin_flips(f: float, k: int) -> None:
    rng, requests, attempts, served = random.Random(1), 100_000, 0, 0
    for _ in range(requests):
        for _ in range(k + 1):
            attempts += 1
            if rng.random() >= f:
                served += 1
                break
    assert served / requests == pytest.approx(served_share(f, k), abs=0.005)
    assert attempts / requests == pytest.approx(attempts_per_request(f, k), rel=0.01)


def test_unlimited_retries_admit_everything() -> None:
    assert served_share(0.9, None) == 1.0
    assert attempts_per_request(0.75, None) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="random refusals cannot lower the admitted load"):
        refuse_share_for_admitted(0.5, None)


def test_refuse_share_inverts_served_share() -> None:
    for k in (0, 1, 3):
        f = refuse_share_for_admitted(0.6, k)
        assert served_share(f, k) == pytest.approx(0.6)
    assert refuse_share_for_admitted(0.6, 0) == pytest.approx(0.4)


def test_a_budget_bounds_what_retries_add() -> None:
    assert admitted_share_with_budget(0.5, None, 0.0) == pytest.approx(0.5)
    assert admitted_share_with_budget(0.5, None, 0.1) == pytest.approx(0.55)
    # A budget larger than what clients want changes nothing.
    assert admitted_share_with_budget(0.5, 2, 1.0) == pytest.approx(served_share(0.5, 2))


def test_a_replayed_burst_never_beats_the_bucket() -> None:
    for policy in (RetryPolicy("retry_after"), RetryPolicy("backoff", base_s=1.0)):
        run = simulate_retries(120, 10, 2.0, policy, seed=4)
        assert run.served == 120
        admit_times = [t for t, ok in zip(run.attempt_s, run.admitted, strict=True) if ok]
        for t in admit_times:  # admits by time t never exceed B + r t
            assert sum(a <= t for a in admit_times) <= 10 + 2.0 * t + 1e-9


def test_whole_second_retry_after_synchronises_and_jitter_spreads() -> None:
    herd = simulate_retries(200, 10, 2.0, RetryPolicy("retry_after"), seed=1)
    spread = simulate_retries(200, 10, 2.0, RetryPolicy("backoff", base_s=1.0), seed=1)
    assert all(t == int(t) for t in herd.attempt_s)  # every retry on a whole second
    assert herd.peak_attempts(after_s=0.0) > 4 * spread.peak_attempts(after_s=0.0)
    assert herd.attempts > 3 * spread.attempts


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="kind must be"):
        RetryPolicy("immediately")
    closed = r"^refuse_share must be a share, 0 <= refuse_share <= 1, got 1\.5$"
    with pytest.raises(ValueError, match=closed):
        served_share(1.5, 1)
    # Every attempt refused would mean infinitely many attempts: the bound is open at 1.
    top_open = r"^refuse_share must be a share, 0 <= refuse_share < 1, got 1\.0$"
    with pytest.raises(ValueError, match=top_open):
        attempts_per_request(1.0, None)
