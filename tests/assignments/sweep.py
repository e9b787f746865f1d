"""Sweeping a graded notebook's challenges over every draw of their numbers.

nbgrader (``tests/assignments/test_assignments.py``) grades a notebook for a handful of
students, so it sees a handful of draws. A challenge's numbers come from a single
``numbers("challenge", name=choices, ...)`` call in its hidden test (and the same call in
the prompt's numbers cell), so every combination of the choices is some student's
problem. A sweep runs each combination in-process:

1. ``choices`` probes the hidden test: it replaces ``course.checks.numbers`` with a probe
   that records the challenge and its choices and stops the cell there;
2. ``draws`` enumerates the combinations (``itertools.product``, last name fastest) as
   ``course.checks.Numbers``, or a seeded sample of them where there are too many;
3. ``run`` executes a cell (a solution, a hidden test, a visible check) with ``numbers``
   returning one draw and ``course.checks.expect`` replaced by a recorder, and returns the
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
them all (chapters 3 and 5), ``run(also_grade=True)`` lets the real ``expect`` grade the
reference answer as nbgrader would (chapter 6).

The checks every chapter's sweep makes are written once, at the end:
``assert_solved_with_distinct_mistakes`` (each draw solved, each named mistake outside the
tolerance and apart from the others, no hint quoting the answer),
``assert_graded_as_named`` (the real ``expect`` passes the solution and names each
mistake and the classic one), ``assert_visible_check_accepts_right_answers`` and
``assert_prompts_draw_as_hidden_tests``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

import course.checks as grading
from course.checks import Numbers

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
PLACEHOLDER = re.compile(r"(\w+) = \.\.\.")  # an answer cell's first line: ``name = ...``
REAL_EXPECT = grading.expect  # before ``run`` replaces it with a recorder
# The setup cell's import that ``Notebook.units`` leaves out: ``run`` supplies ``numbers``,
# and a test that runs a visible check passes it ``plausible``.
_GRADING_IMPORT = "from course.checks import numbers, plausible\n"


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

    def answer_name(self, grade_id: str) -> str:
        """The name the answer cell of ``grade_id`` assigns (``factor`` for chapter 3's
        ``reduction``): the placeholder line ``name = ...`` it opens with."""
        found = PLACEHOLDER.match(self.cells[f"answer_{grade_id}"])
        return found.group(1) if found else grade_id

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
    ``course.checks``'s) returning ``draw`` and ``course.checks.expect`` recording its
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


@dataclass(frozen=True)
class Graded:
    """One draw of a challenge: the reference solution's ``answer``, and what the hidden
    test passed to ``expect`` (``right``, ``rel`` and the named ``mistakes``; ``kwargs``
    is every keyword argument but the expected value, to replay the real ``expect``)."""

    draw: Numbers
    answer: Any
    right: float
    rel: float
    mistakes: list[tuple[str, float]]
    kwargs: dict[str, Any]


def graded_draws(
    notebook: Notebook,
    grade_id: str,
    *,
    after_numbers_cell: bool = False,
    sample: int | None = None,
    seed: int = 0,
) -> list[Graded]:
    """Every draw of ``grade_id``: its reference solution run, then graded by its hidden
    test. With ``after_numbers_cell`` the solution runs after the prompt's numbers cell
    (where that cell defines names the solution uses, such as a config). With ``sample``,
    a challenge of more draws than that is tried on ``sample`` of them, drawn with
    ``seed``."""
    hidden = notebook.hidden(grade_id)
    name = notebook.answer_name(grade_id)
    solution = SOLUTION.search(notebook.cells[f"answer_{grade_id}"])
    assert solution is not None, f"answer_{grade_id} has no solution"
    source = solution.group(1)
    if after_numbers_cell:
        source = notebook.cells[f"numbers_{grade_id}"] + "\n" + source
    challenge, options = choices(hidden)
    results = []
    for draw in draws(challenge, options, exhaustive_up_to=sample, sample=sample or 0, seed=seed):
        with contextlib.redirect_stdout(io.StringIO()):
            answer = run(source, draw, N=draw, **notebook.units)[name]
        graded = run(hidden, draw, **{name: answer})["_expect"]
        kwargs = {k: v for k, v in graded.items() if k != "expected"}
        mistakes = list(graded["mistakes"].items())
        results.append(
            Graded(draw, answer, graded["expected"], graded.get("rel", 1e-9), mistakes, kwargs)
        )
    count = math.prod(len(list(c)) for c in options.values())
    assert len(results) == (count if sample is None else min(count, sample))
    return results


def assert_solved_with_distinct_mistakes(
    notebook: Notebook,
    grade_id: str,
    *,
    min_mistakes: int = 3,
    after_numbers_cell: bool = False,
    distinct: bool = True,
    sample: int | None = None,
    seed: int = 0,
) -> list[Graded]:
    """Every draw is a sensible problem (a positive answer) that the solution gets right;
    it names at least ``min_mistakes`` mistakes, each outside twice the tolerance, and no
    hint quotes the answer. With ``distinct``, no two mistakes share a value (a value with
    two hints would make the diagnosis ambiguous). ``sample`` and ``seed`` as for
    ``graded_draws``. Returns the draws for a chapter's own further checks."""
    results = graded_draws(
        notebook, grade_id, after_numbers_cell=after_numbers_cell, sample=sample, seed=seed
    )
    for g in results:
        assert g.right > 0, (g.draw, g.right)
        assert math.isclose(g.answer, g.right, rel_tol=max(g.rel, 1e-12)), (g.draw, g.answer)
        assert len(g.mistakes) >= min_mistakes, (g.draw, g.mistakes)
        for hint, wrong in g.mistakes:
            assert not math.isclose(wrong, g.right, rel_tol=2 * max(g.rel, 1e-9)), (
                f"{g.draw}: the mistake {hint!r} gives {wrong}, too close to {g.right}"
            )
            for quoted in quoted_numbers(hint):
                assert not math.isclose(quoted, g.right, rel_tol=5e-3), (g.draw, hint)
        values = [w for _, w in g.mistakes] if distinct else []
        for i, a in enumerate(values):
            assert not any(math.isclose(a, b, rel_tol=1e-6) for b in values[i + 1 :]), g.draw
    return results


