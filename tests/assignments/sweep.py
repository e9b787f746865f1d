"""Sweeping a graded notebook's challenges over every draw of their numbers.

nbgrader (``tests/assignments/test_assignments.py``) grades a notebook for a handful of
students, so it sees a handful of draws. A challenge's numbers come from a single
``numbers("challenge", name=choices, ...)`` call in its hidden test (and the same call in
the prompt's numbers cell), so every combination of the choices is some student's
problem. A sweep runs each combination in-process:

1. ``choices`` probes the hidden test: it replaces ``kvlib.grading.numbers`` with a probe
   that records the challenge and its choices and stops the cell there;
2. ``draws`` enumerates the combinations (``itertools.product``, last name fastest) as
   ``kvlib.grading.Numbers``, or a seeded sample of them where there are too many;
3. ``run`` executes a cell (a solution, a hidden test, a visible check) with ``numbers``
   returning one draw and ``kvlib.grading.expect`` replaced by a recorder, and returns the
   cell's namespace, with what the cell passed to ``expect`` under ``"_expect"``.

The right value, its tolerance and the named mistakes are therefore the hidden test's
own, read from the notebook the grader runs, not a copy kept here that could drift from
it: a test of ``test_a0*.py`` checks them (the solution lands within the tolerance, each
mistake lands outside it, the hints name their mistakes) and compares the right value
with an independent computation in ``kvlib``.

``Notebook`` reads one solution notebook (by its path under ``solutions/``): its cells
by grade id, the hidden tests among them, their points, the setup cell's names and
each draw's right value. What only some chapters need is a parameter, not a copy:
``draws(exhaustive_up_to=...)`` samples a challenge with too many combinations to run
them all (chapter 5), ``run(also_grade=True)`` lets the real ``expect`` grade the
reference answer as nbgrader would (chapter 6).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

import kvlib.grading as grading
from kvlib.grading import Numbers

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
REAL_EXPECT = grading.expect  # before ``run`` replaces it with a recorder
# The setup cell's import that ``Notebook.units`` leaves out: ``run`` supplies ``numbers``,
# and a test that runs a visible check passes it ``plausible``.
_GRADING_IMPORT = "from kvlib.grading import numbers, plausible\n"


class Notebook:
    """One solution notebook: ``cells`` (sources by grade id, in notebook order),
    ``points`` (each graded cell's, 0 where it has none) and ``tests`` (the grade ids
    with a hidden test). ``path`` is relative to ``solutions/``."""

    def __init__(self, path: str) -> None:
        self.path = ROOT / "solutions" / path
        # Read as JSON: nbformat's validator is slow to import, and the sources are the same.
        graded = [
            c for c in json.loads(self.path.read_text())["cells"] if "nbgrader" in c["metadata"]
        ]
        self.cells: dict[str, str] = {
            c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in graded
        }
        self.points: list[float] = [c["metadata"]["nbgrader"].get("points", 0) for c in graded]
        self.tests = [gid for gid, src in self.cells.items() if HIDDEN.search(src)]

    @functools.cached_property
    def units(self) -> dict[str, Any]:
        """The names the setup cell imports (``math``, ``MiB``, ...), less ``numbers`` and
        ``plausible``, for running a solution cell outside the notebook."""
        names: dict[str, Any] = {}
        exec(self.cells["setup"].replace(_GRADING_IMPORT, ""), names)
        return names

    def hidden(self, grade_id: str) -> str:
        """The hidden test of the challenge ``grade_id``."""
        found = HIDDEN.search(self.cells[grade_id])
        assert found is not None, f"{grade_id} has no hidden test"
        return found.group(1)

    def right_values(self, grade_id: str) -> Iterator[tuple[Numbers, Any]]:
        """Every draw of the challenge with the right value its hidden test expects."""
        hidden = self.hidden(grade_id)
        for draw in draws(*choices(hidden)):
            yield draw, run(hidden, draw, **{grade_id: None})["_expect"]["expected"]


class _Stop(Exception):
    pass


def choices(source: str) -> tuple[str, dict[str, Sequence[Any]]]:
    """The challenge name and choices ``source`` (a hidden test, or a prompt's numbers
    cell) passes to ``numbers``; the cell stops at that call."""
    seen: dict[str, Any] = {}

    def probe(challenge: str, /, **choices: Sequence[Any]) -> Numbers:
        seen.update(challenge=challenge, choices=choices)
        raise _Stop

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grading, "numbers", probe)
        with pytest.raises(_Stop):
            exec(source, {"numbers": probe})  # a prompt cell has it from the setup cell
    return seen["challenge"], seen["choices"]


def draws(
    challenge: str,
    choices: Mapping[str, Sequence[Any]],
    *,
    exhaustive_up_to: int | None = None,
    sample: int = 200,
    seed: int = 0,
) -> Iterator[Numbers]:
    """Every combination of ``choices``, in ``itertools.product`` order; where there are
    more than ``exhaustive_up_to`` of them, a ``sample`` of them drawn with ``seed``."""
    names = list(choices)
    pools = [list(choices[n]) for n in names]
    combos: Iterator[tuple[Any, ...]] = itertools.product(*pools)
    count = math.prod(len(pool) for pool in pools)
    if exhaustive_up_to is not None and count > exhaustive_up_to:
        combos = (_combination(pools, i) for i in random.Random(seed).sample(range(count), sample))
    for combo in combos:
        yield Numbers(challenge, dict(zip(names, combo, strict=True)))


def _combination(pools: list[list[Any]], index: int) -> tuple[Any, ...]:
    """Combination ``index`` in product order: mixed radix, the last pool fastest."""
    picked = []
    for pool in reversed(pools):
        index, digit = divmod(index, len(pool))
        picked.append(pool[digit])
    return tuple(reversed(picked))


@functools.cache
def compiled(source: str) -> CodeType:
    return compile(source, "<cell>", "exec")


def run(source: str, draw: Numbers, /, *, also_grade: bool = False, **names: Any) -> dict[str, Any]:
    """Execute ``source`` with ``math`` and ``names`` defined, ``numbers`` (the global and
    ``kvlib.grading``'s) returning ``draw`` and ``kvlib.grading.expect`` recording its
    call; return the namespace. There ``"_expect"`` holds the expected value and keyword
    arguments passed to ``expect`` (``{"expected": ..., "rel": ..., "mistakes": ...}``)
    and ``"_expect_call"`` the last call as ``(answer, expected, kwargs)``. With
    ``also_grade`` the real ``expect`` grades the answer as well, as in nbgrader."""
    recorded: dict[str, Any] = {}

    def drawn(challenge: str, /, **choices: Any) -> Numbers:
        return draw

    namespace: dict[str, Any] = {"math": math, "numbers": drawn, **names}

    def record(answer: object, expected: float, **kwargs: Any) -> None:
        recorded.update(expected=expected, **kwargs)
        namespace["_expect_call"] = (answer, expected, kwargs)
        if also_grade:
            REAL_EXPECT(answer, expected, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grading, "numbers", drawn)
        mp.setattr(grading, "expect", record)
        exec(compiled(source), namespace)
    namespace["_expect"] = recorded
    return namespace
