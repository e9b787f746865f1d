"""scripts/gpu_check.py: refuses without a GPU; rehearsed on a CPU, every section's failure
is contained, the file is valid JSON after every step, and the book refuses a rehearsal."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from course import gpu_runs as records
from kvlib.units import MiB

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_check = _script()
SECTIONS: tuple[str, ...] = gpu_check.SECTIONS


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """A rehearsal sets one torch thread; give the rest of the session its own back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


class Rehearsal:
    """One in-process rehearsal: its exit status, its file, each write's text, its output."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> None:
        self.path = tmp / "rehearsal.json"
        self.writes: list[str] = []
        real = gpu_check.write_json_atomic

        def spy(path: Path, doc: dict[str, Any]) -> None:
            real(path, doc)
            self.writes.append(path.read_text())  # what a reader would see at this moment

        monkeypatch.setattr(gpu_check, "write_json_atomic", spy)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.status = gpu_check.main(["--rehearse", "--out", str(self.path), *extra])
        self.stdout = out.getvalue()
        self.doc: dict[str, Any] = json.loads(self.path.read_text())

    def names(self, section: str) -> list[str]:
        return [m["name"] for m in self.doc["measurements"] if m["section"] == section]

    def results(self, section: str) -> list[str]:
        """Every measurement ``section`` timed, skipped or failed: what a run records of it.

        (Without the preflight's feature probes, a missing SDPA backend is tried and its
        failure recorded instead of being skipped: the name is there either way.)
        """
        others = [
            s["name"]
            for key in ("skipped", "failed_measurements")
            for s in self.doc[key]
            if s["section"] == section
        ]
        return sorted(self.names(section) + others)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Rehearsal:
    tmp = tmp_path_factory.mktemp("clean")
    with pytest.MonkeyPatch.context() as mp:
        return Rehearsal(tmp, mp)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU"
)
def test_refuses_without_cuda(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 2 and not out.exists()
    assert "no CUDA GPU" in result.stderr and "never records CPU times" in result.stderr
    assert "--rehearse" in result.stderr and "Traceback" not in result.stderr


def test_refuses_a_cpu_device_even_with_a_gpu(tmp_path: Path) -> None:
    assert gpu_check.main(["--device", "cpu", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_a_clean_rehearsal_runs_every_section(clean: Rehearsal) -> None:
    assert clean.status == 0 and clean.doc["status"] == "complete"
    assert clean.doc["rehearsal"] is True and clean.doc["device"]["type"] == "cpu"
    assert {k: v["status"] for k, v in clean.doc["sections"].items()} == dict.fromkeys(
        SECTIONS, "ok"
    )
    for section in SECTIONS:
        if section not in ("preflight", "unsynchronised", "agreement"):
            assert clean.names(section), section
    for m in clean.doc["measurements"]:
        assert m["rehearsal"] is True and m["device"] == "cpu" and m["clock"] != "cuda-events"
        assert m["bandwidth_bytes_per_s"] == pytest.approx(m["bytes_moved"] / m["median_s"])
    assert set(clean.doc["results"]) == {"overhead", "unsynchronised", "agreement"}
    agreement = clean.doc["results"]["agreement"]
    assert agreement["triton"] == "do_bench stand-in (rehearsal)"
    assert agreement["over_triton_do_bench_cold"] > 0


def test_preflight_names_versions_memory_and_features(clean: Rehearsal) -> None:
    pre = clean.doc["preflight"]
    assert pre["torch"]["version"] == torch.__version__
    assert pre["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert pre["memory"]["torch_mem_get_info"]["total_bytes"] > 0
    features = pre["features"]
    for name in ("enable_gqa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "fp8", "triton"):
        assert isinstance(features[name]["available"], bool), name
        assert features[name]["available"] or features[name]["reason"], name
    # A backend the preflight found missing is skipped with its reason, not crashed on.
    kv = set(clean.names("kv_read"))
    for impl in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        name = f"kv-read/{impl}"
        if features[impl]["available"]:
            assert name in kv
        else:
            (skip,) = [s for s in clean.doc["skipped"] if s["name"] == name]
            assert features[impl]["reason"] in skip["reason"]


def test_sizes_are_derived_from_the_l2(clean: Rehearsal) -> None:
    sizes = clean.doc["sizes"]
    l2 = sizes["l2_bytes"]
    assert sizes["l2_source"] == "rehearsal stand-in"
    assert sizes["flush_bytes"] >= 4 * l2 and sizes["probe_cold_bytes"] >= 4 * l2
    assert min(sizes["copy_bytes"]) >= 4 * l2 and sizes["read_bytes"] >= 4 * l2
    assert sizes["probe_in_l2_bytes"] < l2
    cold = [m for m in clean.doc["measurements"] if m["cache"] == "cold"]
    assert cold and all(m["flush_bytes"] == sizes["flush_bytes"] for m in cold)


@pytest.mark.parametrize("l2_mib", [50, 60])
def test_h200_sizes_are_four_l2s_and_more(l2_mib: int) -> None:
    sizes = gpu_check.plan_sizes(gpu_check.PROFILES["full"], l2_mib * MiB)
    assert sizes["flush_bytes"] >= max(4 * l2_mib * MiB, 256 * MiB)  # and do_bench's 256 MiB
    assert sizes["copy_bytes"][0] == 4 * l2_mib * MiB and sizes["copy_bytes"] == sorted(
        sizes["copy_bytes"]
    )
    assert sizes["probe_cold_bytes"] == 4 * l2_mib * MiB
    assert sizes["probe_in_l2_bytes"] * 4 == l2_mib * MiB


def test_every_write_is_valid_json_and_the_summary_is_printed_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Rehearsal(tmp_path, monkeypatch)
    assert len(run.writes) > len(run.doc["measurements"])  # one write per measurement, at least
    docs = [json.loads(text) for text in run.writes]
    counts = [len(d["measurements"]) for d in docs]
    assert counts == sorted(counts) and counts[-1] == len(run.doc["measurements"])
    assert docs[0]["status"] == "running" and docs[-1]["status"] == "complete"
    # The preflight is on file before any measurement.
    first = next(d for d in docs if d["measurements"])
    assert first["preflight"]["torch"]["version"] == torch.__version__
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check summary:") and "REHEARSAL" in last
    assert f"ran {len(SECTIONS)}/{len(SECTIONS)}" in last and str(run.path) in last
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary files were renamed away


@pytest.mark.parametrize("section", SECTIONS)
def test_a_failing_section_loses_nothing_else(
    section: str,
    clean: Rehearsal,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = Rehearsal(tmp_path, monkeypatch, "--fail-section", section)
    assert run.status == 1 and run.doc["status"] == "complete"
    for text in run.writes:
        json.loads(text)
    entry = run.doc["sections"][section]
    assert entry["status"] == "failed"
    assert entry["error"]["type"] == "RehearsedFailure"
    assert f"--fail-section {section}" in entry["error"]["message"]
    assert entry["error"]["settings"] == entry["settings"] and entry["settings"]
    for other in SECTIONS:
        if other != section:
            assert run.doc["sections"][other]["status"] == "ok", other
            assert run.results(other) == clean.results(other), other
    # What the failing section measured before it raised is kept too.
    assert set(run.names(section)) <= set(clean.names(section))
    if clean.names(section):
        assert run.names(section) == clean.names(section)[:1]
    last = run.stdout.strip().splitlines()[-1]
    assert f"failed 1 [{section} (RehearsedFailure)]" in last


def test_a_spent_budget_skips_sections_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_check, "_RESERVE_S", 0.0)
    run = Rehearsal(tmp_path, monkeypatch, "--budget-s", "1e-9")
    assert run.status == 0 and run.doc["measurements"] == []
    for name, entry in run.doc["sections"].items():
        assert entry == {"status": "skipped", "reason": "time budget spent (--budget-s)"}, name
    assert "skipped 10" in run.stdout.strip().splitlines()[-1]


def test_a_budget_under_the_reserve_is_refused(tmp_path: Path) -> None:
    assert gpu_check.main(["--rehearse", "--budget-s", "1", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


def test_an_interrupted_run_keeps_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def killed(check: Any) -> None:
        check.settings({"n": 1})
        raise gpu_check.Interrupted("signal 15")

    monkeypatch.setitem(gpu_check.SECTION_FUNCTIONS, "compute", killed)
    run = Rehearsal(tmp_path, monkeypatch)
    assert run.status == 3 and run.doc["status"] == "interrupted"
    statuses = {k: v["status"] for k, v in run.doc["sections"].items()}
    done = SECTIONS[: SECTIONS.index("compute")]
    assert statuses == {
        **dict.fromkeys(SECTIONS, "pending"),
        **dict.fromkeys(done, "ok"),
        "compute": "interrupted",
    }
    assert "interrupted" in run.stdout.strip().splitlines()[-1]


def test_heavy_sections_carry_clock_samples(clean: Rehearsal) -> None:
    for name, entry in clean.doc["sections"].items():
        if name in gpu_check.HEAVY_SECTIONS:
            clocks = entry["clocks"]
            assert clocks["source"].startswith("rehearsal") and clocks["samples"] >= 1
            assert len(clocks["readings"]) == clocks["samples"]
        else:
            assert "clocks" not in entry


def test_clock_summary_and_a_failing_reader() -> None:
    readings = iter(
        [
            {"sm_mhz": 1980, "reasons": []},
            {"sm_mhz": 1755, "reasons": ["sw_power_cap"]},
            {"sm_mhz": 1980, "reasons": ["sw_power_cap", "hw_slowdown"]},
        ]
    )

    def read() -> dict[str, Any]:
        return next(readings)  # StopIteration after three: recorded, the thread ends

    sampler = gpu_check.ClockSampler(read, "test", 0.0)
    with sampler:
        sampler._thread.join(timeout=5)
    summary = sampler.summary()
    assert summary["sm_mhz"] == {"min": 1755, "median": 1980, "max": 1980}
    assert summary["reasons_seen"] == ["hw_slowdown", "sw_power_cap"]
    assert summary["samples"] == 3 and summary["errors"]


def test_the_book_never_shows_a_rehearsal_as_a_gpu_run(clean: Rehearsal, tmp_path: Path) -> None:
    path = tmp_path / "gpu_cpu-run.json"
    path.write_text(json.dumps(clean.doc))
    with pytest.raises(ValueError, match="rehearsal"):
        records.load_runs(tmp_path)
    # Clearing the flag and relabelling the device is not enough: every measurement
    # says which clock timed it.
    forged = {**clean.doc, "rehearsal": False, "device": {**clean.doc["device"], "type": "cuda"}}
    path.write_text(json.dumps(forged))
    with pytest.raises(ValueError, match="never shown as a GPU figure"):
        records.load_runs(tmp_path)


def test_default_outputs() -> None:
    assert gpu_check.default_out("NVIDIA H200") == ROOT / "book" / "data" / "gpu_nvidia-h200.json"
    assert gpu_check.default_out("NVIDIA H200", Path("/out")) == Path("/out/gpu_nvidia-h200.json")
    rehearsal = gpu_check.default_out("AMD EPYC (1 torch thread)", rehearsal=True)
    assert rehearsal.parent == ROOT / "_build" and not rehearsal.name.startswith("gpu_")


def test_summarize_reads_a_partial_file(
    clean: Rehearsal, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    partial = {
        **clean.doc,
        "status": "running",
        "sections": {**clean.doc["sections"], "agreement": {"status": "pending"}},
    }
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(partial))
    assert gpu_check.main(["--summarize", str(path)]) == 0
    line = capsys.readouterr().out.strip()
    assert "running: ran 9/10" in line and "pending 1 [agreement]" in line


def test_device_check_script_is_valid_bash() -> None:
    done = subprocess.run(
        ["bash", "-n", str(ROOT / "scripts" / "device_check.sh")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_device_check_rehearses_into_out_and_prints_the_summary_last(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": sys.executable,
        "OUT": str(tmp_path),
        "BUDGET_S": "120",
    }
    done = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "device_check.sh"),
            "--rehearse",
            "--fail-section",
            "compute",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # one section failed, on purpose
    (written,) = tmp_path.glob("rehearsal_*.json")
    doc = json.loads(written.read_text())
    assert doc["rehearsal"] is True and doc["sections"]["compute"]["status"] == "failed"
    assert "--budget-s" in doc["argv"] and doc["budget_s"] == 120
    assert (tmp_path / "gpu_check.log").read_text().strip()
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check summary:") and "failed 1 [compute" in last
