"""kvlib.grading.selfcheck (``kvlib grade``): one notebook graded in a throwaway course."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from grading_support import CHALLENGES, CLASSIC_WRONG, RELEASE, RIGHT, SOURCE, submission, write

from kvlib.grading.selfcheck import grade, main

pytestmark = pytest.mark.notebooks


def test_solution_full_marks() -> None:
    report = grade(SOURCE)
    assert (report.assignment, report.notebook) == ("01_kv_cache", "kv_cache")
    assert [c.name for c in report.challenges] == list(CHALLENGES)
    assert report.score == report.max_score == 6.0
    assert all(c.hint == "" for c in report.challenges)


def test_blank_release_scores_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(str(RELEASE), as_json=False) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(": 0 / 6 points")
    for name in CHALLENGES:
        assert f"{name} is not defined" in out


def test_json_with_classic_mistakes(tmp_path: Path) -> None:
    """Through the real command line: every classic mistake named, shape exactly as documented."""
    answers = {f"answer_{name}": wrong for name, (wrong, _) in CLASSIC_WRONG.items()}
    path = write(submission(answers), tmp_path / "my copy.ipynb")  # renamed: matched by cell ids
    proc = subprocess.run(
        [sys.executable, "-m", "kvlib", "grade", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(proc.stdout)
    assert set(report) == {"score", "max_score", "challenges"}
    assert report["score"] == 0.0 and report["max_score"] == 6.0
    assert type(report["score"]) is float and type(report["max_score"]) is float
    for challenge, name in zip(report["challenges"], CHALLENGES, strict=True):
        assert set(challenge) == {"name", "score", "max_score", "hint"}
        assert challenge["name"] == name
        assert (challenge["score"], challenge["max_score"]) == (0.0, 2.0)
        assert CLASSIC_WRONG[name][1] in challenge["hint"]


def test_partial_marks(tmp_path: Path) -> None:
    answers = {**RIGHT, "answer_seats": "seats = 25"}
    report = grade(write(submission(answers), tmp_path / "kv_cache.ipynb"))
    scores = {c.name: c.score for c in report.challenges}
    assert scores == {"bytes_per_token": 2.0, "seats": 0.0, "prefill_s": 2.0}
    assert report.score == 4.0


@pytest.mark.parametrize("kind", ["missing", "not json", "foreign notebook"])
def test_not_a_course_notebook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "x.ipynb"
    if kind == "not json":
        path.write_text("hello")
    elif kind == "foreign notebook":
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), path)
    assert main(str(path), as_json=True) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("kvlib grade: ")
