"""course.notebooks.repair: any submitted file becomes a gradable notebook, repairs flagged."""

from __future__ import annotations

import base64
import copy
import json
import os
from pathlib import Path
from typing import Any

import nbformat
import pytest
from grading_support import RELEASE, RIGHT, grade_id, read, submission
from nbgrader.nbgraderformat import MetadataValidator

from course.notebooks.repair import (
    MAX_FILE_BYTES,
    MAX_NOTEBOOK_BYTES,
    OUTPUTS_DROPPED,
    repair_notebook,
    set_aside,
    unsafe_files,
)


@pytest.fixture(scope="module")
def release() -> Any:
    return read(RELEASE)


def as_bytes(nb: Any) -> bytes:
    return nbformat.writes(nb).encode()


def ids(nb: Any) -> list[str | None]:
    return [grade_id(c) for c in nb.cells]


def repaired(nb: Any, release: Any) -> tuple[Any, list[str]]:
    fixed, flags = repair_notebook(as_bytes(nb), release)
    MetadataValidator().validate_nb(fixed)  # what stopped nbgrader's batch: must pass now
    nbformat.validate(fixed)
    return fixed, flags


def test_untouched_submission_needs_nothing(release: Any) -> None:
    fixed, flags = repaired(submission(RIGHT), release)
    assert flags == []
    assert ids(fixed) == ids(release)
    assert [c.source for c in fixed.cells] == [c.source for c in submission(RIGHT).cells]


def test_copy_pasted_answer_cell(release: Any) -> None:
    """Jupyter's copy and paste keeps the nbgrader metadata: nbgrader alone aborts the batch."""
    nb = submission(RIGHT)
    index = ids(nb).index("answer_seats")
    copy_cell = copy.deepcopy(nb.cells[index])
    copy_cell["id"] = "pasted"
    copy_cell.source = "seats = 7  # my second try"
    nb.cells.insert(index + 1, copy_cell)
    fixed, flags = repaired(nb, release)
    assert ids(fixed).count("answer_seats") == 1
    kept = ids(fixed).index("answer_seats")
    assert fixed.cells[kept].source == "seats = 7  # my second try"  # the value the kernel keeps
    assert fixed.cells[kept - 1].source == RIGHT["answer_seats"]  # still runs, ungraded
    assert "nbgrader" not in fixed.cells[kept - 1].metadata
    assert any("answer_seats appeared 2 times" in f for f in flags)


def test_duplicated_test_cell_far_away(release: Any) -> None:
    """A copy of a hidden-test cell pasted at the end: the one in place stays graded."""
    nb = submission(RIGHT)
    cell = copy.deepcopy(next(c for c in nb.cells if grade_id(c) == "seats"))
    cell["id"] = "far"
    nb.cells.append(cell)
    fixed, flags = repaired(nb, release)
    assert ids(fixed).index("seats") == ids(release).index("seats")
    assert any("seats appeared 2 times" in f for f in flags)


def test_deleted_test_and_setup_cells_restored_in_place(release: Any) -> None:
    nb = submission(RIGHT)
    nb.cells = [c for c in nb.cells if grade_id(c) not in ("seats", "setup", "prefill_s")]
    fixed, flags = repaired(nb, release)
    assert ids(fixed) == ids(release)
    assert "hidden-test cell seats was deleted: restored" in flags
    assert "locked cell setup was deleted: restored" in flags


def test_deleted_answer_cell_is_reported_not_invented(release: Any) -> None:
    nb = submission(RIGHT)
    nb.cells = [c for c in nb.cells if grade_id(c) != "answer_seats"]
    nb.cells.append(nbformat.v4.new_code_cell("seats = 1"))  # the answer, elsewhere
    fixed, flags = repaired(nb, release)
    assert "answer_seats" not in ids(fixed)
    assert "answer cell answer_seats was deleted" in flags
    assert fixed.cells[-1].source == "seats = 1"


def test_edited_locked_cell_gets_released_source(release: Any) -> None:
    nb = submission({**RIGHT, "check_seats": "pass", "numbers_seats": "N = 1"})
    fixed, flags = repaired(nb, release)
    assert [c.source for c in fixed.cells] == [c.source for c in submission(RIGHT).cells]
    assert "locked cell numbers_seats was edited: the released version was graded" in flags


