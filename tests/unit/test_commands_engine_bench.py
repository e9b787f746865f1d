"""kvlib engine-bench: the report's fields, its equivalence check, one-line errors."""

from __future__ import annotations

import json

import pytest

from kvlib.cli import main


def test_small_workload_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine-bench", "--requests", "6", "--num-blocks", "24",
                 "--max-num-seqs", "3", "--token-budgets", "none,16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["outputs_match_single"] is True
    assert report["device"].endswith("(1 torch thread)")
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
    assert report["continuous_over_static"] == pytest.approx(
        report["continuous"]["tokens_per_s"] / report["static"]["tokens_per_s"]
    )


@pytest.mark.parametrize("flag", ["--requests", "--max-num-seqs", "--num-blocks",
                                  "--block-size", "--token-budgets"])
def test_bad_flags_are_one_line(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine-bench", flag, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0]
