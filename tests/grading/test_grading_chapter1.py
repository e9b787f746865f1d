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

import course.checks
from course.checks import Numbers, grading_student, plausible
from course.notebooks.hidden import free_names, run_hidden_test

GiB = 2**30

Mistakes = list[tuple[Callable[[Any], float | None], str]]
RIGHT: dict[str, Callable[[Any], float]] = {
    "bytes_per_token": lambda n: 2 * n.layers * n.kv_heads * n.head_dim,
    "seats": lambda n: n.free_gib * GiB // (n.context_tokens * n.kv_bytes_per_token),
    "prefill_s": lambda n: 2 * n.params_billion * 1e9 * n.prompt_tokens / (n.tflop_per_s * 1e12),
    "conversation_bytes": lambda n: _conversation(n),
    "batch_tokens_per_s": lambda n: _batch(n),
    "cache_tokens": lambda n: _cache_tokens(n),
}


def _conversation(
    n: Any, *, head_dim: int | None = None, heads: str = "kv", width: int = 2, window: int = -1,
    full_tokens: str = "T", sliding_tokens: str = "W",
) -> int:
    """One conversation's cache of the config challenge, with the slips a learner makes:
    another head width or head count, ``width`` bytes per element, a window of
    ``W + window`` tokens, and the tokens each kind of layer is counted at."""
    query_heads, kv_heads, real_head_dim, _ = n.attention
    full = n.layers // n.full_every
    held = {"T": n.context_tokens, "W": min(n.context_tokens, n.window + window)}
    per = 2 * (kv_heads if heads == "kv" else query_heads) * (head_dim or real_head_dim) * width
    return per * (full * held[full_tokens] + (n.layers - full) * held[sliding_tokens])


def _batch(n: Any, *, shared: bool = True, bandwidth: float = 1e12, cache_of: int = 0,
           weight_bytes: int = 0, kv: bool = True, weights: bool = True) -> float:
    """The batch's decode bound, ``B x BW / (P b + B T kv)``, with the slips a learner makes."""
    b = weight_bytes or n.bytes_per_weight
    weight_read = (n.params_billion * 1e9 * b if weights else 0) * (1 if shared else n.batch)
    cache_read = (cache_of or n.batch) * n.context_tokens * n.kv_bytes_per_token if kv else 0
    return n.batch * n.tb_per_s * bandwidth / (weight_read + cache_read)


def _cache_tokens(n: Any, *, split_weights: bool = True, split_cache: bool = True,
                  usable: bool = True, mib: int = 2**20, billion: int = 10**9) -> int:
    """Tokens a tensor-parallel group caches, ``(u M - P b / n) // (kv / n)``, with the
    slips a learner makes."""
    params_billion, bytes_per_weight, gpus = n.model
    budget = int((n.utilization if usable else 1) * n.gpu_mib * mib)
    weights = params_billion * billion * bytes_per_weight // (gpus if split_weights else 1)
    return (budget - weights) // (n.kv_bytes_per_token // (gpus if split_cache else 1))


def _swapped(n: Any) -> int | None:
    """Full and sliding layers swapped: the same bytes when there are as many of each."""
    full = n.layers // n.full_every
    if 2 * full == n.layers:
        return None
    return _conversation(n, full_tokens="W", sliding_tokens="T")
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
MISTAKES["conversation_bytes"] = [
    (lambda n: _conversation(n, sliding_tokens="T"), "every layer at the full"),
    (lambda n: _conversation(n, window=0), "the window includes the current token"),
    (lambda n: _conversation(n, full_tokens="W"), "capped every layer"),
    (_swapped, "swapped the layer kinds"),
    (lambda n: _conversation(n, head_dim=n.attention[3] // n.attention[0]), "as the head width"),
    (lambda n: _conversation(n, heads="query"), "attention heads"),
    (lambda n: _conversation(n) // 2, "factor 2"),
    (lambda n: _conversation(n, width=4), "4 bytes per element"),
    (lambda n: _conversation(n) / GiB, "GiB"),
]
MISTAKES["batch_tokens_per_s"] = [
    (lambda n: _batch(n, shared=False), "once per conversation"),
    (lambda n: _batch(n) / n.batch, "one conversation's speed"),
    (lambda n: _batch(n, cache_of=1), "one conversation's cache"),
    (lambda n: _batch(n, kv=False), "left out the KV cache"),
    (lambda n: _batch(n, weights=False), "left out the weights"),
    (lambda n: _batch(n, weight_bytes=3 - n.bytes_per_weight), "byte(s) per weight"),
    (lambda n: _batch(n, bandwidth=2**40), "dec"),
    (lambda n: n.batch / _batch(n), "seconds per step"),
]
MISTAKES["cache_tokens"] = [
    (lambda n: _cache_tokens(n, split_weights=False), "all of them"),
    (lambda n: _cache_tokens(n, split_cache=False), "the whole token"),
    (lambda n: _cache_tokens(n, split_weights=False, split_cache=False), "neither is whole"),
    (lambda n: _cache_tokens(n, usable=False), "you used all of it"),
    (lambda n: _cache_tokens(n, mib=10**6), "not 10^6"),
    (lambda n: _cache_tokens(n, billion=2**30), "not 2^30"),
    (lambda n: n.model[2] * _cache_tokens(n), "times as many"),
]
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
    """``course.checks.numbers`` returns the Numbers put in the yielded list."""
    box: list[Numbers] = []
    with monkeypatch.context() as m:
        m.setattr(course.checks, "numbers", lambda *args, **kwargs: box[0])
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
                                            if isinstance(v, int)}
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
                             "MiB": 2**20})
            for wrong_of, phrase in MISTAKES[challenge]:
                wrong = wrong_of(n)
                if wrong is None:  # the slip gives the right value for these numbers
                    continue
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
        exec(cell_source("numbers_bytes_per_token"), {"numbers": course.checks.numbers})
    out = capsys.readouterr().out
    assert f"{n.layers} layers" in out and f"{n.kv_heads * n.group} attention" in out
    assert math.isclose(expected("alice")["bytes_per_token"], RIGHT["bytes_per_token"](n))
