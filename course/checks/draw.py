"""Per-student numbers: each student's copy of a challenge draws its own values.

``numbers(challenge, **choices)`` draws one value of each name's choices with a
generator seeded by the challenge and the student id (:func:`student_id`).
The prompt cell and the hidden test make the same call, so the test
recomputes the right value (and the named wrong ones) for the student being
graded, and two students cannot share answers. The grader binds the student
it grades with :func:`grading_student` (in its own process) and passes the id
to the student's kernel as ``$KVLIB_STUDENT_ID``; on a class hub a learner's
kernel has ``$JUPYTERHUB_USER``; anyone else gets the ``"self-study"`` numbers.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_STUDENT", "STUDENT_ENV", "Numbers", "grading_student", "numbers", "student_id"]

# The student id a notebook's numbers are drawn for, outside a graded class.
DEFAULT_STUDENT = "self-study"
# Set by the grader in each student's kernel; a hub sets JUPYTERHUB_USER.
STUDENT_ENV = "KVLIB_STUDENT_ID"
_HUB_ENV = "JUPYTERHUB_USER"
# The student being graded, in the grader's own process (never read from a kernel).
_GRADED: contextvars.ContextVar[str | None] = contextvars.ContextVar("graded", default=None)


def student_id() -> str:
    """Whose numbers to draw: the student being graded, else ``$KVLIB_STUDENT_ID``,
    else ``$JUPYTERHUB_USER`` (a learner on the class hub), else ``"self-study"``."""
    graded = _GRADED.get()
    if graded is not None:
        return graded
    for key in (STUDENT_ENV, _HUB_ENV):
        value = os.environ.get(key, "").strip()
        if value:
            return value
    return DEFAULT_STUDENT


@contextlib.contextmanager
def grading_student(student: str) -> Iterator[None]:
    """Within this block, :func:`numbers` draws for ``student`` (the grader's side)."""
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"a student id must be a non-empty string, got {student!r}")
    token = _GRADED.set(student.strip())
    try:
        yield
    finally:
        _GRADED.reset(token)


class Numbers(Mapping[str, Any]):
    """One student's numbers for one challenge: read-only, by name or attribute."""

    __slots__ = ("_challenge", "_values")

    def __init__(self, challenge: str, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_challenge", challenge)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        values: dict[str, Any] = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"challenge {self._challenge!r} has no number {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a challenge's numbers are read-only")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"Numbers({inner})"


def numbers(challenge: str, /, **choices: Sequence[Any]) -> Numbers:
    """Draw one value from each name's ``choices`` for the current :func:`student_id`.

    ``numbers("02_paging/blocks", block_size=(8, 16, 32), context=range(1000, 9000))``
    always gives the same student the same numbers, and different students
    (almost always) different ones. Values that must agree with each other
    (query heads and the KV heads that divide them) are drawn together as
    one tuple: ``heads=((32, 8), (40, 8), (64, 4))``.
    """
    if not isinstance(challenge, str) or not challenge:
        raise ValueError("numbers() needs the challenge's name, e.g. '02_paging/blocks'")
    seed = hashlib.sha256(f"{challenge}\0{student_id()}".encode()).digest()
    rng = random.Random(seed)
    drawn = {}
    for name in sorted(choices):
        options = list(choices[name])
        if not options:
            raise ValueError(f"numbers({challenge!r}): {name} has no choices")
        drawn[name] = rng.choice(options)
    return Numbers(challenge, {name: drawn[name] for name in choices})
