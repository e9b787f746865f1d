"""Helpers for the grading tests: the chapter 1 notebooks and submissions made from them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENT = "01_kv_cache"
NOTEBOOK = "kv_cache"
SOURCE = ROOT / "solutions" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
RELEASE = ROOT / "exercises" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
CHALLENGES = ("bytes_per_token", "seats", "prefill_s")

# Right answers written as a learner would, not copied from kvlib.
RIGHT = {
    "answer_bytes_per_token": "bytes_per_token = 2 * 48 * 8 * 128 * 1",
    "answer_seats": "seats = int(30 * 2**30 / (10_000 * 131_072))",
    "answer_prefill_s": "prefill_s = 2 * 32e9 * 6000 / 400e12",
}

# The classic wrong answer of each challenge and a phrase of the hint it must get.
CLASSIC_WRONG = {
    "bytes_per_token": ("bytes_per_token = 2 * 48 * 40 * 128 * 1", "attention heads"),
    "seats": ("seats = int(30e9 / (10_000 * 131_072))", "30 GB"),
    "prefill_s": ("prefill_s = 32e9 * 6000 / 400e12", "left out the 2"),
}

ALWAYS_EQUAL = """
class AlwaysEqual(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__

class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False

bytes_per_token = Anything()
seats = AlwaysEqual(1)
prefill_s = Anything()
"""

MONKEYPATCH = """
import sys, types
import kvlib.grading, kvlib.sizing
kvlib.grading.expect = lambda *args, **kwargs: None
fake = types.ModuleType("kvlib.grading")
fake.expect = lambda *args, **kwargs: None
sys.modules["kvlib.grading"] = fake
kvlib.sizing.kv_bytes_per_token_dense = lambda *args, **kwargs: 1
ip = get_ipython()
ip.set_custom_exc((BaseException,), lambda *args, **kwargs: None)
ip.input_transformers_cleanup.append(
    lambda lines: ["pass\\n"] if any("hidden test" in line for line in lines) else lines
)
bytes_per_token = 1
"""

READ_SOLUTIONS = f"""
import glob, json
paths = glob.glob({str(ROOT / "solutions")!r} + "/**/*.ipynb", recursive=True)
paths += glob.glob("../../../solutions/**/*.ipynb", recursive=True)
print("solution notebooks visible:", len(paths))
for path in paths:
    with open(path) as f:
        for cell in json.load(f)["cells"]:
            text = "".join(cell["source"])
            if "BEGIN SOLUTION" in text:
                exec(text)
"""


def read(path: Path) -> Any:
    return nbformat.read(path, as_version=4)


def submission(answers: Mapping[str, str], base: Path = RELEASE) -> Any:
    """The released notebook with the cells whose grade_id is a key replaced."""
    nb = copy.deepcopy(read(base))
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return nb


def write(nb: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
