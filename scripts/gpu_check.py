"""Every GPU measurement of chapter 6 in one command, written to one JSON file.

Usage: ``python scripts/gpu_check.py [--out book/data/gpu_<device>.json]``

On one CUDA GPU, in well under five minutes, with kvlib's harness (CUDA events,
cold L2 unless stated, medians): device-to-device copies and a pure read
(the bandwidth references), decode attention over a KV cache in several
implementations (the KV-read benchmark, goal: at least 90% of the copy's
bandwidth), a matmul sweep from decode-like to prefill-like shapes (the
roofline), a tiny kernel (launch overhead and event resolution), an
unsynchronised host timing (the mistake), and agreement with
``triton.testing.do_bench`` and ``torch.utils.benchmark.Timer``.

The file records the device name, driver, clocks before and after, the date,
and each measurement with its settings. Without a CUDA GPU the script refuses
to run (exit status 2): it never writes a CPU time where a GPU figure belongs.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvlib.timing import bench, records  # noqa: E402
from kvlib.timing import workloads as w  # noqa: E402
from kvlib.timing.devices import cuda_device_facts, nvidia_smi  # noqa: E402
from kvlib.units import GiB, MiB  # noqa: E402

GOAL_KV_READ_OVER_COPY = 0.9
BUDGET_S = 270.0  # stop starting new measurements after this, to finish under 5 minutes
KV_SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bf16"}  # Llama-3.1-8B
PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "copy_bytes": (32 * MiB, 256 * MiB, GiB, 4 * GiB),
        "l2_probe_bytes": 16 * MiB,
        "read_bytes": 4 * GiB,
        "kv_read": {"batch": 64, "context_tokens": 8192},  # 2 GiB of K and V
        "decode_sweep": ((1, 8192), (8, 8192), (32, 4096), (128, 2048), (256, 1024)),
        "matmul_nk": 8192,
        "matmul_ms": tuple(2**i for i in range(14)),  # 1 ... 8192 tokens
        "square": 8192,
        "agreement_bytes": GiB,
        "rep_s": 0.1,
    },
    # For the tests of this script on a CPU: the same code path, tiny sizes.
    "tiny": {
        "copy_bytes": (MiB, 2 * MiB),
        "l2_probe_bytes": MiB,
        "read_bytes": MiB,
        "kv_read": {"batch": 2, "context_tokens": 64},
        "decode_sweep": ((1, 64),),
        "matmul_nk": 64,
        "matmul_ms": (1, 64),
        "square": 64,
        "agreement_bytes": MiB,
        "rep_s": 0.002,
    },
}


class Run:
    """Collects measurements under a time budget."""

    def __init__(self, device: str, rep_s: float, budget_s: float = BUDGET_S) -> None:
        self.device, self.rep_s = device, rep_s
        self.deadline = time.monotonic() + budget_s
        self.measurements: list[dict[str, Any]] = []
        self.skipped: list[dict[str, str]] = []

    def time(self, name: str, build: Callable[[], Any], settings: dict[str, Any],
             cache: str = "cold") -> dict[str, Any] | None:  # fmt: skip
        """Build the workload, time it, record it; a failure is recorded, not raised."""
        if time.monotonic() > self.deadline:
            self.skipped.append({"name": name, "reason": "time budget spent"})
            return None
        try:
            workload = build()
            result = bench(workload.fn, device=self.device, cache=cache, rep_s=self.rep_s)
        except (RuntimeError, ValueError, MemoryError) as exc:
            self.skipped.append({"name": name, "reason": f"{type(exc).__name__}: {exc}"[:300]})
            return None
        record = records.measurement_record(name, workload, result, settings)
        self.measurements.append(record)
        del workload  # free the device memory before the next measurement
        return record


def _sdpa_backend(impl: str) -> Callable[[Any], Any]:
    """Wrap a workload so that scaled_dot_product_attention may use one backend only."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION,
               "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
               "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}[impl]  # fmt: skip

    def wrap(workload: Any) -> Any:
        def fn() -> object:
            with sdpa_kernel(backend):
                return workload.fn()

        fn()  # an unsupported backend raises here, before any timing
        return w.Workload(workload.name, fn, workload.bytes_moved, workload.flops,
                          f"{workload.description}, {impl}")  # fmt: skip

    return wrap


