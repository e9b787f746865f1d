"""Read a submitted notebook defensively and repair it against the released notebook.

One malformed submission must not stop a class's batch (nbgrader aborts the
whole run on a duplicated nbgrader cell, because its deduplication leaves
metadata that fails its own schema check). :func:`repair_notebook` turns any
file into a notebook nbgrader can grade, repairing where the intent is clear
and saying what it did, in flags (:mod:`course.notebooks.flags`) that reach the
export and the student's feedback:

- stored outputs are dropped as the file is read (:mod:`course.notebooks.stored`):
  nbgrader clears them before it runs the notebook, so they are not the
  student's graded work, and a notebook is only too large
  (``MAX_NOTEBOOK_BYTES``) by what is graded: sources, metadata, attachments.
  A file over that cap with its outputs is flagged ``outputs dropped``;
- a file that is not a notebook (bad JSON, not UTF-8, cut off mid-save, too
  large without its outputs, or over ``MAX_FILE_BYTES`` raw, refused before
  it is read) is graded as the blank release, so it scores 0 with feedback
  that says why;
- malformed cells are dropped; missing, invalid or repeated cell ids replaced;
- a graded cell id that appears twice (Jupyter's copy and paste keeps the
  nbgrader metadata): the copy that sits where the released notebook had it
  stays graded, the others become ordinary cells (they still run, in order);
- ids the release does not have lose their nbgrader metadata;
- locked cells (prompts, set-up, hidden tests) that were deleted are put back
  where the release had them; edited ones get the released source back (a
  test cell's hidden part is then restored by nbgrader from its gradebook);
- every graded cell's nbgrader metadata (points, locked, grade) is the
  release's, whatever the file says.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import nbformat as _nbformat
from nbformat import NotebookNode

from course.notebooks.stored import KeptTooLarge, strip_outputs
from kvlib.units import GiB, MiB

# nbformat is only partly typed: use it untyped here.
nbformat: Any = _nbformat

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_NOTEBOOK_BYTES",
    "OUTPUTS_DROPPED",
    "SET_ASIDE",
    "repair_notebook",
    "set_aside",
    "unsafe_files",
]

# What is graded (the file without its stored outputs) may be this large.
MAX_NOTEBOOK_BYTES = 32 * MiB
# A raw file this large is refused unread: no real notebook comes near it.
MAX_FILE_BYTES = 1 * GiB
OUTPUTS_DROPPED = "outputs dropped"
# Where ``make grade`` moves links out of a submission: submitted/<student>/.links/<assignment>/
SET_ASIDE = ".links"
_CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")
_KINDS = ("code", "markdown", "raw")


def _grade_id(cell: Any) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    return str(meta["grade_id"]) if isinstance(meta, dict) and "grade_id" in meta else None


def _blank(release: NotebookNode, why: str) -> tuple[NotebookNode, list[str]]:
    nb = copy.deepcopy(release)
    return nb, [f"{why}; graded as the blank released notebook"]


def _text(source: Any) -> str | None:
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    return None


def _cells(raw: dict[str, Any], flags: list[str]) -> list[NotebookNode]:
    """The well-formed cells of ``raw``, as fresh nbformat 4 cells (outputs dropped)."""
    cells: list[NotebookNode] = []
    dropped = 0
    items = raw.get("cells")
    for item in items if isinstance(items, list) else []:
        source = _text(item.get("source")) if isinstance(item, dict) else None
        kind = item.get("cell_type") if isinstance(item, dict) else None
        if source is None or kind not in _KINDS:
            dropped += 1
            continue
        meta = item.get("metadata")
        cell = {
            "code": nbformat.v4.new_code_cell,
            "markdown": nbformat.v4.new_markdown_cell,
            "raw": nbformat.v4.new_raw_cell,
        }[kind](source)
        cell.metadata = nbformat.from_dict(meta if isinstance(meta, dict) else {})
        cell_id = item.get("id")
        cell["id"] = cell_id if isinstance(cell_id, str) else ""
        if kind != "code" and isinstance(item.get("attachments"), dict):
            cell["attachments"] = nbformat.from_dict(item["attachments"])
        cells.append(cell)
    if dropped:
        flags.append(f"{dropped} malformed cell(s) dropped")
    return cells


def _fix_ids(cells: list[NotebookNode], flags: list[str], expected: bool) -> None:
    seen: set[str] = set()
    fixed = 0
    for number, cell in enumerate(cells):
        if not _CELL_ID.match(cell["id"]) or cell["id"] in seen:
            fixed += 1
            cell["id"] = f"cell-{number}"
            while cell["id"] in seen:
                cell["id"] += "x"
        seen.add(cell["id"])
    if fixed and expected:
        flags.append(f"{fixed} cell id(s) missing, invalid or repeated: new ones given")


def _choose(
    occurrences: list[int], start: int, end: int, cells: list[NotebookNode], model: NotebookNode
) -> int:
    """The occurrence of a repeated id to keep graded: where the release had it."""
    window = [i for i in occurrences if start <= i < end]
    window = window or [i for i in occurrences if i >= start] or occurrences
    if model.metadata["nbgrader"].get("solution"):
        return window[-1]  # the last copy is the one whose value the kernel keeps
    same = [i for i in window if cells[i].source.strip() == model.source.strip()]
    return (same or window)[0]


def _keepers(
    cells: list[NotebookNode], order: list[str], release: dict[str, NotebookNode], flags: list[str]
) -> dict[str, int]:
    """Index of the graded copy of each release id present in ``cells``."""
    where: dict[str, list[int]] = {}
    for index, cell in enumerate(cells):
        gid = _grade_id(cell)
        if gid is not None:
            where.setdefault(gid, []).append(index)
    keep: dict[str, int] = {}
    start = 0
    for k, gid in enumerate(order):
        found = where.get(gid, [])
        if len(found) == 1:
            keep[gid] = found[0]
            start = max(start, found[0] + 1)
        elif found:
            anchors = [where[g][0] for g in order[k + 1 :] if len(where.get(g, [])) == 1]
            end = min((a for a in anchors if a >= start), default=len(cells))
            keep[gid] = _choose(found, start, end, cells, release[gid])
            start = keep[gid] + 1
            flags.append(
                f"cell {gid} appeared {len(found)} times: the copy at position "
                f"{keep[gid] + 1} was graded, the others ran as ordinary cells"
            )
    return keep


def _restore(cell: NotebookNode, model: NotebookNode, gid: str, flags: list[str]) -> None:
    """Give a kept graded cell the release's type, metadata and (if locked) source."""
    claimed = {k: v for k, v in cell.metadata.get("nbgrader", {}).items() if k != "checksum"}
    wanted = {k: v for k, v in model.metadata["nbgrader"].items() if k != "checksum"}
    if claimed != wanted or cell.cell_type != model.cell_type:
        flags.append(f"the nbgrader settings of cell {gid} were changed: restored")
    if cell.cell_type != model.cell_type:
        fresh = copy.deepcopy(model)
        fresh["id"] = cell["id"]
        if not wanted.get("locked"):
            fresh.source = cell.source
        cell.clear()
        cell.update(fresh)  # type: ignore[no-untyped-call]
    cell.metadata["nbgrader"] = copy.deepcopy(model.metadata["nbgrader"])
    if wanted.get("locked"):
        for key in ("tags", "editable", "deletable"):
            if key in model.metadata:
                cell.metadata[key] = copy.deepcopy(model.metadata[key])
        if cell.source.strip() != model.source.strip():
            flags.append(f"locked cell {gid} was edited: the released version was graded")
            cell.source = model.source


