"""course.apps.selfcheck (``kvlib grade`` and the notebook's last cell), and ``make lab``."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from grading_support import (
    CHALLENGES,
    CLASSIC_WRONG,
    RIGHT,
    ROOT,
    SOURCE,
    TOTAL,
    expected,
    grade_id,
    read,
    submission,
    write,
)

from course.apps.scratch import create_gradebook, scripts_on_path
from course.apps.selfcheck import MISSING_GRADER, check_notebook, format_report, grade, main
from course.checks import STUDENT_ENV

pytestmark = pytest.mark.notebooks


@pytest.fixture(autouse=True)
def learner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A learner studying alone: the "self-study" numbers."""
    monkeypatch.delenv(STUDENT_ENV, raising=False)
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)


def test_solution_full_marks() -> None:
    report = grade(SOURCE)
    assert (report.assignment, report.notebook) == ("01_kv_cache", "kv_cache")
    assert [c.name for c in report.challenges] == list(CHALLENGES)
    assert report.score == report.max_score == TOTAL
    assert all(c.hint == "" for c in report.challenges)


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
    assert report["score"] == 0.0 and report["max_score"] == TOTAL
    assert type(report["score"]) is float and type(report["max_score"]) is float
    for challenge, name in zip(report["challenges"], CHALLENGES, strict=True):
        assert set(challenge) == {"name", "score", "max_score", "hint"}
        assert challenge["name"] == name
        assert (challenge["score"], challenge["max_score"]) == (0.0, 2.0)
        assert CLASSIC_WRONG[name][1] in challenge["hint"]


def test_graded_on_the_learners_own_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a class hub the learner's numbers follow their user name, in the notebook and in
    the check: answers on ada's numbers are right for ada (they differ from self-study's)."""
    monkeypatch.setenv("JUPYTERHUB_USER", "ada")
    own = expected("ada")
    assert all(own[c] != expected("self-study")[c] for c in CHALLENGES)
    literal = {f"answer_{c}": f"{c} = {own[c]!r}" for c in CHALLENGES}
    assert grade(write(submission(literal), tmp_path / "kv_cache.ipynb")).score == TOTAL


def test_last_cell_prints_the_same_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The notebook's own last cell (run here as Jupyter runs it, in the notebook's folder)."""
    answers = {**RIGHT, "answer_seats": "seats = 25"}
    path = write(submission(answers), tmp_path / "kv_cache.ipynb")
    cell = read(path).cells[-1]
    assert grade_id(cell) == "self_check" and "skip-execution" in cell.metadata["tags"]
    os.utime(path, (time.time() - 5, time.time() - 5))
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(cell.source, {"__name__": "__main__"})
    finally:
        os.chdir(here)
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("Grading kv_cache.ipynb as saved at ")
    report = format_report(grade(path))
    assert printed.rstrip().endswith(report)
    assert re.search(r"seats +0 / 2  missed", report) and report.splitlines()[0].endswith(
        f": {TOTAL - 2:g} / {TOTAL:g} points"
    )


def test_last_cell_without_the_grader_installed(capsys: pytest.CaptureFixture[str]) -> None:
    code = (
        "import sys; sys.path = [p for p in sys.path if 'site-packages' not in p]; "
        f"sys.path.insert(0, {str(ROOT)!r}); "
        "from course.apps.selfcheck import check_notebook; check_notebook('x.ipynb')"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == f"kvlib grade: {MISSING_GRADER}" and out.returncode == 0


def test_command_without_the_grader_installed(tmp_path: Path) -> None:
    """kvlib installed alone (no nbgrader): one line naming the extra, no traceback."""
    code = (
        "import sys; sys.path = [p for p in sys.path if 'site-packages' not in p]; "
        f"sys.path.insert(0, {str(ROOT)!r}); "
        "from course.apps.grade_command import main; sys.exit(main(['x.ipynb']))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"kvlib grade: error: {MISSING_GRADER}"]
    assert "pip install 'kvlib[grading]'" in out.stderr


def test_check_notebook_names_a_notebook_it_cannot_find(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    check_notebook()
    assert "cannot tell which notebook" in capsys.readouterr().out
    check_notebook("unsaved.ipynb")
    assert capsys.readouterr().out.splitlines() == [
        "kvlib grade: no notebook is saved at unsaved.ipynb; save it, or name the saved one"
    ]


@pytest.mark.parametrize("kind", ["missing", "not json", "foreign notebook", "bad student id"])
def test_not_gradable(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    path = tmp_path / "x.ipynb"
    if kind == "not json":
        path.write_text("hello")
    elif kind == "foreign notebook":
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")]), path)
    elif kind == "bad student id":
        monkeypatch.setenv(STUDENT_ENV, "../../etc")
        path = write(submission({}), path)
    assert main(str(path), as_json=True) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("kvlib grade: ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_make_lab_is_offline(tmp_path: Path) -> None:
    """The command `make lab` runs, started headless: no news prompt, no update check."""
    # Run under `make test`, an inner make would print "Entering/Leaving directory".
    quiet = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", "-o", ".venv/.installed", "lab"],
        cwd=ROOT, env=quiet, capture_output=True, text=True, check=True,
    )
    command = dry.stdout.replace("\\\n", " ").strip().splitlines()[-1]
    assert command.startswith(".venv/bin/jupyter lab exercises")
    port = _free_port()
    extra = f" --no-browser --port={port} --ServerApp.token=t --ServerApp.root_dir={ROOT}"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path), JUPYTER_RUNTIME_DIR=str(tmp_path))
    server = subprocess.Popen(shlex.split(command + extra), cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        page = ""
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token=t") as r:
                    page = r.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page,
                                      re.S).group(1))
        assert config["news"] == {"disabled": True}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab/api/update?token=t") as r:
            assert json.loads(r.read())["notification"] is None
        assert config["extensionManager"]["name"] == "read-only"  # no PyPI index queries
    finally:
        server.terminate()
        server.wait(timeout=30)


def _schema(path: Path) -> tuple[list[tuple[str, str]], list[tuple[str]]]:
    with sqlite3.connect(path) as db:
        tables = db.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
        version = db.execute("SELECT version_num FROM alembic_version").fetchall()
    return tables, version


def test_a_new_gradebook_is_the_one_nbgrader_makes(tmp_path: Path) -> None:
    """The empty gradebook a self-check starts from (made in-process, without nbgrader's
    ``alembic heads`` subprocess) has nbgrader's own tables and alembic stamp, and
    nbgrader opens it as one of its own."""
    from nbgrader.api import Gradebook

    ours, theirs = tmp_path / "ours.db", tmp_path / "theirs.db"
    create_gradebook(ours)
    with scripts_on_path(), Gradebook(f"sqlite:///{theirs}"):
        pass
    assert _schema(ours) == _schema(theirs)
    assert len(_schema(ours)[0]) > 10 and len(_schema(ours)[1]) == 1
    with Gradebook(f"sqlite:///{ours}") as gb:
        gb.add_student("s1")
        assert [s.id for s in gb.students] == ["s1"]