def test_points_and_roles_come_from_the_release(release: Any) -> None:
    nb = submission(RIGHT)
    for cell in nb.cells:
        if grade_id(cell) == "answer_seats":
            cell.metadata["nbgrader"].update(grade=True, points=100)
        if grade_id(cell) == "seats":
            cell.metadata["nbgrader"].update(points=0, locked=False)
            cell.cell_type = "markdown"
            del cell["outputs"], cell["execution_count"]
    fixed, flags = repaired(nb, release)
    for got, want in zip(fixed.cells, release.cells, strict=True):
        assert got.metadata.get("nbgrader") == want.metadata.get("nbgrader")
        assert got.cell_type == want.cell_type
    assert sum("nbgrader settings" in f for f in flags) == 2


def test_unknown_graded_ids_become_ordinary_cells(release: Any) -> None:
    nb = submission(RIGHT)
    bonus = nbformat.v4.new_code_cell("bonus = 1")
    bonus.metadata["nbgrader"] = {
        "grade": True, "solution": False, "locked": True, "grade_id": "bonus", "points": 50,
        "schema_version": 3,
    }
    nb.cells.append(bonus)
    fixed, flags = repaired(nb, release)
    assert "nbgrader" not in fixed.cells[-1].metadata
    assert any("'bonus' is not in the assignment" in f for f in flags)


def test_missing_and_repeated_cell_ids(release: Any) -> None:
    raw = json.loads(as_bytes(submission(RIGHT)))
    for cell in raw["cells"][:3]:
        del cell["id"]
    raw["cells"][5]["id"] = raw["cells"][6]["id"]
    fixed, flags = repair_notebook(json.dumps(raw).encode(), release)
    cell_ids = [c["id"] for c in fixed.cells]
    assert len(set(cell_ids)) == len(cell_ids)
    assert any("cell id(s) missing, invalid or repeated" in f for f in flags)


def test_old_notebook_without_ids_is_not_flagged(release: Any) -> None:
    raw = json.loads(as_bytes(submission(RIGHT)))
    raw["nbformat_minor"] = 4
    for cell in raw["cells"]:
        del cell["id"]
    fixed, flags = repair_notebook(json.dumps(raw).encode(), release)
    assert flags == [] and all(c["id"] for c in fixed.cells)


def test_malformed_cells_dropped(release: Any) -> None:
    raw = json.loads(as_bytes(submission(RIGHT)))
    raw["cells"] += [{"cell_type": "code"}, {"cell_type": "nonsense", "source": "x"}, 42]
    raw["cells"][0]["outputs"] = "garbage"
    _, flags = repair_notebook(json.dumps(raw).encode(), release)
    assert "3 malformed cell(s) dropped" in flags


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        (b"\x00\xff garbage", "not a readable notebook"),
        (b"[1, 2, 3]", "no list of cells"),
        (b'{"cells": {}}', "no list of cells"),
        (b"x" * (MAX_NOTEBOOK_BYTES + 1), "larger than"),
        (b'{"cells": [], "nbformat": 99}', "cannot be read"),
        (b"[" * 100_000, "not a readable notebook"),
    ],
)
def test_unreadable_file_graded_as_blank_release(release: Any, data: bytes, phrase: str) -> None:
    fixed, flags = repair_notebook(data, release)
    assert ids(fixed) == ids(release)
    assert len(flags) == 1 and phrase in flags[0] and "blank released notebook" in flags[0]


def _saved_with(output: Any) -> Any:
    """A right notebook saved with ``output`` stored in its seats answer cell."""
    nb = submission(RIGHT)
    nb.cells[ids(nb).index("answer_seats")].outputs = [output]
    return nb


def as_file_bytes(nb: Any) -> bytes:
    """The file Jupyter would save (without nbformat's validation: slow on 50 MB)."""
    return json.dumps(nb, indent=1).encode()


STORED_BYTES = 50_000_000
LINE = "step 12: loss 0.5 " * 4 + "\n"


