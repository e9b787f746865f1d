"""scripts/gpu_check.py: refuses without a GPU; rehearsed on a CPU, every section's failure
is contained, the file is valid JSON after every step, and the book refuses a rehearsal."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from course.book import gpu_runs as records
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
# What a CPU rehearsal cannot run and skips with the reason: fp8 tensor cores, ncu's counters.
SKIPPED_ON_CPU = ("fp8", "ncu")
RUN_ON_CPU = tuple(s for s in SECTIONS if s not in SKIPPED_ON_CPU)


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

        def spy(path: Path, doc: dict[str, Any], indent: int | None = 1) -> None:
            real(path, doc, indent)
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
    assert {k: v["status"] for k, v in clean.doc["sections"].items()} == {
        **dict.fromkeys(RUN_ON_CPU, "ok"), **dict.fromkeys(SKIPPED_ON_CPU, "skipped")
    }
    for section in RUN_ON_CPU:
        if section not in ("preflight", "warmup", "unsynchronised", "agreement"):
            assert clean.names(section), section
    for m in clean.doc["measurements"]:
        assert m["rehearsal"] is True and m["device"] == "cpu" and m["clock"] != "cuda-events"
        assert m["bandwidth_bytes_per_s"] == pytest.approx(m["bytes_moved"] / m["median_s"])
    assert set(clean.doc["results"]) == {
        "warmup", "matmul_peak", "overhead", "unsynchronised", "agreement"
    }
    agreement = clean.doc["results"]["agreement"]
    assert agreement["triton"] == "do_bench stand-in (rehearsal)"
    assert agreement["over_triton_do_bench_cold"] > 0


def test_fp8_and_ncu_are_skipped_on_a_cpu_with_the_reason(clean: Rehearsal) -> None:
    sections, features = clean.doc["sections"], clean.doc["preflight"]["features"]
    assert "fp8 tensor cores" in sections["fp8"]["reason"]
    assert features["fp8_matmul"]["available"] is False
    assert "profiles no GPU counters" in sections["ncu"]["reason"]
    assert not [m for m in clean.doc["measurements"] if m["name"].startswith(("fp8", "ncu"))]


def test_every_measurement_was_checked_and_keeps_every_repetition(clean: Rehearsal) -> None:
    for m in clean.doc["measurements"]:
        times = m["times_s"]
        assert len(times) == m["reps"] and all(t > 0 for t in times), m["name"]
        assert m["median_s"] == pytest.approx(torch.tensor(times).double().quantile(0.5).item())
        if m["name"].startswith("tiny/"):
            assert m["output_check"]["checked"] is False  # a counter, with nothing to compare
        else:
            assert m["output_check"]["checked"] is True, m["name"]
            assert m["output_check"]["max_abs_error"] <= m["output_check"]["atol"] + 1e-9 or (
                m["output_check"]["rtol"] > 0
            )
    for workload in ("copy", "kv_read"):
        agreed = clean.doc["results"]["agreement"][workload]
        assert agreed["do_bench_times_s"] and agreed["kvlib_read_flush_times_s"]
        assert agreed["kvlib_write_flush_times_s"] and agreed["over_do_bench_read_flush"] > 0


def test_the_paged_read_reads_blocks_in_place_beside_the_contiguous_read(
    clean: Rehearsal,
) -> None:
    paged = {m["name"]: m for m in clean.doc["measurements"] if m["section"] == "paged_kv_read"}
    assert set(paged) == {"kv-read-paged/flex-16", "kv-read-paged/flex-64"}
    for name, m in paged.items():
        assert "read in place" in m["description"] and "gather" not in m["description"]
        assert m["settings"]["block_size"] == int(name.rsplit("-", 1)[1])
        assert m["output_check"]["checked"] is True
    ratios = clean.doc["summary"]["paged_over_contiguous_by_kernel"]
    assert set(ratios) == set(paged) and all(r["over"] == "kv-read/sdpa" for r in ratios.values())
    # Without triton here, its kernels are skipped with the reason, not lost.
    skipped = {s["name"]: s["reason"] for s in clean.doc["skipped"]}
    triton = clean.doc["preflight"]["features"]["triton_kernels"]
    for name in ("kv-read-paged/triton-16", "kv-read-paged/triton-64", "kv-read/triton"):
        assert (name in skipped) == (not triton["available"]), name


def test_warmup_and_the_sustained_peak_read_the_clocks(clean: Rehearsal) -> None:
    warm = clean.doc["results"]["warmup"]
    assert warm["matmuls"] >= 1 and warm["seconds"] >= gpu_check.PROFILES["tiny"]["warmup_run_s"]
    assert "sm_mhz" in warm["clocks_before"] and "sm_mhz" in warm["clocks_after"]
    peak = clean.doc["results"]["matmul_peak"]
    assert "sm_mhz" in peak["clocks_before"] and "sm_mhz" in peak["clocks_after"]
    (record,) = [m for m in clean.doc["measurements"] if m["name"] == "matmul-peak"]
    assert record["cache"] == "warm" and peak["reps"] == record["reps"]
    # The harness sizes the run from a first call's time (kvlib.timing.bench), so on a
    # loaded CPU the timed total can fall short of the target: check what was recorded.
    assert record["settings"]["sustained_s"] == gpu_check.PROFILES["tiny"]["sustained_s"]
    assert peak["reps"] == len(record["times_s"]) >= 1
    assert peak["sustained_s"] == round(math.fsum(record["times_s"]), 3)


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
    assert all(m["flush"] == "read" for m in cold)
    # Every timed kernel moves at least the rule's bytes, but the probes meant to be small.
    small = {"l2-probe/in-l2/warm", "l2-probe/in-l2/cold", "tiny/warm", "tiny/cold",
             "matmul-peak"}
    for m in clean.doc["measurements"]:
        if m["name"] not in small:
            assert m["bytes_moved"] >= sizes["min_traffic_bytes"], m["name"]
    assert not [f for f in clean.doc["failed_measurements"] if f["type"] == "TooLittleTraffic"]


@pytest.mark.parametrize(("l2_mib", "rule_mib"), [(50, 256), (60, 256), (126, 504)])
def test_gpu_sizes_follow_one_rule(l2_mib: int, rule_mib: int) -> None:
    """max(4 x L2, 256 MiB): an H100 SXM and an H200 get 256 MiB, a B200 504 MiB."""
    sizes = gpu_check.plan_sizes(gpu_check.PROFILES["full"], l2_mib * MiB)
    rule = rule_mib * MiB
    assert sizes["flush_bytes"] == sizes["min_traffic_bytes"] == sizes["probe_cold_bytes"] == rule
    assert sizes["copy_bytes"][0] == rule and sizes["copy_bytes"] == sorted(sizes["copy_bytes"])
    assert sizes["probe_in_l2_bytes"] * 4 == l2_mib * MiB
    for batch, context in sizes["decode_sweep"]:
        assert gpu_check.kv_cache_bytes(batch, context) >= rule, (batch, context)
    # Batch 1 at 8,192 tokens (32 MiB) is stretched to a context 8x longer (256 MiB).
    assert sizes["decode_sweep"][0] == (1, 8192 * -(-rule // (32 * MiB)))
    weights = sizes["matmul_layers"] * 8192 * 8192 * 2
    assert weights >= rule > weights - 8192 * 8192 * 2


def test_a_kernel_under_the_rule_or_with_a_wrong_output_is_not_a_measurement(
    tmp_path: Path,
) -> None:
    check = gpu_check.Check(gpu_check.RehearsalCalls(), "tiny", tmp_path / "x.json", 60.0)
    gpu_check.ensure_sizes(check)
    check.current = "kv_read"
    rule = check.sizes["min_traffic_bytes"]
    shape = {"batch": 2, "context_tokens": 128, "heads": 32, "kv_heads": 8, "head_dim": 128,
             "dtype": "bf16", "device": "cpu"}
    good = gpu_check.w.decode_attention(**shape)
    assert good.bytes_moved >= rule
    wrong = dataclasses.replace(good, fn=lambda: good.fn().flip(0))  # sequences swapped
    small = gpu_check.w.copy(rule // 4, "cpu")
    assert check.time("right", lambda: good, {}) is not None
    assert check.time("wrong", lambda: wrong, {}) is None
    assert check.time("small", lambda: small, {}) is None
    failed = {f["name"]: f["type"] for f in check.doc["failed_measurements"]}
    assert failed == {"wrong": "OutputMismatch", "small": "TooLittleTraffic"}
    assert [m["name"] for m in check.doc["measurements"]] == ["right"]


def test_every_write_is_valid_json_and_the_summary_is_printed_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Rehearsal(tmp_path, monkeypatch)
    assert len(run.writes) > len(run.doc["measurements"])  # one write per measurement, at least
    docs = [json.loads(text) for text in run.writes]
    counts = [len(d["measurements"]) for d in docs]
    assert counts == sorted(counts) and counts[-1] == len(run.doc["measurements"])
    assert docs[0]["status"] == "running" and docs[-1]["status"] == "complete"
    # One line while running; the file the run leaves is indented for a reader.
    assert all(text.count("\n") == 1 for text in run.writes[:-1])
    assert run.writes[-1].startswith('{\n "') and run.path.read_text() == run.writes[-1]
    # The preflight is on file before any measurement.
    first = next(d for d in docs if d["measurements"])
    assert first["preflight"]["torch"]["version"] == torch.__version__
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check summary:") and "REHEARSAL" in last
    assert f"ran {len(RUN_ON_CPU)}/{len(SECTIONS)}" in last and str(run.path) in last
    assert f"skipped {len(SKIPPED_ON_CPU)} [{', '.join(SKIPPED_ON_CPU)}]" in last
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary files were renamed away


@pytest.mark.parametrize("section", RUN_ON_CPU)
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
            assert run.doc["sections"][other]["status"] == clean.doc["sections"][other][
                "status"
            ], other
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
    assert f"skipped {len(SECTIONS)}" in run.stdout.strip().splitlines()[-1]


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
        **{name: "skipped" if name in SKIPPED_ON_CPU else "ok" for name in done},
        "compute": "interrupted",
    }
    assert "interrupted" in run.stdout.strip().splitlines()[-1]


def test_heavy_sections_carry_clock_samples(clean: Rehearsal) -> None:
    for name, entry in clean.doc["sections"].items():
        if name in gpu_check.HEAVY_SECTIONS and entry["status"] == "ok":
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
    ran = sum(e["status"] == "ok" for e in partial["sections"].values())
    assert f"running: ran {ran}/{len(SECTIONS)}" in line and "pending 1 [agreement]" in line


def test_the_script_runs_from_the_root_without_an_installed_package(
    clean: Rehearsal, tmp_path: Path
) -> None:
    """`python scripts/gpu_check.py` on a bare machine: no site-packages, another cwd."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps(clean.doc))
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), "--summarize", str(path)],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpu_check summary:") and "REHEARSAL" in done.stdout


def test_ncu_csv_is_summed_per_metric() -> None:
    text = "\n".join([
        '==PROF== Connected to process 1',
        '{"target": "copy", "bytes_moved": 2147483648}',
        '"ID","Process ID","Kernel Name","Metric Name","Metric Unit","Metric Value"',
        '"0","1","copy_kernel","dram__bytes_read.sum","byte","1,073,741,824"',
        '"0","1","copy_kernel","dram__bytes_write.sum","byte","1,073,700,000"',
        '"1","1","other","dram__bytes_read.sum","byte","100"',
        '"1","1","other","sm__cycles","cycle","5"',
    ])
    totals = gpu_check.parse_ncu_csv(text)
    assert totals == {"dram__bytes_read.sum": 1_073_741_924.0,
                      "dram__bytes_write.sum": 1_073_700_000.0, "kernels": 2}
    assert gpu_check._ncu_counted_bytes(text) == 2**31
    assert gpu_check.parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM") == {"kernels": 0}


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
