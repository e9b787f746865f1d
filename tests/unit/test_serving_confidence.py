"""Batch-means intervals and Student's t (kvlib.serving.confidence), against tables and
against the truth on independent samples, where the interval's coverage can be counted."""

from __future__ import annotations

import numpy as np
import pytest

import kvlib.serving.simulate
from kvlib.serving.confidence import Estimate, batch_means, t_quantile


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


def test_simulate_re_exports_the_estimators() -> None:
    assert kvlib.serving.simulate.batch_means is batch_means
    assert kvlib.serving.simulate.Estimate is Estimate
    assert kvlib.serving.simulate.t_quantile is t_quantile
