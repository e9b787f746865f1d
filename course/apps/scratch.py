"""Throwaway nbgrader course directories, driven through nbgrader's own CLI.

Used by ``scripts/release.py`` (generate ``exercises/``), ``kvlib grade``
(self-check one notebook) and the grading tests and benchmark. Each course is
a temporary directory with a copy of ``solutions/<assignment>`` and an
``nbgrader_config.py`` that applies ``course.apps.autograde.configure``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from course.sandbox.limits import Limits

__all__ = [
    "NbgraderError",
    "assignment_ids",
    "call_nbgrader",
    "course_root",
    "create_gradebook",
    "generate_assignment",
    "make_course",
    "nbgrader_api",
    "run_nbgrader",
    "scripts_on_path",
]

_CONFIG = '''"""Throwaway course: the same settings as the repository's nbgrader_config.py."""

from course.apps.autograde import configure
from course.sandbox.limits import Limits

c = get_config()  # noqa: F821
configure(
    c, {root!r}, sandbox={sandbox!r}, timeout_s={timeout_s!r}, limits={limits!r}, db_url={db_url!r}
)
'''


class NbgraderError(RuntimeError):
    """An nbgrader command failed; the message carries the end of its log."""


def course_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The course checkout: the nearest directory above ``start`` (or kvlib) with
    ``nbgrader_config.py`` and ``solutions/``."""
    here = Path(__file__).resolve().parent
    candidates = [Path(start).resolve()] if start is not None else [Path.cwd(), here]
    for base in candidates:
        for directory in (base, *base.parents):
            if (directory / "nbgrader_config.py").is_file() and (directory / "solutions").is_dir():
                return directory
    raise FileNotFoundError(
        "no course found: run from the course checkout (the folder with solutions/ and "
        "nbgrader_config.py)"
    )


def assignment_ids(root: Path) -> list[str]:
    """Assignments in ``root/solutions``: folders holding at least one notebook."""
    return sorted(
        p.name for p in (root / "solutions").iterdir() if p.is_dir() and any(p.glob("*.ipynb"))
    )


def make_course(
    directory: Path,
    root: Path,
    assignments: Iterable[str],
    *,
    sandbox: str = "require",
    timeout_s: int = 30,
    limits: Limits | None = None,
    db_url: str | None = None,
) -> Path:
    """Fill ``directory`` with a course holding copies of ``assignments`` from ``root``.

    Its gradebook is ``db_url``, else SQLite in ``directory`` (never the class's
    ``$KVLIB_GRADEBOOK_URL``: a throwaway course must not write to a real gradebook).
    """
    directory.mkdir(parents=True, exist_ok=True)
    for assignment in assignments:
        shutil.copytree(
            root / "solutions" / assignment,
            directory / "solutions" / assignment,
            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
        )
    root_dir = directory.resolve()
    config = _CONFIG.format(
        root=str(root_dir),
        sandbox=sandbox,
        timeout_s=timeout_s,
        limits=limits or Limits(),
        db_url=db_url or f"sqlite:///{root_dir / 'gradebook.db'}",
    )
    (directory / "nbgrader_config.py").write_text(config)
    if db_url is None and not (root_dir / "gradebook.db").exists():
        create_gradebook(root_dir / "gradebook.db")
    return directory


def create_gradebook(path: Path) -> None:
    """An empty SQLite gradebook at ``path``, as nbgrader's ``Gradebook`` makes one: its
    tables, and ``alembic_version`` holding the head of nbgrader's migrations.

    nbgrader finds that head by running ``alembic heads`` in a subprocess for every new
    gradebook (2-3 s, longer than grading a notebook: each "Check your work" paid it).
    alembic's script directory gives the same head in this process in about 0.1 s.
    """
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader.api import Base
    from nbgrader.dbutil import ALEMBIC_DIR
    from sqlalchemy import create_engine, text

    settings = Config()
    settings.set_main_option("script_location", ALEMBIC_DIR)
    head = ScriptDirectory.from_config(settings).get_current_head()
    engine = create_engine(f"sqlite:///{path}")
    try:
        Base.metadata.create_all(bind=engine)
        with engine.begin() as db:
            db.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
            db.execute(text("INSERT INTO alembic_version (version_num) VALUES (:head)"),
                       {"head": head})
    finally:
        engine.dispose()


@contextlib.contextmanager
def scripts_on_path() -> Iterator[None]:
    """This interpreter's scripts folder first on PATH (nbgrader runs ``alembic`` from it)."""
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), before])
    try:
        yield
    finally:
        os.environ["PATH"] = before


def nbgrader_api(course: Path) -> Any:
    """nbgrader's Python API on ``course`` (with its ``nbgrader_config.py``), in this process:
    nbgrader is imported once, not once per command."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    return NbGraderAPI(config=config)


def call_nbgrader(course: Path, command: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``NbGraderAPI.<command>(*args, **kwargs)`` on ``course``, in this process
    (:func:`nbgrader_api`): a caller that runs several commands, or several courses,
    imports nbgrader once instead of starting it for each. Returns nbgrader's result
    (``success``, ``log``); raises :class:`NbgraderError` with the end of its error."""
    here = os.getcwd()  # nbgrader changes into the course folder
    try:
        with scripts_on_path(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as run_nbgrader's PYTHONWARNINGS=ignore
            result: dict[str, Any] = getattr(nbgrader_api(course), command)(*args, **kwargs)
    finally:
        os.chdir(here)
    if not result["success"]:
        tail = "\n".join(str(result.get("error") or result.get("log")).strip().splitlines()[-15:])
        raise NbgraderError(f"nbgrader {command} failed:\n{tail}")
    return result


def generate_assignment(course: Path, assignment: str) -> None:
    """``nbgrader generate_assignment ASSIGNMENT --force`` in ``course``, in this process
    (:func:`call_nbgrader`)."""
    call_nbgrader(course, "generate_assignment", assignment, force=True, create=True)


def run_nbgrader(course: Path, *args: str, timeout_s: float = 1800) -> str:
    """Run ``python -m nbgrader ARGS`` in ``course``; return its log, raise on failure."""
    # nbgrader runs the ``alembic`` script from PATH to set up its gradebook.
    bin_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    env = dict(os.environ, PYTHONWARNINGS="ignore", PATH=path)
    env.pop("JUPYTER_CONFIG_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        tail = "\n".join(log.strip().splitlines()[-15:])
        raise NbgraderError(f"nbgrader {' '.join(args)} failed ({proc.returncode}):\n{tail}")
    return log
