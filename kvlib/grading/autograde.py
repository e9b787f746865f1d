"""nbgrader settings and the execute step that keeps grading out of students' hands.

``configure(c, course_root)`` is what ``nbgrader_config.py`` (and the
self-check's throwaway course) calls. It replaces nbgrader's ``Execute``
with ``VerifiedExecute``, which:

- runs answer and other cells in a sandboxed kernel (``kvlib.grading.sandbox``);
- never sends a test cell (``grade`` and not ``solution``) to the kernel:
  it reads the values the test needs out of the kernel and runs the test in
  this process (``kvlib.grading.hidden``), writing a pass (no output) or an error
  output whose message is the hint, without a traceback;
- on a cell timeout or a dead kernel, records the error on that cell,
  restarts the kernel and carries on, so one infinite loop costs one cell
  timeout and the rest of the notebook (and of the batch) is still graded.

Feedback drops hidden tests (``ClearHiddenTests``).
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbformat import NotebookNode
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    ClearHiddenTests,
    Execute,
    GetGrades,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)
from nbgrader.utils import is_grade, is_solution

# Imported now, before any student kernel starts: the checks this process
# runs are the copies on disk at start-up, whatever a kernel writes later.
import kvlib.grading
import kvlib.sizing
import kvlib.units
from kvlib.grading import DEFAULT_STUDENT, STUDENT_ENV, grading_student
from kvlib.grading.hidden import (
    Unreadable,
    Verdict,
    free_names,
    rebuild_value,
    run_hidden_test,
    snapshot_expression,
)
from kvlib.grading.sandbox import SandboxedKernelManager

__all__ = ["CELL_TIMEOUT_S", "VerifiedExecute", "configure", "is_test_cell"]

CELL_TIMEOUT_S = 30
_PRELOADED = (kvlib.grading, kvlib.sizing, kvlib.units)


def is_test_cell(cell: NotebookNode) -> bool:
    """An autograder test: a graded code cell that is not an answer cell."""
    return bool(cell.cell_type == "code" and is_grade(cell) and not is_solution(cell))


def _error_output(ename: str, message: str) -> NotebookNode:
    output: NotebookNode = NotebookNode(  # type: ignore[no-untyped-call]
        output_type="error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"]
    )
    return output


class VerifiedExecute(Execute):  # type: ignore[misc]
    """nbgrader's Execute, with test cells checked outside the student's kernel."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(**kwargs)
        self.student = DEFAULT_STUDENT

    def preprocess(
        self, nb: NotebookNode, resources: dict[str, Any], km: Any = None
    ) -> tuple[NotebookNode, dict[str, Any]]:
        """Grade one student's notebook: their kernel and their hidden tests draw the
        challenge numbers (``kvlib.grading.numbers``) for that student's id."""
        self.student = str(resources.get("nbgrader", {}).get("student") or DEFAULT_STUDENT)
        before = os.environ.get(STUDENT_ENV)
        os.environ[STUDENT_ENV] = self.student  # inherited by the kernel this run starts
        try:
            result: tuple[NotebookNode, dict[str, Any]] = super().preprocess(nb, resources, km)
            return result
        finally:
            if before is None:
                os.environ.pop(STUDENT_ENV, None)
            else:
                os.environ[STUDENT_ENV] = before

    def preprocess_cell(
        self, cell: NotebookNode, resources: dict[str, Any], index: int
    ) -> tuple[NotebookNode, dict[str, Any]]:
        if is_test_cell(cell):
            self._check_assign_resources(resources)
            verdict = self._verify(cell)
            cell.outputs = [] if verdict.passed else [_error_output(verdict.ename, verdict.message)]
            cell.execution_count = None
            return cell, self.resources
        try:
            result: tuple[NotebookNode, dict[str, Any]] = super().preprocess_cell(
                cell, resources, index
            )
            return result
        except (CellTimeoutError, DeadKernelError) as err:
            self.log.warning("cell %d: %s; restarting the kernel", index, type(err).__name__)
            self._restart_kernel()
            cause = (
                f"the cell did not finish within {self.timeout} s"
                if isinstance(err, CellTimeoutError)
                else "the kernel stopped while running this cell"
            )
            message = f"{cause}; the kernel was restarted, so names set before it are undefined."
            cell.outputs.append(_error_output(type(err).__name__, message))
            return cell, self.resources

    def _verify(self, cell: NotebookNode) -> Verdict:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "?")
        try:
            names = free_names(cell.source)
        except SyntaxError as err:
            self.log.error("test cell %s does not parse: %s", grade_id, err)
            return Verdict(False, "SyntaxError", "the hidden test could not check the answer.")
        values = self._read_values(names)
        with grading_student(self.student):
            verdict = run_hidden_test(cell.source, values)
        if verdict.detail:
            self.log.error("test cell %s failed to run: %s", grade_id, verdict.detail)
        self.log.info("test cell %s: %s", grade_id, "passed" if verdict.passed else verdict.ename)
        return verdict

    def _read_values(self, names: list[str]) -> dict[str, float | int | Unreadable]:
        """Each name's value in the kernel, read through IPython user expressions."""
        if not names:
            return {}
        assert self.kc is not None
        expressions = {name: snapshot_expression(name) for name in names}
        reply: dict[str, Any] | None
        try:
            msg_id = self.kc.execute(
                "", silent=True, store_history=False, user_expressions=expressions
            )
            reply = self.wait_for_reply(msg_id)
        except (CellTimeoutError, DeadKernelError):
            self._restart_kernel()
            reply = None
        content = (reply or {}).get("content", {})
        results = content.get("user_expressions") or {}
        if content.get("status") != "ok":
            self.log.warning("the kernel did not report values for %s", names)
        return {
            name: rebuild_value(results.get(name) or {"status": "error", "ename": "NoReply"})
            for name in names
        }

    def _restart_kernel(self) -> None:
        assert self.km is not None and self.kc is not None
        run_sync(self.km.restart_kernel)(now=True)
        run_sync(self.kc.wait_for_ready)(timeout=self.startup_timeout)


def configure(
    c: Any,
    course_root: str | os.PathLike[str],
    *,
    sandbox: str = "require",
    timeout_s: int = CELL_TIMEOUT_S,
) -> None:
    """Apply the course's nbgrader settings to the config object ``c``.

    ``sandbox`` is the kernel sandbox mode: ``require`` (grading an instructor
    batch), ``auto`` (self-check on a learner's machine) or ``off``.
    """
    root = os.path.abspath(course_root)
    c.CourseDirectory.root = root
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "exercises"
    c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__", ".DS_Store"]
    c.Execute.timeout = timeout_s
    c.Execute.interrupt_on_timeout = True
    c.Autograde.autograde_preprocessors = [
        VerifiedExecute,
        IgnorePattern,
        ClearMetadataPreprocessor,
        LimitOutput,
        SaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
    ]
    c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, ClearHiddenTests]
    c.SandboxedKernelManager.mode = sandbox
    c.SandboxedKernelManager.hidden_paths = [root]
    c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
