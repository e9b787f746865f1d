"""kvlib handoff: a request's cache from prefill GPUs to decode GPUs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvlib.cli import main
from kvlib.commands.handoff import HandoffReport
from kvlib.config import load_config
from kvlib.sizing import kv_bytes

CMD = ["handoff", "Llama-3.1-8B", "--prompt-tokens", "4096", "--link", "ib-400g"]


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_json_fields(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, *CMD, "--prefill-tp", "2", "--decode-tp", "4")
    assert set(report) == set(HandoffReport.__dataclass_fields__)
    whole = kv_bytes(load_config("Llama-3.1-8B"), 4096)
    assert report["transfer_bytes"] == whole == 2 * 32 * 8 * 128 * 2 * 4096
    assert sum(report["bytes_per_gpu_pair"].values()) == whole
    assert sorted(report["bytes_per_gpu_pair"]) == ["0->0", "0->1", "1->2", "1->3"]
    # prefill GPU 0 sends half the cache over its own 50 GB/s NIC (400 Gb/s)
    assert report["transfer_s"] == pytest.approx(whole / 2 / 50e9)


def test_table_lists_each_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CMD, "--decode-tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0->0" in out and "GPU 0->1" in out


@pytest.mark.parametrize(("args", "flag"), [
    (["--decode-tp", "3"], "--decode-tp"),
    (["--prefill-tp", "0"], "--prefill-tp"),
    (["--prefill-tp", "64"], "--prefill-tp"),
])
def test_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], args: list[str],
                               flag: str) -> None:
    assert main([*CMD, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and "\n" not in err


def test_unknown_link_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["handoff", "Llama-3.1-8B", "--prompt-tokens", "8", "--link", "nvlink9"]) == 2
    assert "pcie5" in capsys.readouterr().err
