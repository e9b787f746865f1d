"""kvlib capacity: the remedies table as the library ranks it, every row reachable, and
one-line refusals."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from kvlib.capacity.assessment import assess
from kvlib.capacity.examples import (
    BUNDLED_NAMES,
    bundled_scenarios,
    document_assistant,
    retrieval_heavy,
)
from kvlib.cli import main
from kvlib.commands.capacity import RemedyRow
from kvlib.hardware import get_gpu

H100 = get_gpu("H100-SXM")
SCENARIOS = ["document_assistant", "retrieval_heavy"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["capacity", *args, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_the_default_is_the_document_assistant_as_deployed_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = run_json(capsys)
    assert report["scenario"] == "document_assistant" and report["mfu"] == 0.6
    first = report["rows"][0]
    assert set(first) == set(RemedyRow.__dataclass_fields__)
    assert {"remedy", "gpus", "seats", "tokens_per_s", "bound", "step_s", "flops_per_s",
            "hbm_bytes_per_s"} <= set(first)
    cap = assess(document_assistant())
    assert first["remedy"] == "as deployed"
    assert first["tokens_per_s"] == pytest.approx(cap.tokens_per_s)
    assert first["seats"] == cap.total_block_seats and first["bound"] == cap.bound_by


@pytest.mark.parametrize("mfu", ["0.3", "0.6", "1"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_row_is_reachable(
    capsys: pytest.CaptureFixture[str], scenario: str, mfu: str
) -> None:
    report = run_json(capsys, scenario, "--mfu", mfu)
    assert report["mfu"] == float(mfu)
    names = [row["remedy"] for row in report["rows"]]
    assert "fp8 KV cache" in names and "fp8 weights (W8A8)" in names
    for row in report["rows"]:
        # The W8A8 row's weight GEMMs run on fp8 tensor cores: twice the dense peak.
        peak = H100.fp8_dense_flops_per_s if "W8A8" in row["remedy"] else None
        peak = peak or H100.bf16_dense_flops_per_s
        assert row["flops_per_s"] <= float(mfu) * peak * (1 + 1e-9), row
        assert row["hbm_bytes_per_s"] <= H100.hbm_bandwidth_bytes_per_s * (1 + 1e-9), row
        # tokens/s x step time is the sequences decoding, every replica: at most the seats.
        assert row["tokens_per_s"] * row["step_s"] <= row["seats"] + 1e-6


def test_the_mfu_flag_reaches_the_rows(capsys: pytest.CaptureFixture[str]) -> None:
    low = run_json(capsys, "retrieval_heavy", "--mfu", "0.3")["rows"][0]
    high = run_json(capsys, "retrieval_heavy", "--mfu", "1")["rows"][0]
    assert low["tokens_per_s"] < high["tokens_per_s"]
    at_peak = dataclasses.replace(retrieval_heavy(), mfu=1.0)
    assert high["tokens_per_s"] == pytest.approx(assess(at_peak).tokens_per_s)


def test_the_table_lists_each_remedy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", "retrieval_heavy"]) == 0
    text = capsys.readouterr().out
    assert "as deployed" in text and "prefix caching" in text and "MFU 0.6" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [(["nope"], "unknown scenario 'nope'"), (["--mfu", "1.5"], "--mfu must be in (0, 1]")],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["capacity", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_the_listed_scenarios_are_the_bundled_ones(capsys: pytest.CaptureFixture[str]) -> None:
    """The command lists the scenarios without building them: the names it offers are
    those bundled_scenarios builds, in its order, and each name runs."""
    assert tuple(b.name for b in bundled_scenarios()) == BUNDLED_NAMES
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    listed = capsys.readouterr().out
    for name in BUNDLED_NAMES:
        key = name.replace(" ", "_").replace("-", "_")
        assert key in listed
        assert main(["capacity", key, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["rows"]
