"""The chapter 4 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, and every named mistake stays out of the tolerance.

Each hidden test of ``solutions/04_quantization/quantization.ipynb`` is run with
``numbers`` replaced by an enumeration of every combination of its choices and
``expect`` replaced by a recorder, so the right value and the mistakes are the
hidden test's own, not a copy.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import nbformat
import pytest

import kvlib.grading as grading
from kvlib.grading import Numbers

NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions/04_quantization/quantization.ipynb"
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)


def _cells() -> dict[str, str]:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return {
        c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells if "nbgrader" in c.metadata
    }


CELLS = _cells()
TESTS = [gid for gid, src in CELLS.items() if HIDDEN.search(src)]


class _Stop(Exception):
    pass


def _choices(hidden: str) -> tuple[str, dict[str, Sequence[Any]]]:
    """The challenge name and choices the hidden test passes to ``numbers``."""
    seen: dict[str, Any] = {}

    def probe(challenge: str, /, **choices: Sequence[Any]) -> Numbers:
        seen.update(challenge=challenge, choices=choices)
        raise _Stop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grading, "numbers", probe)
        with pytest.raises(_Stop):
            exec(hidden, {})
    return seen["challenge"], seen["choices"]


def _draws(challenge: str, choices: Mapping[str, Sequence[Any]]) -> Iterator[Numbers]:
    names = list(choices)
    for combo in itertools.product(*(list(choices[n]) for n in names)):
        yield Numbers(challenge, dict(zip(names, combo, strict=True)))


def _run(source: str, draw: Numbers, **names: Any) -> dict[str, Any]:
    """Execute ``source`` with ``numbers`` returning ``draw``; return its namespace."""
    recorded: dict[str, Any] = {}

    def record(answer: object, expected: float, **kwargs: Any) -> None:
        recorded.update(expected=expected, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grading, "numbers", lambda challenge, /, **choices: draw)
        mp.setattr(grading, "expect", record)
        namespace: dict[str, Any] = {"math": math, **names}
        exec(source, namespace)
    namespace["_expect"] = recorded
    return namespace


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    hidden = HIDDEN.search(CELLS[grade_id])
    solution = SOLUTION.search(CELLS[f"answer_{grade_id}"])
    assert hidden is not None and solution is not None
    challenge, choices = _choices(hidden.group(1))
    from kvlib.units import GB, MB, GiB, MiB  # what the setup cell imports

    units = {"GB": GB, "GiB": GiB, "MB": MB, "MiB": MiB}
    draws = 0
    for draw in _draws(challenge, choices):
        draws += 1
        answer = _run(solution.group(1), draw, N=draw, **units)[grade_id]
        graded = _run(hidden.group(1), draw, **{grade_id: answer})["_expect"]
        right, rel = graded["expected"], graded.get("rel", 1e-9)
        assert right > 0, (draw, right)
        if graded.get("integer"):
            assert right >= 1, f"{draw}: no seat fits, not a sensible problem"
        assert math.isclose(answer, right, rel_tol=max(rel, 1e-12)), (draw, answer, right)
        for hint, wrong in graded["mistakes"].items():
            assert not math.isclose(wrong, right, rel_tol=2 * max(rel, 1e-9)), (
                f"{draw}: the mistake {hint!r} gives {wrong}, too close to {right}"
            )
    assert draws == math.prod(len(list(c)) for c in choices.values())


@pytest.mark.parametrize("grade_id", TESTS)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    hidden = HIDDEN.search(CELLS[grade_id])
    assert hidden is not None
    challenge, choices = _choices(hidden.group(1))
    check = CELLS[f"check_{grade_id}"]
    for draw in _draws(challenge, choices):
        right = _run(hidden.group(1), draw, **{grade_id: None})["_expect"]["expected"]
        exec(check, {"plausible": grading.plausible, grade_id: right})


def test_four_challenges_worth_ten_points() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    points = [c.metadata["nbgrader"].get("points", 0) for c in nb.cells if "nbgrader" in c.metadata]
    assert len(TESTS) == 4 and sum(points) == 10
