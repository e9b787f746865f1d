"""course.notebooks.hidden: hidden tests run outside the kernel, on values read out of it.

Chapter 1's own hidden tests are checked draw by draw in ``test_grading_chapter1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from course.notebooks.hidden import (
    Unreadable,
    free_names,
    rebuild_value,
    run_hidden_test,
    snapshot_expression,
)


def kernel_reply(value: Any, name: str = "x") -> dict[str, Any]:
    """What IPython's user_expressions would return for ``value`` (text/plain is repr)."""
    try:
        result = eval(snapshot_expression(name), {name: value})
    except NameError as err:
        return {"status": "error", "ename": "NameError", "evalue": str(err)}
    return {"status": "ok", "data": {"text/plain": repr(result)}}


class AlwaysEqual:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


class TestSnapshot:
    @pytest.mark.parametrize(
        "value", [98304, 0.96, -3, 10**30, np.int64(24), np.float32(0.5), np.float64(1e-9)]
    )
    def test_numbers_round_trip(self, value: Any) -> None:
        rebuilt = rebuild_value(kernel_reply(value))
        assert rebuilt == value.item() if hasattr(value, "item") else rebuilt == value
        assert type(rebuilt) in (int, float)

    @pytest.mark.parametrize(
        ("value", "type_name"),
        [
            (AlwaysEqual(), "AlwaysEqual"),
            (True, "builtins.bool"),
            ("98304", "builtins.str"),
            (np.bool_(True), "numpy.bool"),
            ([1], "builtins.list"),
        ],
    )
    def test_others_unreadable(self, value: Any, type_name: str) -> None:
        rebuilt = rebuild_value(kernel_reply(value))
        assert isinstance(rebuilt, Unreadable)
        assert type_name in rebuilt.type_name

    def test_missing_name(self) -> None:
        rebuilt = rebuild_value({"status": "error", "ename": "NameError"})
        assert isinstance(rebuilt, Unreadable) and rebuilt.missing

    def test_value_whose_repr_fails(self) -> None:
        # int("1" * 5000) fails Python's digit limit: the reply is an error, not a type
        rebuilt = rebuild_value({"status": "error", "ename": "ValueError"})
        assert isinstance(rebuilt, Unreadable) and rebuilt.error == "ValueError"
        verdict = run_hidden_test("pass", {"x": rebuilt})
        assert not verdict.passed and "could not be read (ValueError)" in verdict.message

    @pytest.mark.parametrize(
        "text",
        ["__import__('os')", "('builtins', 'int', '__import__(\"os\")')", "garbage", "('a',)"],
    )
    def test_forged_replies_are_never_evaluated(self, text: str) -> None:
        assert isinstance(rebuild_value({"status": "ok", "data": {"text/plain": text}}), Unreadable)

    def test_name_must_be_identifier(self) -> None:
        with pytest.raises(ValueError):
            snapshot_expression("x); import os; (")


def test_free_names() -> None:
    source = (
        "import math\nfrom m import f as g\nright = g(2)\nexpect(answer, right, [i for i in z])"
    )
    assert free_names(source) == ["answer", "expect", "z"]


class TestRunHiddenTest:
    SOURCE = "from course.checks import expect\nexpect(x, 2 * 21, rel=0, name='x')"

    def test_pass(self) -> None:
        assert run_hidden_test(self.SOURCE, {"x": 42}).passed

    def test_fail_message_without_traceback(self) -> None:
        verdict = run_hidden_test(self.SOURCE, {"x": 41})
        assert not verdict.passed and verdict.ename == "AssertionError"
        assert "x = 41" in verdict.message
        assert "2 * 21" not in verdict.message and "42" not in verdict.message

    def test_unreadable_refused_before_running(self) -> None:
        verdict = run_hidden_test(self.SOURCE, {"x": Unreadable("__main__.AlwaysEqual")})
        assert not verdict.passed and "AlwaysEqual" in verdict.message

    def test_error_in_test_reports_kind_only(self) -> None:
        verdict = run_hidden_test("secret = 42\nraise ValueError(secret)", {})
        assert verdict.ename == "ValueError" and "42" not in verdict.message
        assert "42" in verdict.detail
