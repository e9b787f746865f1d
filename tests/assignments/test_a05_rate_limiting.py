"""The chapter 5 assignment on the draws of its numbers: each challenge is a sensible
problem, the solution gets it right, and every named mistake stays out of the tolerance.

Each challenge of ``solutions/05_rate_limiting/rate_limiting.ipynb`` is run with
``numbers`` replaced by an enumeration of the combinations of its choices (all of them
where there are at most 1,000, else a seeded sample of 200) and ``expect`` replaced by a
recorder, so the right value and the mistakes are the hidden test's own, not a copy.
The solution cells are written independently of the hidden tests (the incident's with
``kvlib.serving.queueing``, its hidden test with ``math`` alone), so agreement on every
draw checks one against the other.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest

import kvlib.grading
from kvlib.grading import Numbers

NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions/05_rate_limiting/rate_limiting.ipynb"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
EXHAUSTIVE_UP_TO, SAMPLE = 1_000, 200


def _cells() -> dict[str, str]:
    """Cell sources by grade id (read as JSON: nbformat's validator is slow to import)."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return {
        c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"])
        for c in cells
        if "nbgrader" in c["metadata"]
    }


CELLS = _cells()
TESTS = [gid for gid, src in CELLS.items() if HIDDEN.search(src)]


class Enumeration:
    """Stands in for ``numbers``: combination ``index`` of the choices, in product order."""

    def __init__(self) -> None:
        self.index = 0
        self.count = 0

    def __call__(self, challenge: str, /, **choices: Any) -> Numbers:
        pools = {name: list(options) for name, options in choices.items()}
        self.count = math.prod(len(pool) for pool in pools.values())
        rest, values = self.index % self.count, {}
        for name in reversed(list(pools)):  # mixed radix, last name fastest
            rest, digit = divmod(rest, len(pools[name]))
            values[name] = pools[name][digit]
        return Numbers(challenge, {name: values[name] for name in pools})


def test_four_challenges_are_graded() -> None:
    assert TESTS == ["admitted", "p95_wait_s", "shed_fraction", "paid_p95_after_s"]


@pytest.mark.parametrize("challenge", TESTS)
def test_every_draw_is_well_posed(challenge: str, monkeypatch: pytest.MonkeyPatch) -> None:
    draw = Enumeration()
    recorded: list[tuple[float, dict[str, Any]]] = []
    monkeypatch.setattr(kvlib.grading, "numbers", draw)
    monkeypatch.setattr(
        kvlib.grading, "expect", lambda answer, right, **kw: recorded.append((right, kw))
    )
    answer_cell = SOLUTION.findall(CELLS[f"answer_{challenge}"])[0]
    hidden = HIDDEN.findall(CELLS[challenge])[0]

    def run(index: int) -> tuple[float, float, dict[str, Any]]:
        draw.index = index
        kernel: dict[str, Any] = {}
        with contextlib.redirect_stdout(io.StringIO()):
            exec(CELLS["setup"], kernel)
            exec(CELLS[f"numbers_{challenge}"], kernel)
            exec(answer_cell, kernel)
        exec(hidden, {challenge: kernel[challenge]})
        right, kw = recorded[-1]
        return kernel[challenge], right, kw

    run(0)
    indices = list(range(draw.count))
    if draw.count > EXHAUSTIVE_UP_TO:
        indices = random.Random(5).sample(indices, SAMPLE)
    for index in indices:
        answer, right, kw = run(index)
        rel = max(float(kw["rel"]), 1e-9)
        assert right > 0 and math.isclose(answer, right, rel_tol=rel), (index, answer, right)
        if kw.get("integer"):
            assert right == int(right), (index, right)
        for hint, wrong in kw["mistakes"].items():
            # Three tolerances away: a slip is never graded right, nor right as a slip.
            assert not math.isclose(wrong, right, rel_tol=3 * rel), (index, hint)
            # No number a hint quotes may be the answer (to the precision it is quoted).
            for quoted in re.findall(r"\d+(?:\.\d+)?", hint.replace(",", "")):
                assert not math.isclose(float(quoted), right, rel_tol=5e-3), (index, hint)
