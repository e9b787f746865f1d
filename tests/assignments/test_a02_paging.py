"""The chapter 2 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, every named mistake stays out of the tolerance, and
the block-pool challenge's formula is what the real block pool does.

Each hidden test of ``solutions/02_paging/paging.ipynb`` is run with ``numbers``
replaced by an enumeration of every combination of its choices and ``expect`` by a
recorder, so the right value and the mistakes are the hidden test's own, not a copy.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import CodeType
from typing import Any

import nbformat
import pytest

import kvlib.grading as grading
from kvlib.grading import Numbers
from kvlib.paging.table import PagedKVCache

NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions/02_paging/paging.ipynb"
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
            exec(hidden, {"numbers": probe})  # a prompt cell has it from the setup cell
    return seen["challenge"], seen["choices"]


def _draws(challenge: str, choices: Mapping[str, Sequence[Any]]) -> Iterator[Numbers]:
    names = list(choices)
    for combo in itertools.product(*(list(choices[n]) for n in names)):
        yield Numbers(challenge, dict(zip(names, combo, strict=True)))


@functools.cache
def _compiled(source: str) -> CodeType:
    return compile(source, "<cell>", "exec")


def _run(source: str, draw: Numbers, **names: Any) -> dict[str, Any]:
    """Execute ``source`` with ``numbers`` returning ``draw``; return its namespace."""
    recorded: dict[str, Any] = {}

    def record(answer: object, expected: float, **kwargs: Any) -> None:
        recorded.update(expected=expected, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grading, "numbers", lambda challenge, /, **choices: draw)
        mp.setattr(grading, "expect", record)
        namespace: dict[str, Any] = {"math": math, **names}
        exec(_compiled(source), namespace)
    namespace["_expect"] = recorded
    return namespace


UNITS = {}
exec(CELLS["setup"].replace("from kvlib.grading import numbers, plausible\n", ""), UNITS)


def test_five_challenges_worth_ten_points() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    points = [c.metadata["nbgrader"].get("points", 0) for c in nb.cells if "nbgrader" in c.metadata]
    assert TESTS == ["blocks", "reserved_extra_mib", "prefix_saved_mib", "fork_blocks",
                     "pool_tokens"]  # fmt: skip
    assert sum(points) == 10


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    hidden = HIDDEN.search(CELLS[grade_id])
    solution = SOLUTION.search(CELLS[f"answer_{grade_id}"])
    assert hidden is not None and solution is not None
    challenge, choices = _choices(hidden.group(1))
    draws = 0
    for draw in _draws(challenge, choices):
        draws += 1
        answer = _run(solution.group(1), draw, N=draw, **UNITS)[grade_id]
        graded = _run(hidden.group(1), draw, **{grade_id: answer})["_expect"]
        right, rel = graded["expected"], graded.get("rel", 1e-9)
        assert right > 0, (draw, right)
        assert math.isclose(answer, right, rel_tol=max(rel, 1e-12)), (draw, answer, right)
        wrongs = list(graded["mistakes"].items())
        assert len(wrongs) >= 3
        for hint, wrong in wrongs:
            assert not math.isclose(wrong, right, rel_tol=2 * max(rel, 1e-9)), (
                f"{draw}: the mistake {hint!r} gives {wrong}, too close to {right}"
            )
            assert f"{right:,}" not in hint and str(right) not in hint, "a hint leaks the answer"
        # Two hints for one wrong value would make the diagnosis ambiguous.
        values = [w for _, w in wrongs]
        for i, a in enumerate(values):
            assert not any(math.isclose(a, b, rel_tol=1e-6) for b in values[i + 1 :]), draw
    assert draws == math.prod(len(list(c)) for c in choices.values())


@pytest.mark.parametrize("grade_id", TESTS)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    hidden = HIDDEN.search(CELLS[grade_id])
    assert hidden is not None
    challenge, choices = _choices(hidden.group(1))
    check = CELLS[f"check_{grade_id}"]
    for draw in _draws(challenge, choices):
        right = _run(hidden.group(1), draw, **{grade_id: None})["_expect"]["expected"]
        exec(_compiled(check), {"plausible": grading.plausible, grade_id: right})


def test_the_prompt_draws_the_numbers_the_hidden_test_draws() -> None:
    for grade_id in TESTS:
        hidden = HIDDEN.search(CELLS[grade_id])
        assert hidden is not None
        assert _choices(hidden.group(1)) == _choices(CELLS[f"numbers_{grade_id}"])


def test_the_fork_formula_is_what_the_block_pool_does() -> None:
    """Every draw of the copy-on-write challenge, run on kvlib.paging.table's PagedKVCache."""
    hidden = HIDDEN.search(CELLS["fork_blocks"])
    assert hidden is not None
    challenge, choices = _choices(hidden.group(1))
    for draw in _draws(challenge, choices):
        right = _run(hidden.group(1), draw, fork_blocks=None)["_expect"]["expected"]
        cache = PagedKVCache(200, draw.block_size)
        cache.add_sequence(0, list(range(draw.prompt_tokens)))
        for i in range(1, draw.samples):
            cache.fork(0, i)
        for step in range(draw.new_tokens):
            for i in range(draw.samples):
                cache.append_tokens(i, [10_000 * i + step])
        assert cache.pool.num_used_blocks == right, draw
