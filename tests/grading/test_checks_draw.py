"""course.checks.draw: each student's own numbers, the same in the prompt and the hidden test."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.checks import (
    DEFAULT_STUDENT,
    STUDENT_ENV,
    Numbers,
    grading_student,
    numbers,
    student_id,
)

CHOICES = {"layers": range(16, 96), "heads": ((32, 8), (40, 8), (64, 4)), "dim": (64, 128)}


@pytest.fixture(autouse=True)
def no_student_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STUDENT_ENV, raising=False)
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)


@given(st.text(min_size=1, max_size=40).filter(str.strip))
def test_same_student_same_numbers(student: str) -> None:
    with grading_student(student):
        first = numbers("ch/x", **CHOICES)
        second = numbers("ch/x", **CHOICES)
    assert first == second
    assert first.heads in CHOICES["heads"] and first.layers in CHOICES["layers"]


def test_students_get_different_numbers() -> None:
    """Over 500 students, no draw of 480 combinations is shared by more than a few."""
    draws = []
    for k in range(500):
        with grading_student(f"student{k:03d}"):
            draws.append(tuple(numbers("ch/x", **CHOICES).values()))
    counts = collections.Counter(draws)
    assert len(counts) > 300  # random draws of 500 from 480 cover about 300
    assert max(counts.values()) <= 6


def test_challenge_name_changes_the_draw() -> None:
    with grading_student("alice"):
        a = [tuple(numbers(f"ch/{k}", layers=range(1000)).values()) for k in range(20)]
    assert len(set(a)) > 15


def test_grader_binding_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grader binds the graded student in its own process; a kernel's env cannot change it."""
    monkeypatch.setenv(STUDENT_ENV, "mallory")
    assert student_id() == "mallory"
    with grading_student("alice"):
        assert student_id() == "alice"
    assert student_id() == "mallory"


def test_hub_user_then_self_study(monkeypatch: pytest.MonkeyPatch) -> None:
    assert student_id() == DEFAULT_STUDENT
    monkeypatch.setenv("JUPYTERHUB_USER", "bob")
    assert student_id() == "bob"
    monkeypatch.setenv(STUDENT_ENV, "carol")
    assert student_id() == "carol"


def test_a_kernel_draws_what_the_grader_draws() -> None:
    """The student's kernel (a separate process, id from the environment) and the grader's
    binding give the same numbers."""
    code = "from course.checks import numbers; print(dict(numbers('ch/x', layers=range(99))))"
    env = {"PATH": "/usr/bin:/bin", STUDENT_ENV: "alice"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    with grading_student("alice"):
        assert out.stdout.strip() == str(dict(numbers("ch/x", layers=range(99))))


class TestNumbers:
    def test_read_only_by_name_and_attribute(self) -> None:
        n = Numbers("ch/x", {"a": 1})
        assert n.a == n["a"] == 1 and len(n) == 1 and list(n) == ["a"]
        with pytest.raises(AttributeError, match="read-only"):
            n.a = 2
        with pytest.raises(AttributeError, match="no number 'b'"):
            _ = n.b

    def test_order_of_names_kept(self) -> None:
        with grading_student("x"):
            assert list(numbers("ch/x", z=(1,), a=(2,))) == ["z", "a"]

    @pytest.mark.parametrize(
        ("challenge", "choices", "message"),
        [("", {"a": (1,)}, "challenge"), ("ch/x", {"a": ()}, "no choices")],
    )
    def test_bad_calls(
        self, challenge: str, choices: dict[str, tuple[int, ...]], message: str
    ) -> None:
        with pytest.raises(ValueError, match=message):
            numbers(challenge, **choices)

    def test_blank_student_refused(self) -> None:
        with pytest.raises(ValueError, match="student id"), grading_student("  "):
            pass
