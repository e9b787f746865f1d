"""kvlib queue: the closed-form waits it prints, and one-line refusals."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from kvlib.cli import main
from kvlib.commands.queue import render
from kvlib.serving.erlang import QueueStats, mmc


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, float]:
    assert main(["queue", *args, "--json"]) == 0
    report: dict[str, float] = json.loads(capsys.readouterr().out)
    return report


def test_json_is_the_mm1_textbook_answer(capsys: pytest.CaptureFixture[str]) -> None:
    """One server at utilization 0.8, 0.5 s service: wait = rho S / (1 - rho) = 2 s."""
    report = run_json(capsys, "--arrivals-per-s", "1.6", "--service-s", "0.5")
    assert set(report) == {f.name for f in QueueStats.__dataclass_fields__.values()}
    assert report["servers"] == 1
    assert report["utilization"] == pytest.approx(0.8)
    assert report["p_wait"] == pytest.approx(0.8)
    assert report["mean_wait_s"] == pytest.approx(2.0)
    assert report["p95_wait_s"] == pytest.approx(0.5 / 0.2 * math.log(20 * 0.8))


def test_json_for_a_pool(capsys: pytest.CaptureFixture[str]) -> None:
    """M/M/2 at rho = 0.5: P(wait) = 2 rho^2 / (1 + rho) = 1/3, mean = P / (2 mu - lambda)."""
    report = run_json(capsys, "--arrivals-per-s", "2", "--service-s", "0.5", "--servers", "2")
    assert report["p_wait"] == pytest.approx(1 / 3)
    assert report["mean_wait_s"] == pytest.approx((1 / 3) / (4 - 2))
    assert report["p95_wait_s"] == pytest.approx(math.log((1 / 3) / 0.05) / 2)


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["queue", "--arrivals-per-s", "2.8", "--service-s", "2", "--servers", "10"]) == 0
    out = capsys.readouterr().out
    for label in ("utilization  0.560", "P(wait)", "mean wait", "p95 wait", " ms"):
        assert label in out


def test_a_light_load_says_why_the_p95_is_zero() -> None:
    text = render(mmc(0.5, 1.0, 4))
    assert "p95 wait     0 s (at most 5% of requests wait at all)" in text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--arrivals-per-s", "6", "--service-s", "2", "--servers", "10"], "1.200 >= 1"),
        (["--arrivals-per-s", "1", "--service-s", "1"], "unstable queue: utilization"),
        (["--arrivals-per-s", "1", "--service-s", "0"], "--service-s must be a positive"),
        (["--arrivals-per-s", "-3", "--service-s", "1"], "--arrivals-per-s must be a finite"),
        (["--arrivals-per-s", "nan", "--service-s", "1"], "--arrivals-per-s must be a finite"),
        (["--arrivals-per-s", "1", "--service-s", "2", "--servers", "0"], "--servers must be"),
    ],
)
def test_bad_input_is_one_line_with_exit_2(args: list[str], needle: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvlib", "queue", *args], capture_output=True, text=True
    )
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr
    assert lines[0].startswith("kvlib queue: error: ")