def _insert_missing(
    cells: list[NotebookNode], order: list[str], release: dict[str, NotebookNode], flags: list[str]
) -> list[NotebookNode]:
    present = {_grade_id(c) for c in cells} - {None}
    for k, gid in enumerate(order):
        if gid in present:
            continue
        model = release[gid]
        if not model.metadata["nbgrader"].get("locked"):
            flags.append(f"answer cell {gid} was deleted")
            continue
        before = [g for g in order[:k] if g in present]
        position = 0
        if before:
            position = next(i for i, c in enumerate(cells) if _grade_id(c) == before[-1]) + 1
        fresh = copy.deepcopy(model)
        fresh["id"] = f"restored-{gid}"[:64]
        cells.insert(position, fresh)
        present.add(gid)
        kind = "hidden-test" if model.metadata["nbgrader"].get("grade") else "locked"
        flags.append(f"{kind} cell {gid} was deleted: restored")
    return cells


def _released_cells(release: NotebookNode) -> tuple[list[str], dict[str, NotebookNode]]:
    order, by_id = [], {}
    for cell in release.cells:
        gid = _grade_id(cell)
        if gid is not None:
            order.append(gid)
            clean = copy.deepcopy(cell)
            if clean.cell_type == "code":
                clean.outputs, clean.execution_count = [], None
            by_id[gid] = clean
    return order, by_id


