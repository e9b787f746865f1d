"""The chapter 5 assignment on the draws of its numbers: each challenge is a sensible
problem, the solution gets it right, every named mistake stays out of the tolerance, and
the grader answers each mistake's value with that mistake's hint.

Each challenge of ``solutions/05_rate_limiting/rate_limiting.ipynb`` is swept
(``sweep.py``): run with ``numbers`` returning each combination of its choices in turn
(all of them where there are at most 1,000, else a seeded sample of 200) and ``expect``
replaced by a recorder, so the right value and the mistakes are the hidden test's own,
not a copy.
The solution cells are written independently of the hidden tests (the incident's with
``kvlib.serving.queueing``, its hidden test with ``math`` alone), so agreement on every
draw checks one against the other.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from typing import Any

import pytest

from assignments import sweep
from assignments.sweep import REAL_EXPECT
from course.checks import Numbers

NOTEBOOK = sweep.Notebook("05_rate_limiting/rate_limiting.ipynb")
CELLS = NOTEBOOK.cells
TESTS = NOTEBOOK.tests
EXHAUSTIVE_UP_TO, SAMPLE, SEED = 1_000, 200, 5


def test_five_challenges_are_graded() -> None:
    assert TESTS == [
        "admitted", "p95_wait_s", "shed_fraction", "share_over_old_p95", "p95_queue_wait_s"
    ]


@pytest.mark.parametrize("challenge", TESTS)
def test_every_draw_is_well_posed(challenge: str) -> None:
    answer_cell = sweep.SOLUTION.findall(CELLS[f"answer_{challenge}"])[0]
    hidden = sweep.HIDDEN.findall(CELLS[challenge])[0]
    student = "\n".join([CELLS["setup"], CELLS[f"numbers_{challenge}"], answer_cell])

    def run(draw: Numbers) -> tuple[float, float, dict[str, Any]]:
        with contextlib.redirect_stdout(io.StringIO()):
            kernel = sweep.run(student, draw)
        _, right, kw = sweep.run(hidden, draw, **{challenge: kernel[challenge]})["_expect_call"]
        return kernel[challenge], right, kw

    draws = sweep.draws(
        *sweep.choices(hidden), exhaustive_up_to=EXHAUSTIVE_UP_TO, sample=SAMPLE, seed=SEED
    )
    for draw in draws:
        answer, right, kw = run(draw)
        rel = max(float(kw["rel"]), 1e-9)
        assert right > 0 and math.isclose(answer, right, rel_tol=rel), (draw, answer, right)
        if kw.get("integer"):
            assert right == int(right), (draw, right)
        for hint, wrong in kw["mistakes"].items():
            # Three tolerances away: a slip is never graded right, nor right as a slip.
            assert not math.isclose(wrong, right, rel_tol=3 * rel), (draw, hint)
            # No number a hint quotes may be the answer (to the precision it is quoted).
            for quoted in re.findall(r"\d+(?:\.\d+)?", hint.replace(",", "")):
                assert not math.isclose(float(quoted), right, rel_tol=5e-3), (draw, hint)
            # The slip's value gets its own hint from the grader.
            with pytest.raises(AssertionError) as failure:
                REAL_EXPECT(wrong, right, **kw)
            assert hint in str(failure.value), (draw, hint, str(failure.value))


def _draws_and_namespaces(challenge: str) -> list[tuple[Numbers, dict[str, Any]]]:
    """Each draw of ``challenge`` with the namespace its hidden test leaves (the right value
    under ``"_expect_call"``, the test's own helpers beside it)."""
    hidden = sweep.HIDDEN.findall(CELLS[challenge])[0]
    draws = sweep.draws(
        *sweep.choices(hidden), exhaustive_up_to=EXHAUSTIVE_UP_TO, sample=SAMPLE, seed=SEED
    )
    return [(draw, sweep.run(hidden, draw, **{challenge: 0.5})) for draw in draws]


def test_every_incident_draw_waits_before_the_loss() -> None:
    """Challenge 4 is informative only where the paid p95 before the incident is above zero
    (more than one paid request in twenty waits): otherwise the old p95 is 0 and the
    answer is C itself. kvlib's priority queue, not the hidden test's Erlang recursion."""
    from kvlib.serving.queueing import priority_mmc

    for draw, ns in _draws_and_namespaces("share_over_old_p95"):
        before = priority_mmc(ns["paid"], ns["free"], ns["service_s"], ns["slots"])
        assert before.paid_p95_wait_s > 0, draw
        assert math.isclose(before.paid_p95_wait_s, ns["old_p95"], rel_tol=1e-9), draw


def test_every_seats_to_slots_draw_is_reachable_on_the_step_model() -> None:
    """Challenge 5's step time is :mod:`kvlib.step`'s (the matmuls at MFU x peak, the cache
    reads, the times added) for the step it claims, and every draw is reachable: the
    arriving prompts' prefill takes less than the whole GPU, the queue is stable, and the
    step's FLOP/s and bytes/s stay within MFU x peak and the bandwidth."""
    from kvlib.step import step_time_from_counts

    for draw, ns in _draws_and_namespaces("p95_queue_wait_s"):
        c, seat, lam = ns["c"], ns["seat"], ns["lam"]
        t = ns["step_s"](c, seat)
        assert t is not None and ns["right"] is not None, draw
        prefill_tokens = lam * ns["prompt_tokens"] * t  # the prompts that arrive in a step
        step = step_time_from_counts(
            weight_bytes=ns["weights_gb"] * 10**9,
            weight_flops=round(2 * ns["params_b"] * 10**9 * (c + prefill_tokens)),
            decode_tokens=c,
            decode_kv_bytes=c * seat,
            prefill_tokens=round(prefill_tokens),
            matmul_flops_per_s=ns["peak_tflops"] * 1e12,
            bandwidth_bytes_per_s=ns["bandwidth_tb_s"] * 1e12,
            mfu=ns["mfu"],
        )
        assert math.isclose(step.total_s, t, rel_tol=1e-6), (draw, step.total_s, t)
        assert step.reachable(), draw
        assert lam * ns["output_tokens"] * t < c, draw  # utilization below 1
