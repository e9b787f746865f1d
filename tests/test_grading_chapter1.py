"""Chapter 1's graded challenges, checked for every draw of their per-student numbers.

For each challenge the choices are read from its prompt cell's ``numbers(...)``
call, and every combination is tried: the right answer (a learner's formula,
written here) passes the hidden test and the visible check, and each classic
mistake fails with the hint that names it. So no student can be given numbers
for which a mistake goes unnamed or a right answer is refused.
"""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import math
import re
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

import pytest
from grading_support import CHALLENGES, cell_source, drawn, expected

import kvlib.grading
from kvlib.grading import Numbers, grading_student, plausible
from kvlib.grading.hidden import free_names, run_hidden_test

GiB = 2**30

Mistakes = list[tuple[Callable[[Any], float], str]]
RIGHT: dict[str, Callable[[Any], float]] = {
    "bytes_per_token": lambda n: 2 * n.layers * n.kv_heads * n.head_dim,
    "seats": lambda n: n.free_gib * GiB // (n.context_tokens * n.kv_bytes_per_token),
    "prefill_s": lambda n: 2 * n.params_billion * 1e9 * n.prompt_tokens / (n.tflop_per_s * 1e12),
}
MISTAKES: dict[str, Mistakes] = {
    "bytes_per_token": [
        (lambda n: 2 * n.layers * n.kv_heads * n.group * n.head_dim, "attention heads"),
        (lambda n: 2 * n.layers * n.kv_heads * n.head_dim * 2, "2 bytes per element"),
        (lambda n: n.layers * n.kv_heads * n.head_dim, "factor 2"),
        (lambda n: 2 * n.layers * n.kv_heads * n.head_dim * 8, "8 bits"),
        (lambda n: 2 * n.kv_heads * n.head_dim, "one layer"),
        (lambda n: 2 * n.layers * n.kv_heads * n.head_dim / 1024, "KiB"),
        (lambda n: 2 * n.layers * n.kv_heads * n.head_dim / 1000, "KB (1000 bytes)"),
    ],
    "seats": [
        (lambda n: n.free_gib * 10**9 // (n.context_tokens * n.kv_bytes_per_token), "GB"),
        (lambda n: -(-n.free_gib * GiB // (n.context_tokens * n.kv_bytes_per_token)), "round"),
        (lambda n: n.free_gib * GiB // n.kv_bytes_per_token, "tokens, not conversations"),
        (lambda n: n.free_gib * GiB // n.context_tokens, "not by the bytes per token"),
        (lambda n: n.free_gib * GiB / (n.context_tokens * n.kv_bytes_per_token), "whole number"),
    ],
    "prefill_s": [
        (lambda n: n.params_billion * 1e9 * n.prompt_tokens / (n.tflop_per_s * 1e12), "the 2"),
        (lambda n: 6 * n.params_billion * 1e9 * n.prompt_tokens / (n.tflop_per_s * 1e12), "6 F"),
        (lambda n: 2e3 * n.params_billion * 1e9 * n.prompt_tokens / (n.tflop_per_s * 1e12), "ms"),
        (lambda n: 2 * n.params_billion * 1e9 / (n.tflop_per_s * 1e12), "one token"),
        (lambda n: 2 * n.params_billion * 1e9 * n.prompt_tokens / (n.tflop_per_s * 2**40), "dec"),
    ],
}
PHRASES = {"round": "round down", "ms": "milliseconds", "dec": "decimal", "6 F": "6 FLOPs"}


def _choices(challenge: str) -> tuple[str, dict[str, list[Any]]]:
    """The challenge name and choices of the prompt cell's ``numbers(...)`` call."""
    call = next(
        node
        for node in ast.walk(ast.parse(cell_source(f"numbers_{challenge}")))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "numbers"
    )
    name = ast.literal_eval(call.args[0])
    choices = {}
    for keyword in call.keywords:
        value = keyword.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "range":
            choices[str(keyword.arg)] = list(range(*(ast.literal_eval(a) for a in value.args)))
        else:
            choices[str(keyword.arg)] = list(ast.literal_eval(value))
    return name, choices


def every_draw(challenge: str) -> Iterator[Numbers]:
    name, choices = _choices(challenge)
    for combo in itertools.product(*choices.values()):
        yield Numbers(name, dict(zip(choices, combo, strict=True)))


@contextlib.contextmanager
def drawing(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Numbers]]:
    """``kvlib.grading.numbers`` returns the Numbers put in the yielded list."""
    box: list[Numbers] = []
    with monkeypatch.context() as m:
        m.setattr(kvlib.grading, "numbers", lambda *args, **kwargs: box[0])
        yield box


def verdict(code: CodeType, name: str, answer: float) -> str:
    """ "" when the hidden test passes ``answer``, else its message (as the grader runs it)."""
    namespace: dict[str, Any] = {"__builtins__": __builtins__, name: answer}
    try:
        exec(code, namespace)
    except AssertionError as err:
        return str(err)
    return ""


def _without_prompt_numbers(message: str, n: Numbers) -> set[str]:
    """Numbers in a hint, less the prompt's own and powers such as 2^30 (a unit, not a value)."""
    message = re.sub(r"\d+\^\d+", "", message)
    numbers = {n.replace(",", "").replace("_", "") for n in re.findall(r"[\d][\d,_.]*", message)}
    given = {str(v) for v in n.values()} | {f"{v:,}".replace(",", "") for v in n.values()
                                            if isinstance(v, int)}  # fmt: skip
    return {x.rstrip(".") for x in numbers} - given


@pytest.mark.parametrize("challenge", CHALLENGES)
def test_every_draw(challenge: str, monkeypatch: pytest.MonkeyPatch) -> None:
    source = cell_source(challenge)
    code = compile(source, "<hidden test>", "exec")
    check = compile(cell_source(f"check_{challenge}"), "<check>", "exec")
    draws = 0
    with drawing(monkeypatch) as box:
        for n in every_draw(challenge):
            box[:] = [n]
            draws += 1
            right = RIGHT[challenge](n)
            assert verdict(code, challenge, right) == "", n
            with contextlib.redirect_stdout(io.StringIO()):
                exec(check, {"plausible": plausible, challenge: right, "KiB": 1024,
                             "MiB": 2**20})  # fmt: skip
            for wrong_of, phrase in MISTAKES[challenge]:
                wrong = wrong_of(n)
                message = verdict(code, challenge, wrong)
                assert PHRASES.get(phrase, phrase) in message, (n, wrong, message)
                own = message.split(" is wrong", 1)[-1]
                if isinstance(right, int):
                    assert str(right) not in _without_prompt_numbers(own, n), (n, message)
    assert draws >= 300, "too few draws: students would share numbers"


@pytest.mark.parametrize("challenge", CHALLENGES)
def test_hidden_test_reads_only_the_answer(challenge: str) -> None:
    assert free_names(cell_source(challenge)) == [challenge]


def test_two_students_two_problems_and_a_copied_answer_fails() -> None:
    alice, bob = expected("alice"), expected("bob")
    assert all(alice[c] != bob[c] for c in CHALLENGES)
    for challenge in CHALLENGES:
        cell = cell_source(challenge)
        with grading_student("bob"):
            assert run_hidden_test(cell, {challenge: bob[challenge]}).passed
            copied = run_hidden_test(cell, {challenge: alice[challenge]})
        assert not copied.passed and copied.ename == "AssertionError"


def test_prompt_prints_the_numbers_the_test_uses(capsys: pytest.CaptureFixture[str]) -> None:
    n = drawn("bytes_per_token", "alice")
    with grading_student("alice"):
        exec(cell_source("numbers_bytes_per_token"), {"numbers": kvlib.grading.numbers})
    out = capsys.readouterr().out
    assert f"{n.layers} layers" in out and f"{n.kv_heads * n.group} attention" in out
    assert math.isclose(expected("alice")["bytes_per_token"], RIGHT["bytes_per_token"](n))