def bandwidth_section(run: Run, p: dict[str, Any]) -> None:
    for size in p["copy_bytes"]:
        settings = {"bytes_copied": size, "counting": "read + write (2N)"}
        run.time(f"copy/{size}", partial(w.copy, size, run.device), settings)
    probe = p["l2_probe_bytes"]
    for cache in ("warm", "cold"):
        run.time(f"l2-probe/{cache}", lambda: w.copy(probe, run.device),
                 {"bytes_copied": probe, "cache": cache}, cache=cache)  # fmt: skip
    run.time("read", lambda: w.read(p["read_bytes"], run.device), {"bytes": p["read_bytes"]})


def kv_read_section(run: Run, p: dict[str, Any]) -> None:
    shape = {**KV_SHAPE, **p["kv_read"]}
    for impl in ("sdpa", "matmul", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        base = "matmul" if impl == "matmul" else "sdpa"

        def build(impl: str = impl, base: str = base) -> Any:
            workload = w.decode_attention(**shape, device=run.device, impl=base)
            return workload if impl in ("sdpa", "matmul") else _sdpa_backend(impl)(workload)

        run.time(f"kv-read/{impl}", build, {**shape, "impl": impl})
    for batch, context in p["decode_sweep"]:
        settings = {**KV_SHAPE, "batch": batch, "context_tokens": context, "impl": "sdpa"}
        build = partial(w.decode_attention, **settings, device=run.device)
        run.time(f"decode/{batch}x{context}", build, settings)


def compute_section(run: Run, p: dict[str, Any]) -> None:
    nk = p["matmul_nk"]
    for m in p["matmul_ms"]:
        settings = {"m": m, "n": nk, "k": nk, "dtype": "bf16"}
        run.time(f"matmul/{m}", partial(w.matmul, **settings, device=run.device), settings)
    sq = p["square"]
    settings = {"m": sq, "n": sq, "k": sq, "dtype": "bf16"}
    run.time("matmul-peak", lambda: w.matmul(**settings, device=run.device), settings)


def _built(workload: Any) -> Any:
    return workload


def overhead_section(run: Run) -> dict[str, Any]:
    """A one-element kernel: warm (host launch gaps inside the events) and cold (hidden)."""
    import torch

    out: dict[str, Any] = {}
    for cache in ("warm", "cold"):
        x = torch.zeros(1, device=run.device)
        tiny = w.Workload("tiny", partial(x.add_, 1), 8, 1, "x.add_(1) on one float32")
        record = run.time(f"tiny/{cache}", partial(_built, tiny), {"elements": 1}, cache=cache)
        out[f"tiny_kernel_{cache}_median_s"] = None if record is None else record["median_s"]
    return out


def unsynchronised(run: Run, size: int) -> dict[str, Any]:
    """Host clock around one launch, without and with ``synchronize``: the classic mistake."""
    import torch

    on_gpu = run.device.startswith("cuda")
    copy = w.copy(size, run.device)
    copy.fn()
    if on_gpu:
        torch.cuda.synchronize(run.device)
    launches, synced = [], []
    for _ in range(20):
        start = time.perf_counter()
        copy.fn()
        launches.append(time.perf_counter() - start)
        if on_gpu:
            torch.cuda.synchronize(run.device)
        synced.append(time.perf_counter() - start)
    return {"bytes_copied": size, "host_median_without_sync_s": statistics.median(launches),
            "host_median_with_sync_s": statistics.median(synced)}  # fmt: skip


def agreement(run: Run, size: int) -> dict[str, Any]:
    """kvlib's medians over triton's do_bench (cold) and torch's Timer (warm), same copy."""
    from torch.utils.benchmark import Timer

    copy = w.copy(size, run.device)
    out: dict[str, Any] = {"bytes_copied": size}
    timer_ratios = []
    for _ in range(3):
        ours = bench(copy.fn, device=run.device, cache="warm", rep_s=run.rep_s)
        theirs = Timer("fn()", globals={"fn": copy.fn}).blocked_autorange(min_run_time=run.rep_s)
        timer_ratios.append(ours.median_s / theirs.median)
    out["over_torch_timer_warm"] = statistics.median(timer_ratios)
    try:
        import triton.testing
    except ImportError:
        out["over_triton_do_bench_cold"] = None
        out["triton"] = "not installed"
        return out
    ratios = []
    for _ in range(3):
        ours = bench(copy.fn, device=run.device, rep_s=run.rep_s)
        ms = triton.testing.do_bench(copy.fn, warmup=25, rep=100, quantiles=[0.5])
        ms = ms[0] if isinstance(ms, list | tuple) else ms
        ratios.append(ours.median_s / (float(ms) / 1e3))
    out["over_triton_do_bench_cold"] = statistics.median(ratios)
    return out


def run_checks(device: str, profile: str = "full") -> dict[str, Any]:
    """Every measurement on ``device`` as one JSON-ready dict (tests use ``profile='tiny'``)."""
    from kvlib.hardware import gpu_from_torch_name
    from kvlib.timing.devices import device_name

    p = PROFILES[profile]
    started = time.monotonic()
    on_gpu = device.startswith("cuda")
    facts = cuda_device_facts(device) if on_gpu else {"type": "cpu", "name": device_name(device)}
    try:
        spec = gpu_from_torch_name(facts["name"]) if on_gpu else None
    except KeyError:
        spec = None
    run = Run(device, p["rep_s"])
    doc: dict[str, Any] = {
        "schema": records.SCHEMA,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": facts,
        "clocks_before": nvidia_smi(int(facts.get("index", 0))) if on_gpu else None,
        "datasheet": None if spec is None else {
            "gpu": spec.name, "hbm_bandwidth_bytes_per_s": spec.hbm_bandwidth_bytes_per_s,
            "bf16_dense_flops_per_s": spec.bf16_dense_flops_per_s, "source": spec.source},
        "harness": {"rep_s": p["rep_s"], "warmup_s": 0.025, "cache": "cold unless stated",
                    "statistic": "median; p20 and p80 beside it"},
        "profile": profile,
    }  # fmt: skip
    for section in (bandwidth_section, kv_read_section, compute_section):
        section(run, p)
    doc["overhead"] = overhead_section(run)
    doc["unsynchronised"] = unsynchronised(run, p["agreement_bytes"])
    doc["agreement"] = agreement(run, p["agreement_bytes"])
    doc["measurements"] = run.measurements
    doc["skipped"] = run.skipped
    doc["summary"] = records.summarise(
        run.measurements, f"copy/{max(p['copy_bytes'])}", GOAL_KV_READ_OVER_COPY
    )
    doc["clocks_after"] = nvidia_smi(int(facts.get("index", 0))) if on_gpu else None
    doc["elapsed_s"] = time.monotonic() - started
    return doc


def default_out(name: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return ROOT / "book" / "data" / f"gpu_{slug}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON path (default book/data/gpu_<device>.json)")
    parser.add_argument("--device", default="cuda", help="a CUDA device: cuda or cuda:N (cuda)")
    args = parser.parse_args(argv)
    import torch

    if not args.device.startswith("cuda") or not torch.cuda.is_available():
        print("gpu_check: error: no CUDA GPU here (torch.cuda.is_available() is "
              f"{torch.cuda.is_available()}, --device {args.device}). This script measures a "
              "GPU and never records CPU times; run it on a machine with an NVIDIA GPU and a "
              "CUDA build of torch.", file=sys.stderr)  # fmt: skip
        return 2
    doc = run_checks(args.device)
    out = args.out or default_out(doc["device"]["name"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    records.read_run(out)  # the book must be able to read what was written
    s = doc["summary"]
    print(f"{doc['device']['name']}: {len(doc['measurements'])} measurements in "
          f"{doc['elapsed_s']:.0f} s -> {out}")  # fmt: skip
    if "kv_read_over_copy" in s:
        verdict = "met" if s["goal_met"] else "NOT met"
        print(f"KV read ({s['best_kv_read']}) at {s['kv_read_over_copy']:.0%} of the copy's "
              f"bandwidth; goal {GOAL_KV_READ_OVER_COPY:.0%} {verdict}")  # fmt: skip
    for item in doc["skipped"]:
        print(f"skipped {item['name']}: {item['reason']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