def stored_output(kind: str) -> Any:
    """A 50 MB ``printout`` (650,000 lines of stdout) or ``figure`` (a PNG). nbformat
    validates each output as it is made, in seconds at this size (it was a cost of every
    pytest worker's collection): the output is made and validated small, then filled."""
    if kind == "printout":
        output = nbformat.v4.new_output("stream", name="stdout", text=[LINE])
        output.text = [LINE] * (STORED_BYTES // len(LINE))
    else:
        output = nbformat.v4.new_output("display_data", data={"image/png": ""})
        output.data["image/png"] = base64.b64encode(bytes(STORED_BYTES * 3 // 4)).decode()
    return output


@pytest.mark.parametrize("kind", ["printout", "figure"])
def test_stored_outputs_are_dropped_not_graded(release: Any, kind: str, tmp_path: Path) -> None:
    """A 50 MB stored output is not the student's graded work: dropped as the file is read
    (nbgrader clears outputs before it runs the notebook anyway), and flagged."""
    path = tmp_path / "kv_cache.ipynb"
    path.write_bytes(as_file_bytes(_saved_with(stored_output(kind))))
    assert path.stat().st_size > MAX_NOTEBOOK_BYTES
    with open(path, "rb") as f:
        fixed, flags = repair_notebook(f, release)
    MetadataValidator().validate_nb(fixed)
    assert [c.source for c in fixed.cells] == [c.source for c in submission(RIGHT).cells]
    assert all(not c.get("outputs") for c in fixed.cells)
    assert len(flags) == 1 and flags[0].startswith(OUTPUTS_DROPPED), flags


def test_small_stored_outputs_dropped_silently(release: Any) -> None:
    """Every notebook a student ran has outputs: under the cap, dropping them is no news."""
    fixed, flags = repaired(_saved_with(nbformat.v4.new_output("stream", text="42\n")), release)
    assert flags == [] and all(not c.get("outputs") for c in fixed.cells)


def test_sources_over_the_cap_are_blanked(release: Any) -> None:
    nb = submission(RIGHT)
    nb.cells.append(nbformat.v4.new_markdown_cell("notes " * (MAX_NOTEBOOK_BYTES // 6 + 1)))
    fixed, flags = repair_notebook(as_file_bytes(nb), release)
    assert ids(fixed) == ids(release)
    assert flags == [
        f"the notebook is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB without its outputs; "
        "graded as the blank released notebook"
    ]


def test_a_raw_file_past_the_file_cap_is_not_read(release: Any, tmp_path: Path) -> None:
    """A sparse file one byte over the cap: refused from its size, before any byte is read."""
    path = tmp_path / "kv_cache.ipynb"
    with open(path, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with open(path, "rb") as f:
        fixed, flags = repair_notebook(f, release)
        assert f.tell() == 0
    assert ids(fixed) == ids(release)
    assert len(flags) == 1 and "over the 1 GiB any notebook fits in: not read" in flags[0]


def test_a_file_cut_off_mid_save_is_graded_blank(release: Any) -> None:
    data = as_file_bytes(_saved_with(stored_output("figure")))
    fixed, flags = repair_notebook(data[: len(data) // 3], release)
    assert ids(fixed) == ids(release)
    assert len(flags) == 1 and "not a readable notebook" in flags[0]


def test_flags_in_the_file_are_ignored(release: Any) -> None:
    """A student cannot pre-fill or blank the grader's notes."""
    nb = submission(RIGHT)
    nb.metadata["kvlib"] = {"flags": ["all good"]}
    fixed, _ = repaired(nb, release)
    assert "kvlib" not in fixed.metadata


def test_set_aside_moves_links_not_their_targets(tmp_path: Path) -> None:
    secret = tmp_path / "solutions.ipynb"
    secret.write_text("the answers")
    submitted = tmp_path / "submitted" / "ann" / "01_kv_cache"
    (submitted / "notes").mkdir(parents=True)
    (submitted / "kv_cache.ipynb").write_text("{}")
    (submitted / "notes" / "mine.txt").write_text("mine")
    (submitted / "answers.txt").symlink_to(secret)
    (submitted / "everything").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(submitted / "notes" / "pipe")
    assert unsafe_files(submitted) == [Path("answers.txt"), Path("everything"), Path("notes/pipe")]
    moved = set_aside(submitted)
    assert moved == [Path("answers.txt"), Path("everything"), Path("notes/pipe")]
    assert unsafe_files(submitted) == []
    assert sorted(p.name for p in submitted.rglob("*")) == ["kv_cache.ipynb", "mine.txt", "notes"]
    aside = tmp_path / "submitted" / "ann" / ".links" / "01_kv_cache"
    assert (aside / "answers.txt").is_symlink() and secret.read_text() == "the answers"
    assert unsafe_files(aside) == moved
