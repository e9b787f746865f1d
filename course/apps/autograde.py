"""The course's nbgrader settings, shared by ``nbgrader_config.py``, ``make grade``,
``kvlib grade`` and the release script.

``configure(c, course_root)`` sets the course layout and replaces nbgrader's
grading path with this package's:

- submissions are read and repaired by ``RepairingExporter``
  (:mod:`course.notebooks.intake`): one malformed notebook never stops a batch;
- cells run in a sandboxed, resource-limited kernel and hidden tests run in
  the grader's process (``VerifiedExecute``, :mod:`course.notebooks.execute`);
- what was repaired or could not run is flagged: in the gradebook, the
  feedback (which shows no hidden test) and ``grades.csv``
  (:mod:`course.notebooks.flags`);
- the gradebook is SQLite in the course folder, or the database named by
  ``$KVLIB_GRADEBOOK_URL`` (e.g. ``postgresql://grader@db.example/course``).
"""

from __future__ import annotations

import os
from typing import Any

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties,
    ClearHiddenTests,
    ClearOutput,
    DeduplicateIds,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
)

from course.notebooks.execute import VerifiedExecute, is_test_cell
from course.notebooks.flags import FlaggedCsvExport, FlagsInFeedback, RecordFlags
from course.notebooks.intake import CheckCellMetadata, RepairingExporter
from course.sandbox.limits import CELL_TIMEOUT_S, Limits

__all__ = [
    "CELL_TIMEOUT_S",
    "COURSE_ID",
    "GRADEBOOK_ENV",
    "VerifiedExecute",
    "configure",
    "is_test_cell",
]

GRADEBOOK_ENV = "KVLIB_GRADEBOOK_URL"
# nbgrader's default course id is "", for which it never creates the course row its
# assignments refer to: PostgreSQL enforces that foreign key (SQLite does not).
COURSE_ID = "kv-cache-by-the-numbers"


def configure(
    c: Any,
    course_root: str | os.PathLike[str],
    *,
    sandbox: str = "require",
    timeout_s: int = CELL_TIMEOUT_S,
    limits: Limits | None = None,
    db_url: str | None = None,
) -> None:
    """Apply the course's nbgrader settings to the config object ``c``.

    ``sandbox`` is the kernel sandbox mode: ``require`` (grading a class),
    ``auto`` (self-check on a learner's machine) or ``off`` (release only).
    ``timeout_s`` is the per-cell timeout, ``limits`` the kernel's resource
    limits (default :class:`~course.sandbox.limits.Limits`), ``db_url`` the
    gradebook (default ``$KVLIB_GRADEBOOK_URL``, else ``gradebook.db`` here).
    """
    root = os.path.abspath(course_root)
    limits = limits or Limits()
    c.CourseDirectory.root = root
    c.CourseDirectory.course_id = COURSE_ID  # set it again after configure() for a hub's name
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "exercises"
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", ".DS_Store"]
    db_url = db_url or os.environ.get(GRADEBOOK_ENV)
    if db_url:
        c.CourseDirectory.db_url = db_url
    c.Autograde.exporter_class = RepairingExporter
    c.Autograde.sanitize_preprocessors = [
        ClearOutput,
        DeduplicateIds,
        OverwriteKernelspec,
        OverwriteCells,
        CheckCellMetadata,
    ]
    c.Autograde.autograde_preprocessors = [
        VerifiedExecute,
        IgnorePattern,
        ClearMetadataPreprocessor,
        LimitOutput,
        SaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
        RecordFlags,
    ]
    c.ClearMetadataPreprocessor.preserve_nb_metadata_mask = [("language_info", "name"), ("kvlib",)]
    c.Execute.timeout = timeout_s
    c.Execute.interrupt_on_timeout = True
    c.Execute.shutdown_kernel = "immediate"  # nothing in a graded kernel needs a clean exit
    c.VerifiedExecute.max_output_bytes = limits.output_bytes
    c.VerifiedExecute.notebook_timeout = limits.notebook_s
    c.GenerateFeedback.preprocessors = [
        GetGrades,
        CSSHTMLHeaderPreprocessor,
        ClearHiddenTests,
        FlagsInFeedback,
    ]
    c.ExportApp.plugin_class = FlaggedCsvExport
    km = c.SandboxedKernelManager
    km.mode = sandbox
    km.course_root = root
    km.source_directory = "solutions"
    km.memory_bytes = limits.memory_bytes
    km.max_processes = limits.processes
    km.file_bytes = limits.file_bytes
    km.scratch_bytes = limits.scratch_bytes
    km.cpu_s = limits.notebook_s
    # An answer cell opens with ``name = ...  # replace ... with your answer`` outside the
    # solution region, so a released notebook runs from the top to the end (Run All stops
    # nowhere) and an unanswered challenge scores nothing, said by its check.
    c.ClearSolutions.code_stub = {"python": ""}
