"""kvlib step: the step model's terms as it prints them, and one-line refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvlib.cli import main
from kvlib.commands.step import StepReport
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.step import mixed_step

STEP = ["step", "Llama-3.1-8B", "--decode-batch", "91", "--context", "3000",
        "--prefill-tokens", "364"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_json_carries_the_step_models_terms(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, *STEP)
    assert set(report) == set(StepReport.__dataclass_fields__)
    step = mixed_step(load_config("Llama-3.1-8B"), get_gpu("H100-SXM"), 91, 3000, 364)
    assert report["step_s"] == pytest.approx(step.total_s)
    assert report["step_s"] == pytest.approx(
        report["weights_s"] + report["decode_attention_s"] + report["prefill_attention_s"])
    assert report["weights_bound"] == "compute"
    assert report["flops_per_s"] <= report["flops_ceiling_per_s"]
    assert report["hbm_bytes_per_s"] <= report["hbm_bandwidth_bytes_per_s"]


def test_flags_reach_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    base = run_json(capsys, *STEP)
    at_peak = run_json(capsys, *STEP, "--mfu", "1")
    split = run_json(capsys, *STEP, "--tp", "2")
    fp8 = run_json(capsys, *STEP, "--kv-dtype", "fp8", "--gpu", "H200")
    assert at_peak["step_s"] < base["step_s"]
    assert split["weight_bytes"] < base["weight_bytes"]
    assert fp8["decode_kv_bytes"] == base["decode_kv_bytes"] // 2
    assert fp8["gpu"] == "H200"


def test_the_table_names_each_term(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(STEP) == 0
    text = capsys.readouterr().out
    for label in ("weight GEMMs", "decode attention", "prefill attention", "step time",
                  "MFU 0.6 is an assumption"):
        assert label in text


def test_a_step_over_vllms_token_budget_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "step", "Llama-3.1-8B", "--prefill-tokens", "9000")
    assert any("8,192" in note for note in report["notes"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mfu", "1.5"], "--mfu"),
        (["--tp", "3"], "--tp 3"),
        (["--gpu", "V100"], "unknown GPU"),
        (["--kv-dtype", "fp7"], "--kv-dtype"),
        (["--context", "-1"], "--context"),
    ],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    assert main([*STEP, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_an_empty_step_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["step", "Llama-3.1-8B"]) == 2
    assert "--decode-batch or --prefill-tokens" in capsys.readouterr().err
