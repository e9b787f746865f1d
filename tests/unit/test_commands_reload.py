"""kvlib reload: reload and recompute times as the tiers package computes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvlib.cli import main
from kvlib.commands.reload import ReloadReport
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.tiers.links import get_link, link_names
from kvlib.tiers.reload import recompute_s, reload_s

CMD = ["reload", "Llama-3.1-8B", "--prefix-tokens", "4096", "--link", "pcie5"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_json_fields_match_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, *CMD)
    assert set(report) == set(ReloadReport.__dataclass_fields__)
    llama, bw = load_config("Llama-3.1-8B"), get_link("pcie5").bytes_per_s
    assert report["bytes_per_s"] == bw
    assert report["reload_s"] == pytest.approx(reload_s(llama, 4096, bw))
    assert report["recompute_s"] == pytest.approx(recompute_s(llama, get_gpu("H100-SXM"), 4096))
    assert report["reload_bytes"] == 4096 * 128 * 1024
    assert report["reload_wins"] is True
    assert report["break_even_tokens"] is None  # reload always wins: null in JSON


def test_flags_reach_the_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    base = run_json(capsys, *CMD)
    tp2 = run_json(capsys, *CMD, "--tp", "2")
    fp8 = run_json(capsys, *CMD, "--kv-dtype", "fp8")
    slow = run_json(capsys, *CMD, "--mfu", "0.3")
    assert tp2["reload_s"] == pytest.approx(base["reload_s"] / 2)
    assert fp8["reload_s"] == pytest.approx(base["reload_s"] / 2)
    assert slow["recompute_s"] > base["recompute_s"]


def test_a_window_where_recompute_wins_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "reload", "GPT-2", "--prefix-tokens", "500", "--link", "nvme-gen5")
    assert report["reload_wins"] is False
    assert report["recompute_wins_from"] is not None
    assert main(["reload", "GPT-2", "--prefix-tokens", "500", "--link", "nvme-gen5"]) == 0
    assert "recompute wins from" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "names"), [
    (["--link", "pcie9"], "--link"),
    (["--link", "pcie5", "--tp", "3"], "--tp"),
    (["--link", "pcie5", "--kv-dtype", "fp7"], "--kv-dtype"),
    (["--link", "pcie5", "--mfu", "2"], "--mfu"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], args: list[str],
                               names: str) -> None:
    assert main(["reload", "Llama-3.1-8B", "--prefix-tokens", "10", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert names in err and "\n" not in err and "Traceback" not in err


def test_unknown_link_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reload", "Llama-3.1-8B", "--prefix-tokens", "10", "--link", "x"]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in link_names())
