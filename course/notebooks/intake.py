"""How autograde reads a submission: defensively, repaired, and flagged.

``RepairingExporter`` is nbgrader's ``NotebookExporter`` with its own
``from_filename`` (``configure`` installs it as ``Autograde.exporter_class``,
so plain ``nbgrader autograde`` and ``make grade`` read submissions alike).
In nbgrader's first pass over a submission ("sanitizing") it:

- reads the file as a stream, its stored outputs dropped, and repairs it
  against the released notebook (:func:`course.notebooks.repair.repair_notebook`),
  recording what it did as flags in the notebook's metadata, replacing any
  flags the file carried;
- removes, from the graded copy of the submission folder, every file the
  student submitted as a symbolic link or special file (nbgrader copies the
  link's target, which could be any file the grader can read), and flags it;
  ``make grade`` moves such entries aside before nbgrader sees them
  (:func:`course.notebooks.repair.set_aside`), and they are flagged the same way.

In the second pass it reads the sanitized notebook it wrote, flags intact.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
from nbconvert.exporters import NotebookExporter
from nbformat import NotebookNode
from nbgrader.nbgraderformat import common as _format
from nbgrader.preprocessors import CheckCellMetadata as _NbgraderCheck

from course.notebooks.flags import add_flag
from course.notebooks.repair import SET_ASIDE, repair_notebook, unsafe_files

__all__ = ["CheckCellMetadata", "RepairingExporter", "release_notebook"]


def release_notebook(coursedir: Any, assignment: str, notebook: str) -> NotebookNode:
    """The notebook students received (``exercises/``), else its source (``solutions/``)."""
    for directory in (coursedir.release_directory, coursedir.source_directory):
        folder = coursedir.format_path(directory, ".", assignment)
        path = os.path.join(folder, f"{notebook}.ipynb")
        if os.path.isfile(path):
            nb: NotebookNode = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
            return nb
    raise FileNotFoundError(f"no released or source notebook {assignment}/{notebook}.ipynb")


class RepairingExporter(NotebookExporter):
    """A NotebookExporter that repairs submissions as it reads them (see the module)."""

    def from_filename(
        self, filename: str, resources: dict[str, Any] | None = None, **kw: Any
    ) -> tuple[NotebookNode, dict[str, Any]]:
        resources = resources if resources is not None else {}
        path = Path(filename)
        meta = resources.setdefault("metadata", {}) or {}
        resources["metadata"] = meta
        meta["name"], meta["path"] = path.stem, str(path.parent)
        modified = datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.UTC)
        meta["modified_date"] = modified.strftime("%B %-d, %Y")
        converter: Any = self.parent
        if not getattr(converter, "_sanitizing", False):
            with open(path, encoding="utf-8") as f:
                return self.from_file(f, resources=resources, **kw)
        info = resources.get("nbgrader", {})
        release = release_notebook(converter.coursedir, info["assignment"], info["notebook"])
        with open(path, "rb") as submitted:  # read as a stream: never held whole in memory
            nb, flags = repair_notebook(submitted, release)
        for flag in flags:
            add_flag(nb, flag)
        self._drop_unsafe_files(converter, info, nb)
        result: tuple[NotebookNode, dict[str, Any]] = self.from_notebook_node(  # type: ignore[no-untyped-call]
            nb, resources=resources, **kw
        )
        return result

    def _drop_unsafe_files(self, converter: Any, info: dict[str, Any], nb: NotebookNode) -> None:
        coursedir = converter.coursedir
        submitted = Path(coursedir.format_path(
            coursedir.submitted_directory, info["student"], info["assignment"]
        ))
        graded = Path(coursedir.format_path(
            coursedir.autograded_directory, info["student"], info["assignment"]
        ))
        source = Path(coursedir.format_path(coursedir.source_directory, ".", info["assignment"]))
        aside = submitted.parent / SET_ASIDE / submitted.name  # where make grade moved them
        for relative in sorted(set(unsafe_files(submitted)) | set(unsafe_files(aside))):
            copy = graded / relative
            if (source / relative).exists():
                continue  # nbgrader replaced it with the assignment's own file
            if copy.is_file() or copy.is_symlink():
                copy.unlink()
            add_flag(nb, f"{relative} is a link or special file: left out of grading")


@functools.cache
def _validator(schema_json: str) -> Any:
    import jsonschema

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


class _CachedJsonschema:
    """``jsonschema.validate`` with the schema checked and compiled once, not per cell."""

    def validate(self, instance: Any, schema: dict[str, Any]) -> None:
        import jsonschema

        validator = _validator(json.dumps(schema, sort_keys=True))
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
        if error is not None:
            raise error


@contextlib.contextmanager
def _cached_schema_checks() -> Iterator[None]:
    original = _format.jsonschema
    _format.jsonschema = _CachedJsonschema()
    try:
        yield
    finally:
        _format.jsonschema = original


class CheckCellMetadata(_NbgraderCheck):  # type: ignore[misc]
    """nbgrader's metadata check, same rules, without rebuilding the schema for every cell
    (that rebuilding was about half of the grader's own time per submission)."""

    def preprocess(
        self, nb: NotebookNode, resources: dict[str, Any]
    ) -> tuple[NotebookNode, dict[str, Any]]:
        with _cached_schema_checks():
            result: tuple[NotebookNode, dict[str, Any]] = super().preprocess(nb, resources)
        return result