def assert_graded_as_named(
    notebook: Notebook, grade_id: str, results: Sequence[Graded], classic: tuple[str, str]
) -> None:
    """On each draw of ``results`` (from ``graded_draws``), as the real ``plausible`` and
    ``expect`` grade it: the reference answer passes the visible check and the hidden
    test; each named mistake is outside the tolerance (at least 1e-6) and fails with a
    hint whose mistake gives that value; the ``classic`` mistake (an answer cell's source
    on ``N``, and a phrase its hint must contain: ``WRONG`` of ``tests/assignments/aNN_*``)
    fails with that phrase."""
    name = notebook.answer_name(grade_id)
    check = compiled(notebook.cells[f"check_{grade_id}"])
    wrong_source, phrase = classic
    for g in results:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(check, {**notebook.units, "plausible": grading.plausible, name: g.answer})
        REAL_EXPECT(g.answer, g.right, **g.kwargs)
        mistakes = dict(g.mistakes)
        rel = max(g.kwargs.get("rel", 0), 1e-6)
        for hint, wrong in g.mistakes:
            assert not math.isclose(wrong, g.right, rel_tol=rel), (g.draw, hint)
            message = _failure(wrong, g)
            named = [h for h in mistakes if h in message]
            assert named and math.isclose(mistakes[named[0]], wrong, rel_tol=1e-6), (g.draw, hint)
        answer = run(wrong_source, g.draw, N=g.draw, **notebook.units)[name]
        assert phrase in _failure(answer, g), (g.draw, phrase)


def _failure(answer: object, graded: Graded) -> str:
    """The message of the real ``expect`` failing ``answer`` on the draw ``graded``."""
    try:
        REAL_EXPECT(answer, graded.right, **graded.kwargs)
    except AssertionError as failed:
        return str(failed)
    raise AssertionError(f"{graded.draw}: {answer!r} passes, {graded.right!r} expected")


@functools.cache
def llama_like(layers: int, heads: int, kv_heads: int, head_dim: int) -> Any:
    """A Llama-shaped config from the four fields a challenge draws (the independent
    computations of the chapter 7 and 8 sweeps size it with kvlib)."""
    from kvlib.config import load_config

    return load_config({"model_type": "llama", "num_hidden_layers": layers,
                        "num_attention_heads": heads, "num_key_value_heads": kv_heads,
                        "head_dim": head_dim, "hidden_size": heads * head_dim,
                        "vocab_size": 32_000, "max_position_embeddings": 131_072})


def quoted_numbers(hint: str) -> list[float]:
    """The numbers in ``hint`` as a learner reads them: "1,024" is 1024; not the "16" of
    fp16, nor the 20 of 2^20."""
    found = re.findall(r"(?<![\w.^])\d+(?:\.\d+)?(?![\w^])", hint.replace(",", ""))
    return [float(n) for n in found]


def assert_visible_check_accepts_right_answers(notebook: Notebook, grade_id: str) -> None:
    """The prompt's visible check (``check_<grade_id>``) passes every draw's right value."""
    check = compiled(notebook.cells[f"check_{grade_id}"])
    for _, right in notebook.right_values(grade_id):
        exec(check, {"plausible": grading.plausible, grade_id: right})


def assert_prompts_draw_as_hidden_tests(notebook: Notebook) -> None:
    """Each prompt's numbers cell draws from the same choices as its hidden test."""
    for grade_id in notebook.tests:
        assert choices(notebook.hidden(grade_id)) == choices(notebook.cells[f"numbers_{grade_id}"])