def _demote(
    cells: Iterable[NotebookNode], keep: dict[str, int], known: set[str], flags: list[str]
) -> None:
    """Strip nbgrader metadata from every graded-looking cell that is not a kept copy."""
    for index, cell in enumerate(cells):
        gid = _grade_id(cell)
        meta = cell.metadata.get("nbgrader")
        if gid is None and meta is None:
            continue
        if gid in known and keep.get(gid) == index:
            continue
        claims = isinstance(meta, dict) and any(
            meta.get(k) for k in ("grade", "solution", "locked")
        )
        if gid not in known and claims:
            flags.append(f"cell id {gid!r} is not in the assignment: graded as an ordinary cell")
        cell.metadata.pop("nbgrader", None)


def _file_bytes(stream: BinaryIO) -> int:
    """Size of the file behind ``stream`` (from its current position), without reading it."""
    start = stream.tell()
    end = stream.seek(0, io.SEEK_END)
    stream.seek(start)
    return end - start


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / MiB:,.1f} MiB"


def repair_notebook(
    data: bytes | BinaryIO, release: NotebookNode
) -> tuple[NotebookNode, list[str]]:
    """A gradable nbformat 4 notebook made from the file ``data`` (its bytes, or the file
    opened in binary mode), and what was repaired."""
    stream = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    file_bytes = _file_bytes(stream)
    if file_bytes > MAX_FILE_BYTES:
        return _blank(release, f"the file is {_mib(file_bytes)}, over the "
                               f"{MAX_FILE_BYTES // GiB} GiB any notebook fits in: not read")
    try:
        stripped = strip_outputs(stream, MAX_NOTEBOOK_BYTES)
    except KeptTooLarge:
        return _blank(release, f"the notebook is larger than {MAX_NOTEBOOK_BYTES // MiB} MiB "
                               "without its outputs")
    try:
        raw = json.loads(stripped.data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _blank(release, "the file is not a readable notebook (not JSON)")
    outputs_dropped = stripped.outputs_dropped
    del stripped  # the parsed notebook is all that is needed now
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list):
        return _blank(release, "the file is not a notebook (no list of cells)")
    if raw.get("nbformat") != 4:
        try:
            raw = dict(nbformat.convert(nbformat.from_dict(raw), 4))
        except Exception:  # nbformat's converters raise many kinds
            return _blank(release, f"notebook format {raw.get('nbformat')!r} cannot be read")
    flags: list[str] = []
    if file_bytes > MAX_NOTEBOOK_BYTES and outputs_dropped:
        flags.append(
            f"{OUTPUTS_DROPPED}: the file is {_mib(file_bytes)}, over the "
            f"{MAX_NOTEBOOK_BYTES // MiB} MiB cap, with the outputs it stored; they were "
            "removed before grading (the grader runs the code again)"
        )
    cells = _cells(raw, flags)
    order, by_id = _released_cells(release)
    keep = _keepers(cells, order, by_id, flags)
    _demote(cells, keep, set(by_id), flags)
    for gid, index in keep.items():
        _restore(cells[index], by_id[gid], gid, flags)
    cells = _insert_missing(cells, order, by_id, flags)
    _fix_ids(cells, flags, expected=raw.get("nbformat_minor", 0) >= 5)
    nb: NotebookNode = nbformat.v4.new_notebook(
        cells=cells, metadata=copy.deepcopy(release.metadata)
    )
    nb.metadata.pop("kvlib", None)
    return nb, flags


def unsafe_files(folder: Path) -> list[Path]:
    """Paths below ``folder`` that are links or neither files nor folders, relative to it.

    nbgrader copies a submission's files by following links, so a link could bring
    in any file the grader can read (a solution, the gradebook) or one that never
    ends (``/dev/zero``).
    """
    found = []
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(parent, name)
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                found.append(path.relative_to(folder))
    return sorted(found)


def set_aside(submitted: Path) -> list[Path]:
    """Move the unsafe entries of one submission folder (``submitted/<student>/<assignment>``)
    to ``submitted/<student>/.links/<assignment>/``, before nbgrader copies them."""
    moved = unsafe_files(submitted)
    for relative in moved:
        target = submitted.parent / SET_ASIDE / submitted.name / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(submitted / relative, target)  # moves the link itself, never its target
    return moved
