"""kvlib engine-bench: the report's fields, its equivalence check, one-line errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvlib.cli import main
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.step import ASSUMED_MFU, PrefillChunk, step_time


def test_small_workload_report(capsys: pytest.CaptureFixture[str]) -> None:
    # Seed 36 draws six requests of 47 output tokens in all (seed 0: 200): each run of the
    # workload takes a fifth of the steps (static batching 25, against 146). A pool of 8
    # blocks of 16 tokens holds the longest request (105 tokens) but not three long ones
    # at once, so it preempts.
    assert main(["engine-bench", "--requests", "6", "--seed", "36", "--num-blocks", "24",
                 "--max-num-seqs", "3", "--token-budgets", "none,16", "--long-prompt", "600",
                 "--preempt-blocks", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outputs_match_single"] is True
    assert report["device"].endswith("(1 torch thread)")
    assert (report["modelled_model"], report["modelled_gpu"]) == ("Llama-3.1-8B", "H100-SXM")
    assert report["mfu"] == ASSUMED_MFU
    for policy in ("static", "continuous"):
        figures = report[policy]
        assert figures["policy"] == policy
        assert figures["tokens_per_s"] == pytest.approx(
            figures["generated_tokens"] / figures["elapsed_s"]
        )
        assert figures["ttft_p50_s"] <= figures["ttft_p95_s"] <= figures["ttft_p99_s"]
    assert report["static"]["generated_tokens"] == report["continuous"]["generated_tokens"]
    budgets = {row["max_num_batched_tokens"]: row for row in report["budgets"]}
    assert set(budgets) == {None, 16}
    assert budgets[16]["max_step_tokens"] <= 16 < budgets[None]["max_step_tokens"]
    # A budget below the prompts splits them: more steps for the same tokens.
    assert budgets[16]["figures"]["steps"] > budgets[None]["figures"]["steps"]
    for row in budgets.values():
        figures = row["figures"]
        assert figures["generated_tokens"] == report["continuous"]["generated_tokens"]
        assert figures["itl_p50_s"] <= figures["itl_p95_s"] <= figures["itl_p99_s"]
    _check_modelled(report)
    assert report["continuous_over_static"] == pytest.approx(
        report["continuous"]["tokens_per_s"] / report["static"]["tokens_per_s"]
    )


def _check_modelled(report: dict[str, Any]) -> None:
    """The modelled GPU times: a decode step of the priced model is the fastest gap; a step
    carrying a whole long prompt is the streams' largest gap when the budget lets it in; a
    smaller budget splits the prompt and the gap; preemption figures are consistent."""
    cfg, gpu = load_config("Llama-3.1-8B"), get_gpu("H100-SXM")
    floor = step_time(cfg, gpu, [1]).total_s  # one sequence, one cached token
    for figures in (report["static"], report["continuous"]):
        assert figures["modelled_tokens_per_s"] == pytest.approx(
            figures["generated_tokens"] / figures["modelled_elapsed_s"])
        assert floor <= figures["modelled_itl_p50_s"] <= figures["modelled_itl_p99_s"]
        assert figures["modelled_ttft_p50_s"] <= figures["modelled_ttft_p95_s"]
    spikes = {row["max_num_batched_tokens"]: row for row in report["spike"]}
    assert list(spikes) == [8192, 2048, 512]
    whole = step_time(cfg, gpu, [16] * 4, [PrefillChunk(600)]).total_s
    assert spikes[8192]["stream_itl_max_s"] == pytest.approx(whole, rel=0.02)
    assert spikes[8192]["long_prefill_steps"] == 1 < spikes[512]["long_prefill_steps"]
    assert spikes[512]["stream_itl_max_s"] < spikes[8192]["stream_itl_max_s"]
    assert spikes[512]["long_ttft_s"] >= spikes[8192]["long_ttft_s"]
    p = report["preemption"]
    assert p["num_blocks"] == 8 and p["preemptions"] > 0 and p["recompute_tokens"] > 0
    assert 0 < p["modelled_recompute_s"] < p["modelled_elapsed_s"]


@pytest.mark.parametrize("flag", ["--requests", "--max-num-seqs", "--num-blocks",
                                  "--block-size", "--token-budgets", "--long-prompt",
                                  "--preempt-blocks", "--mfu"])
def test_bad_flags_are_one_line(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine-bench", flag, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0]


@pytest.mark.parametrize(("flag", "value"), [("--gpu", "H900"), ("--model", "no-such-model")])
def test_unknown_gpu_or_model_is_one_line(flag: str, value: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine-bench", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and value in err[0]
