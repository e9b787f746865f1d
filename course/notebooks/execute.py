"""nbgrader's execute step, hardened: hidden tests outside the kernel, limits on the rest.

``VerifiedExecute`` replaces nbgrader's ``Execute`` (``configure`` installs it):

- answer and other cells run in the student's sandboxed kernel
  (:mod:`course.sandbox.kernel`), which draws the challenge numbers for the
  student being graded (``KVLIB_STUDENT_ID``);
- a test cell (``grade`` and not ``solution``) never runs there: the values it
  reads are taken out of the kernel and the test runs in this process
  (:mod:`course.notebooks.hidden`), bound to the same student;
- a cell's output is kept up to ``max_output_bytes`` characters; the rest is
  dropped with a note and an ``output truncated`` flag, and the cell runs on:
  a verbose but honest cell keeps its points (its error output, if it raises,
  is kept too);
- a cell that times out, kills its kernel or hits a resource limit gets an
  error output saying so; the kernel is restarted and the assignment's own
  locked set-up cells before it are run again, so one bad cell costs that
  cell and the names it would have set;
- the whole notebook gets ``notebook_timeout`` seconds: cells after that are
  not run and their tests fail, saying why;
- every such event is also recorded as a flag (:mod:`course.notebooks.flags`)
  for the export and the feedback.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from nbgrader.utils import is_grade, is_locked, is_solution
from traitlets import Bool, Float, Integer

# Imported now, before any student kernel starts: the checks this process runs
# are the copies on disk at start-up, whatever a kernel writes later.
import course.checks
import kvlib.sizing
import kvlib.units
from course.checks import DEFAULT_STUDENT, STUDENT_ENV, grading_student
from course.notebooks.flags import add_flag
from course.notebooks.hidden import (
    Unreadable,
    Verdict,
    free_names,
    rebuild_value,
    run_hidden_test,
    snapshot_expression,
)
from course.sandbox.kernel import SandboxedKernelManager
from course.sandbox.limits import Limits

__all__ = [
    "OUTPUT_TRUNCATED",
    "SKIPPED_IDS",
    "VerifiedExecute",
    "apply_carriage_returns",
    "error_output",
    "is_test_cell",
]

_PRELOADED = (course.checks, kvlib.sizing, kvlib.units)
# Cells the grader never runs, whatever their tags say (the self-check cell would
# start a grader inside the kernel).
SKIPPED_IDS = frozenset({"self_check"})
_OUTPUT_MESSAGES = frozenset(
    {"stream", "display_data", "execute_result", "update_display_data", "error", "clear_output"}
)
_DEFAULTS = Limits()
OUTPUT_TRUNCATED = "output truncated"
# A cell's own error (its traceback) is kept past the output cap when it is this short.
_ERROR_KEPT_CHARS = 64 * 1024
# Characters counted for a message's envelope, however short its content.
_MESSAGE_CHARS = 64


def is_test_cell(cell: NotebookNode) -> bool:
    """An autograder test: a graded code cell that is not an answer cell."""
    return bool(cell.cell_type == "code" and is_grade(cell) and not is_solution(cell))


def error_output(ename: str, message: str) -> NotebookNode:
    """An error output showing ``message`` without a traceback."""
    output: NotebookNode = NotebookNode(  # type: ignore[no-untyped-call]
        output_type="error", ename=ename, evalue=message, traceback=[f"{ename}: {message}"]
    )
    return output


def _size(value: object) -> int:
    """Characters in a message's content, at least 64 per message (spam counts too)."""
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(k) + _size(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(_size(v) for v in value)
    return 8


def apply_carriage_returns(text: str) -> str:
    """What a terminal shows of ``text``: on each line, only what follows its last carriage
    return (one not ending the line). Linear in the text's length."""
    if "\r" not in text:
        return text
    lines = text.split("\n")
    for k, line in enumerate(lines):
        last = line[:-1].rfind("\r")  # a return that is the last character overwrites nothing
        if last >= 0:
            lines[k] = line[last + 1 :]
    return "\n".join(lines)


def _coalesce(cell: NotebookNode) -> None:
    """nbclient's ``coalesce_streams``: one output per stream name, at the place of its first
    part, carriage returns applied, stdout before a stderr that directly precedes it."""
    merged: list[NotebookNode] = []
    streams: dict[str, NotebookNode] = {}
    for output in cell.get("outputs", []):
        if output.get("output_type") != "stream":
            merged.append(output)
        elif output.get("name") in streams:
            streams[output["name"]]["text"] += output.get("text", "")
        else:
            merged.append(output)
            streams[output.get("name")] = output
    for output in streams.values():
        output["text"] = apply_carriage_returns(output.get("text", ""))
    for k in range(len(merged) - 1):
        first, second = merged[k], merged[k + 1]
        if (first.get("output_type"), first.get("name")) == ("stream", "stderr") and (
            second.get("output_type"), second.get("name")) == ("stream", "stdout"):
            merged[k], merged[k + 1] = second, first
    if "outputs" in cell:
        cell.outputs = merged


def _grade_id(cell: NotebookNode) -> str:
    return str(cell.metadata.get("nbgrader", {}).get("grade_id", ""))


class VerifiedExecute(Execute):  # type: ignore[misc]
    """nbgrader's Execute, with test cells checked outside the student's kernel."""

    max_output_bytes = Integer(
        _DEFAULTS.output_bytes, help="Output of one cell kept; the rest is dropped, with a note"
    ).tag(config=True)
    # One stream output per cell and stream, however the kernel happened to flush it: the
    # graded notebook does not depend on timing (serial and parallel grading agree). Done
    # here (_coalesce), not by nbclient: its carriage-return rule is a regex that takes
    # quadratic time on one long line, and a cell may print a megabyte without a newline.
    coalesce_streams = Bool(False)
    notebook_timeout = Float(_DEFAULTS.notebook_s, help="Seconds the whole notebook may run").tag(
        config=True
    )

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(**kwargs)
        self.student = DEFAULT_STUDENT
        self._deadline = math.inf
        self._cell_output = 0
        self._output_cut = False
        self._out_of_time = False

    def create_kernel_manager(self) -> Any:
        """nbclient's kernel manager, told this executor's output cap: a sandboxed kernel
        drops printed text past it as it is printed (:func:`course.sandbox.limits.kernel_boot`)."""
        km = super().create_kernel_manager()
        if isinstance(km, SandboxedKernelManager):
            km.max_output_bytes = self.max_output_bytes
        return km

    def preprocess(
        self, nb: NotebookNode, resources: dict[str, Any], km: Any = None
    ) -> tuple[NotebookNode, dict[str, Any]]:
        """Grade one student's notebook, drawing challenge numbers for that student."""
        self.student = str(resources.get("nbgrader", {}).get("student") or DEFAULT_STUDENT)
        self._deadline = math.inf  # the clock starts at the first cell, once the kernel is up
        self._out_of_time = False
        before = os.environ.get(STUDENT_ENV)
        os.environ[STUDENT_ENV] = self.student  # read by the sandbox when it starts a kernel
        try:
            result: tuple[NotebookNode, dict[str, Any]] = super().preprocess(nb, resources, km)
            return result
        finally:
            if before is None:
                os.environ.pop(STUDENT_ENV, None)
            else:
                os.environ[STUDENT_ENV] = before

    def process_message(
        self, msg: dict[str, Any], cell: NotebookNode, cell_index: int
    ) -> NotebookNode | None:
        """Count each cell's output; keep the first ``max_output_bytes``, drop the rest."""
        kind = msg["msg_type"]
        if kind in _OUTPUT_MESSAGES or kind.startswith("comm"):
            size = max(_MESSAGE_CHARS, _size(msg.get("content")))
            room = self.max_output_bytes - self._cell_output
            self._cell_output += size
            if size > room and not (kind == "error" and size <= _ERROR_KEPT_CHARS):
                kept = self._cut(msg, room)
                if kept is None:
                    return None
                msg = kept
        result: NotebookNode | None = super().process_message(msg, cell, cell_index)
        return result

    def _cut(self, msg: dict[str, Any], room: int) -> dict[str, Any] | None:
        """What of ``msg`` fits in ``room`` characters: the first part of printed text, else
        nothing."""
        self._output_cut = True
        content = msg.get("content") or {}
        text = content.get("text")
        if msg["msg_type"] == "stream" and isinstance(text, str) and room > _MESSAGE_CHARS:
            keep = room - _MESSAGE_CHARS
            return {**msg, "content": {**content, "text": text[:keep]}}
        return None

    def _note_cut(self, cell: NotebookNode, index: int) -> None:
        """Say, in the cell and in the flags, that its output was cut."""
        if not self._output_cut:
            return
        note = (
            f"\n[output truncated by the grader: the first {self.max_output_bytes:,} characters "
            "of this cell's output were kept, the rest was dropped]\n"
        )
        cell.outputs.append(
            NotebookNode(output_type="stream", name="stderr", text=note)  # type: ignore[no-untyped-call]
        )
        add_flag(
            self.nb,
            f"{_grade_id(cell) or f'cell {index + 1}'}: {OUTPUT_TRUNCATED} (the first "
            f"{self.max_output_bytes:,} characters kept; the cell ran to its end)",
        )
        self._output_cut = False

    def preprocess_cell(
        self, cell: NotebookNode, resources: dict[str, Any], index: int
    ) -> tuple[NotebookNode, dict[str, Any]]:
        self._check_assign_resources(resources)
        if cell.cell_type != "code" or _grade_id(cell) in SKIPPED_IDS:
            return cell, self.resources
        if self._deadline == math.inf:
            self._deadline = time.monotonic() + self.notebook_timeout
        remaining = self._deadline - time.monotonic()
        if remaining <= 0 and not self._out_of_time:
            self._out_of_time = True
            add_flag(
                self.nb,
                f"the notebook ran past its {self.notebook_timeout:g} s limit; "
                f"{_grade_id(cell) or f'cell {index + 1}'} and the cells after it were not run",
            )
        if self._out_of_time:
            return self._not_run(cell), self.resources
        if is_test_cell(cell):
            verdict = self._verify(cell, index)
            cell.outputs = [] if verdict.passed else [error_output(verdict.ename, verdict.message)]
            cell.execution_count = None
            return cell, self.resources
        # The cell's timeout, shortened to what is left of the notebook's.
        cell_timeout: int | None = getattr(self, "timeout", None)
        shortened = max(1, int(min(cell_timeout or math.inf, math.ceil(remaining))))
        setattr(self, "timeout", shortened)  # noqa: B010 - a traitlet mypy cannot type
        self._cell_output, self._output_cut = 0, False
        started = time.monotonic()
        try:
            result: tuple[NotebookNode, dict[str, Any]] = super().preprocess_cell(
                cell, resources, index
            )
            if any(o.get("ename") == "CellTimeoutError" for o in cell.outputs):
                raise CellTimeoutError("no reply from the kernel before the timeout")
            _coalesce(cell)
            self._note_cut(cell, index)
            return result
        except Exception as err:  # any failure here comes from the student's kernel
            cell.outputs = [o for o in cell.outputs if o.get("ename") != "CellTimeoutError"]
            _coalesce(cell)
            self._note_cut(cell, index)
            message = self._cause(err, remaining, time.monotonic() - started)
            known = isinstance(err, CellTimeoutError | DeadKernelError)
            ename = type(err).__name__ if known else "KernelError"
            cell.outputs.append(error_output(ename, message))
            add_flag(self.nb, f"{_grade_id(cell) or f'cell {index + 1}'}: {message}")
            if not self._out_of_time:
                self._restart_kernel(index)
            return cell, self.resources
        finally:
            setattr(self, "timeout", cell_timeout)  # noqa: B010 - a traitlet mypy cannot type

    def _cause(self, err: Exception, remaining: float, elapsed: float) -> str:
        """What stopped the cell, in words for the student; decides what happens next."""
        km = self.km
        reason = km.limit_reason if isinstance(km, SandboxedKernelManager) else ""
        if reason:
            cause = f"the kernel {reason}"
        elif "IOPub" in str(err) and elapsed < (self.timeout or math.inf):
            # The reply came in time, the output did not.
            cause = "the cell's output did not arrive (too much of it, or a blocked channel)"
        elif isinstance(err, CellTimeoutError) and remaining <= (self.timeout or math.inf):
            self._out_of_time = True
            self._kill_kernel()
            return (
                f"the notebook ran past its {self.notebook_timeout:g} s limit; "
                "this cell and the ones after it were not run."
            )
        elif isinstance(err, CellTimeoutError):
            cause = f"the cell did not finish within {self.timeout} s"
        elif isinstance(err, DeadKernelError):
            cause = "the kernel stopped while running this cell"
        else:  # e.g. a message with a bad signature: the grader trusts nothing it cannot read
            self.log.warning("cell failed: %s: %s", type(err).__name__, err)
            cause = "the kernel sent the grader a message it could not read"
        return f"{cause}; the kernel was restarted, so names set before it are undefined."

    def _kill_kernel(self) -> None:
        process = getattr(getattr(self.km, "provisioner", None), "process", None)
        if process is not None and process.poll() is None:
            process.kill()

    def _not_run(self, cell: NotebookNode) -> NotebookNode:
        message = f"not run: the notebook used up its {self.notebook_timeout:g} s."
        cell.outputs = [error_output("TimeoutError", message)]
        cell.execution_count = None
        return cell

    def _verify(self, cell: NotebookNode, index: int) -> Verdict:
        grade_id = _grade_id(cell) or "?"
        try:
            names = free_names(cell.source)
        except SyntaxError as err:
            self.log.error("test cell %s does not parse: %s", grade_id, err)
            return Verdict(False, "SyntaxError", "the hidden test could not check the answer.")
        values = self._read_values(names, index)
        with grading_student(self.student):
            verdict = run_hidden_test(cell.source, values)
        if verdict.detail:
            self.log.error("test cell %s failed to run: %s", grade_id, verdict.detail)
        self.log.info("test cell %s: %s", grade_id, "passed" if verdict.passed else verdict.ename)
        return verdict

    def _read_values(self, names: list[str], index: int) -> dict[str, float | int | Unreadable]:
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
        except Exception:  # a timeout, a dead kernel, or a message that does not verify
            reply = None
        if reply is None:
            self._restart_kernel(index)
        content = (reply or {}).get("content", {})
        results = content.get("user_expressions") or {}
        if content.get("status") != "ok":
            self.log.warning("the kernel did not report values for %s", names)
        return {
            name: rebuild_value(results.get(name) or {"status": "error", "ename": "NoReply"})
            for name in names
        }

    def _restart_kernel(self, index: int) -> None:
        """A fresh kernel, with the locked set-up cells before cell ``index`` run again."""
        assert self.km is not None and self.kc is not None
        self.log.warning("restarting the kernel of %s", self.student)
        run_sync(self.km.restart_kernel)(now=True)
        # A fresh client: the old one's sockets may have been cut by an oversized message.
        self.kc.stop_channels()
        client: Any = self.km.client()
        client.start_channels()
        run_sync(client.wait_for_ready)(timeout=self.startup_timeout)
        client.allow_stdin = False
        setattr(self, "kc", client)  # noqa: B010 - nbclient's attribute, untyped here
        for cell in self.nb.cells[:index]:
            if cell.cell_type == "code" and is_locked(cell) and not is_grade(cell):
                if _grade_id(cell) in SKIPPED_IDS or not cell.source.strip():
                    continue
                try:
                    msg_id = client.execute(cell.source, silent=True, store_history=False)
                    self.wait_for_reply(msg_id)
                except (CellTimeoutError, DeadKernelError):
                    self.log.warning("set-up cell %s failed after a restart", _grade_id(cell))
                    return
