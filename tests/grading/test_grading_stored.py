"""course.notebooks.stored: a notebook file read in chunks, every cell's outputs dropped, the
rest kept.

Checked against the obvious reference (parse the whole file, empty each cell's
outputs) on generated JSON full of the characters a scanner can trip on
(quotes, backslashes, brackets, commas inside strings), read in chunks of a
few bytes so that every token is cut at every place.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import course.notebooks.stored
from course.notebooks.stored import KeptTooLarge, strip_outputs

TRICKY = st.text(alphabet=st.sampled_from(['a', '"', "\\", "[", "]", "{", "}", ",", ":", "\n",
                                           "é", " ", "\r"]), max_size=12)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=12,
)
OUTPUT = st.dictionaries(TRICKY, VALUES, min_size=1, max_size=3)
CELL = st.fixed_dictionaries(
    {"cell_type": st.just("code"), "source": TRICKY, "outputs": st.lists(OUTPUT, max_size=3),
     # a key named outputs that is not a cell's: kept
     "metadata": st.dictionaries(st.just("outputs") | TRICKY, VALUES, max_size=2)}
)


def reference(raw: dict[str, Any]) -> dict[str, Any]:
    for cell in raw["cells"]:
        cell["outputs"] = []
    return raw


@settings(max_examples=150, deadline=None)
@given(
    cells=st.lists(CELL, max_size=4),
    extra=st.dictionaries(TRICKY, VALUES, max_size=2),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1]),
    chunk=st.integers(1, 17),
)
def test_same_as_dropping_outputs_after_parsing(
    cells: list[dict[str, Any]], extra: dict[str, Any], ascii_only: bool, indent: int | None,
    chunk: int,
) -> None:
    notebook = {**extra, "metadata": {"cells": [{"outputs": [1]}]}, "cells": cells}
    text = json.dumps(notebook, ensure_ascii=ascii_only, indent=indent).encode()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(course.notebooks.stored, "CHUNK_BYTES", chunk)
        stripped = strip_outputs(io.BytesIO(text), 10**9)
    assert json.loads(stripped.data) == reference(json.loads(text))
    assert stripped.outputs_dropped == sum(1 for c in cells if c["outputs"])


def test_nbformat3_worksheets() -> None:
    old = {"nbformat": 3, "worksheets": [{"cells": [
        {"cell_type": "code", "input": "1", "outputs": [{"output_type": "pyout", "text": "1"}]}
    ]}]}
    stripped = strip_outputs(io.BytesIO(json.dumps(old).encode()), 10**6)
    assert json.loads(stripped.data)["worksheets"][0]["cells"][0]["outputs"] == []
    assert stripped.outputs_dropped == 1


def test_kept_text_over_the_limit_stops_the_read() -> None:
    text = json.dumps({"cells": [{"source": "x" * 5000, "outputs": ["y" * 10**6]}]}).encode()
    assert len(strip_outputs(io.BytesIO(text), 6000).data) < 6000  # outputs do not count
    with pytest.raises(KeptTooLarge):
        strip_outputs(io.BytesIO(text), 4000)
