"""kvlib.serving.queueing: one import for the queueing formulas of erlang and priority."""

from __future__ import annotations

import subprocess
import sys

import kvlib.serving.erlang
import kvlib.serving.priority
import kvlib.serving.queueing


def test_queueing_re_exports_erlang_and_priority() -> None:
    """The chapters, `kvlib queue` and the graded notebooks import from queueing."""
    names = set(kvlib.serving.queueing.__all__)
    for module in (kvlib.serving.erlang, kvlib.serving.priority):
        public = {n for n in module.__all__ if not n.startswith("check_")} - {"tail_quantile_s"}
        assert public <= names, public - names
        for name in public:
            assert getattr(kvlib.serving.queueing, name) is getattr(module, name)


def test_closed_forms_import_only_the_standard_library() -> None:
    """Light enough for a grader's process: no numpy, no redis at import."""
    code = (
        "import sys, kvlib.serving.queueing, kvlib.serving.bucket, kvlib.serving.ratelimit,"
        " kvlib.commands.queue;"
        "print(sorted({'numpy', 'redis', 'simpy', 'torch'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr
