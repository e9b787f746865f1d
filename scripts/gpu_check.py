"""Every GPU measurement of chapter 6 in one command, written to one JSON file as it goes.

Usage::

    python scripts/gpu_check.py [--out FILE | --out-dir DIR] [--budget-s 240]
    python scripts/gpu_check.py --rehearse --out /tmp/r.json [--fail-section NAME]
    python scripts/gpu_check.py --summarize FILE

On one CUDA GPU, with kvlib's harness (CUDA events, a flush that reads
``max(4 x L2, 256 MiB)`` before each repetition unless stated, medians, every
repetition's time kept), in sections:

- ``preflight``: Python, torch, CUDA, triton and driver versions, the device
  and its L2, memory from torch and nvidia-smi, the optional features present
  (SDPA backends, ``enable_gqa``, fp8 matmuls, flex_attention's PagedAttention,
  triton, NVML, ncu);
- ``warmup``: bf16 matmuls for 1.5 s before anything is timed (an idle GPU's
  clocks are far below its loaded ones), with the clocks read before and after;
- ``bandwidth``: device-to-device copies, ``torch.sum`` and a Triton streaming
  read (the read reference is the faster), every size at least the cold-cache
  rule ``max(4 x L2, 256 MiB)``;
- ``l2_probe``: a copy inside the L2 and one of the rule's size, warm and cold;
- ``kv_read``: decode attention over a contiguous KV cache, in each SDPA
  backend, as grouped matrix products and as a Triton kernel (goal: 90% of the
  read stream);
- ``paged_kv_read``: the same read through a block table (blocks of 16 and
  64), by kernels that read the blocks in place: torch's ``PagedAttention`` on
  ``flex_attention`` and the Triton kernel, beside the contiguous read;
- ``fp8``: ``torch._scaled_mm`` at the square shape, and a decode read of an
  fp8 KV cache (Triton);
- ``decode_sweep``: decode attention over batch and context, each point's cache
  at least the rule's size;
- ``compute``: bf16 matmuls from decode-like to prefill-like shapes (roofline;
  stacked weights so that each moves at least the rule's bytes), then a
  sustained square matmul of several seconds with the clocks read before and
  after (the peak);
- ``overhead``: a one-element kernel, warm and cold;
- ``unsynchronised``: a host clock without ``synchronize`` (the mistake);
- ``agreement``: kvlib's medians against ``triton.testing.do_bench`` (on the
  copy and on the KV read, every repetition of both kept) and
  ``torch.utils.benchmark.Timer``;
- ``ncu``: where Nsight Compute can read the counters, ``dram__bytes_read.sum``
  and ``dram__bytes_write.sum`` of the copy, the KV read and the matvec, beside
  the bytes the course counts.

Every timed kernel's output is checked against a reference (float32 math, the
contiguous cache) before its time is recorded: a mismatch is a failed
measurement, never a number. Every timed kernel moves at least the rule's
bytes, except the probes meant to fit in the L2 and the one-element kernel.

The file is rewritten (atomically) after every measurement. Each section runs
under its own guard: an exception is recorded with its type, message and the
section's settings, and the next section runs. A section that needs a missing
feature is skipped with the reason, and no section starts once ``--budget-s``
is spent. Clocks and throttle reasons are sampled during the heavy sections
(NVML, else nvidia-smi by PCI bus id). The last line printed is the summary.

``--rehearse`` runs every section on the CPU at tiny sizes through the same
code, with the device calls (synchronise, memory, clocks, do_bench) swapped
for CPU stand-ins; the file says ``"rehearsal": true`` and the book refuses
it. ``--fail-section NAME`` raises inside that section after its first result,
to show that the rest of the run survives. Exit status: 0 when every section
ran or was skipped, 1 when one failed, 2 when refused (no GPU and no
``--rehearse``), 3 when interrupted.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

# The budget counts from here: torch's import and CUDA's start-up are part of the run.
PROCESS_START = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]
# `python scripts/gpu_check.py` puts scripts/, not the repository, on sys.path: add the
# repository so that `course` and `kvlib` import on a machine where neither is installed.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from course.book import gpu_runs as records  # noqa: E402
from kvlib.timing import bench  # noqa: E402
from kvlib.timing import devices as dev  # noqa: E402
from kvlib.timing import kernels as tk  # noqa: E402
from kvlib.timing import workloads as w  # noqa: E402
from kvlib.units import GiB, KiB, MiB  # noqa: E402

GOAL_KV_READ_OVER_STREAM = 0.9
# Default budget: the whole check, start-up included; with device_check.sh's hard limit
# (45 s more) the run stays under five minutes of device time.
BUDGET_S = 240.0
# What the end of the run needs after the last section starts: the final write and summary.
_RESERVE_S = 5.0
# Flushes, "cold" probes and every timed kernel's traffic are at least this many L2s (and
# do_bench's 256 MiB): kvlib.timing.devices.cold_cache_bytes, the harness's own rule.
L2_FACTOR = dev.COLD_CACHE_FACTOR
# Assumed when neither the device nor kvlib.hardware knows the L2: larger than any GPU's.
UNKNOWN_L2_BYTES = 128 * MiB
KV_SHAPE = {"heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bf16"}  # Llama-3.1-8B
PAGED_BLOCK_SIZES = (16, 64)  # vLLM's default block size, and DeepSeek-V3.2's in vLLM
SDPA_BACKENDS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-math": "MATH",
}
SECTIONS = (
    "preflight",
    "warmup",
    "bandwidth",
    "l2_probe",
    "kv_read",
    "paged_kv_read",
    "fp8",
    "decode_sweep",
    "compute",
    "overhead",
    "unsynchronised",
    "agreement",
    "ncu",
)
# Sections long and heavy enough for the clocks to move: sampled while they run.
HEAVY_SECTIONS = frozenset(
    {"warmup", "bandwidth", "kv_read", "paged_kv_read", "fp8", "decode_sweep", "compute"}
)
# A section that cannot run at all without a feature is skipped with the reason.
SECTION_NEEDS = {"fp8": ("fp8_matmul",), "ncu": ("ncu",)}
# Nsight Compute's DRAM counters (bytes read from and written to device memory).
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
NCU_TARGETS = ("copy", "kv-read", "matvec")
NCU_TIMEOUT_S = 60.0
# torch.compile of flex_attention takes tens of seconds: not started with less budget left.
FLEX_COMPILE_MIN_LEFT_S = 120.0

PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "stream_bytes": (GiB, 4 * GiB),  # copies, after the rule's size
        "read_bytes": 4 * GiB,
        "kv_read": {"batch": 64, "context_tokens": 8192},  # 2 GiB of K and V
        # (batch, context) asked for; a point whose cache is under the rule's size gets a
        # longer context (batch 1 at 8,192 tokens is 32 MiB, under an H200's L2).
        "decode_sweep": ((1, 8192), (8, 8192), (32, 4096), (128, 2048), (256, 1024)),
        "matmul_nk": 8192,
        "matmul_ms": tuple(2**i for i in range(14)),  # 1 ... 8192 tokens
        "square": 8192,
        "sustained_s": 3.0,  # the peak: a few seconds, long enough for clocks to settle
        "fp8_square": 8192,
        "agreement_bytes": GiB,
        "rep_s": 0.1,
        "warmup_s": 0.025,
        "warmup_run_s": 1.5,  # the warm-up section, before anything is timed
        "min_flush_bytes": dev.FALLBACK_FLUSH_BYTES,  # never less than do_bench's 256 MiB
        "stand_in_l2_bytes": None,
        "clock_interval_s": 0.5,
        "compile_flex": True,
    },
    # The rehearsal on a CPU: the same code path at tiny sizes; the "L2" is a stand-in so
    # that every size is derived from it as on the GPU.
    "tiny": {
        "stream_bytes": (MiB, 2 * MiB),
        "read_bytes": 2 * MiB,
        "kv_read": {"batch": 2, "context_tokens": 128},
        "decode_sweep": ((1, 128),),
        "matmul_nk": 64,
        "matmul_ms": (1, 64),
        "square": 64,
        "sustained_s": 0.05,
        "fp8_square": 64,
        "agreement_bytes": MiB,
        "rep_s": 0.002,
        "warmup_s": 0.001,
        "warmup_run_s": 0.02,
        "min_flush_bytes": 0,
        "stand_in_l2_bytes": 256 * KiB,
        "clock_interval_s": 0.01,
        "compile_flex": False,  # the eager flex_attention: the same result, no compiler
    },
}


class RehearsedFailure(RuntimeError):
    """Raised inside the section named by ``--fail-section``."""


class Interrupted(BaseException):
    """SIGTERM (the device tool's timeout) or Ctrl-C: end the run, keep the file."""


# --------------------------------------------------------------------------- device calls


class CudaCalls:
    """The calls that touch the GPU, in one place so a rehearsal can swap them."""

    rehearsal = False

    def __init__(self, device: str) -> None:
        self.device = str(dev.resolve_device(device))

    def facts(self) -> dict[str, Any]:
        return dev.cuda_device_facts(self.device)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Give cached blocks back to the driver between sections."""
        import torch

        torch.cuda.empty_cache()

    def mem_get_info(self) -> dict[str, int]:
        import torch

        free, total = torch.cuda.mem_get_info(self.device)
        return {"free_bytes": int(free), "total_bytes": int(total)}

    def smi(self, facts: dict[str, Any], fields: str) -> dict[str, str]:
        return dev.nvidia_smi(facts.get("pci_bus_id") or facts["index"], fields=fields)

    def clock_reader(self, facts: dict[str, Any]) -> tuple[str, Callable[[], dict[str, Any]]]:
        return dev.clock_reader(str(facts.get("pci_bus_id") or facts["index"]))

    def do_bench(self, fn: Callable[[], object], warmup_ms: int, rep_ms: int) -> list[float]:
        """Every repetition's milliseconds by ``triton.testing.do_bench`` (which zeroes
        256 MiB before each), ``return_mode="all"`` (triton ``python/triton/testing.py``)."""
        import triton.testing

        times = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
        return [float(t) for t in times]


class RehearsalCalls(CudaCalls):
    """CPU stand-ins for :class:`CudaCalls`; every reading says it is a rehearsal."""

    rehearsal = True

    def __init__(self, device: str = "cpu") -> None:
        self.device = "cpu"

    def facts(self) -> dict[str, Any]:
        return {
            "type": "cpu",
            "name": dev.device_name("cpu"),
            "rehearsal": True,
            "index": 0,
            "pci_bus_id": None,
            "driver": None,
        }

    def synchronize(self) -> None:
        """The CPU has finished when its call returns."""

    def release(self) -> None:
        """Nothing is cached on the CPU."""

    def mem_get_info(self) -> dict[str, int]:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return {"free_bytes": pages * size, "total_bytes": os.sysconf("SC_PHYS_PAGES") * size}

    def smi(self, facts: dict[str, Any], fields: str) -> dict[str, str]:
        return {"rehearsal": "no nvidia-smi on a rehearsal"}

    def clock_reader(self, facts: dict[str, Any]) -> tuple[str, Callable[[], dict[str, Any]]]:
        started = time.monotonic()

        def read() -> dict[str, Any]:
            return {
                "t_s": round(time.monotonic() - started, 3),
                "sm_mhz": None,
                "mem_mhz": None,
                "temperature_c": None,
                "power_w": None,
                "reasons": None,
            }

        return "rehearsal (no GPU clocks)", read

    def do_bench(self, fn: Callable[[], object], warmup_ms: int, rep_ms: int) -> list[float]:
        """A host-clock stand-in for do_bench, so the agreement code runs on a CPU."""
        times_ms, deadline = [], time.perf_counter() + rep_ms / 1e3
        while time.perf_counter() < deadline or len(times_ms) < 5:
            start = time.perf_counter()
            fn()
            times_ms.append((time.perf_counter() - start) * 1e3)
        return times_ms


# --------------------------------------------------------------------------- the file


def write_json_atomic(path: Path, doc: dict[str, Any], indent: int | None = 1) -> None:
    """Write ``doc`` to a temporary file beside ``path``, then rename it over ``path``.

    A reader (or a run killed mid-write) sees the old file or the new one, never half.
    ``indent=None`` writes one line: json's C encoder, whereas an indented document goes
    through its pure-Python one (a third of a CPU rehearsal's time, rewritten after each
    of its 70 measurements).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(doc, indent=indent, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class ClockSampler:
    """Reads the clocks every ``interval_s`` on a thread while a section runs."""

    MAX_SAMPLES = 240

    def __init__(self, read: Callable[[], dict[str, Any]], source: str, interval_s: float):
        self.read, self.source, self.interval_s = read, source, interval_s
        self.samples: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set() and len(self.samples) < self.MAX_SAMPLES:
            try:
                self.samples.append(self.read())
            except Exception as exc:  # a failed reading must never fail the section
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                if len(self.errors) > 3:
                    return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self) -> dict[str, Any]:
        """Min, median and max of each reading, and every reason the clocks were held down."""
        out: dict[str, Any] = {
            "source": self.source,
            "samples": len(self.samples),
            "interval_s": self.interval_s,
        }
        for key in ("sm_mhz", "mem_mhz", "temperature_c", "power_w"):
            values = [s[key] for s in self.samples if isinstance(s.get(key), int | float)]
            if values:
                out[key] = {
                    "min": min(values),
                    "median": statistics.median(values),
                    "max": max(values),
                }
        reasons = {r for s in self.samples for r in (s.get("reasons") or [])}
        out["reasons_seen"] = sorted(reasons)
        if self.errors:
            out["errors"] = self.errors
        out["readings"] = self.samples
        return out


class Check:
    """One run of the check: the document, its file, the budget, the failure to inject."""

    def __init__(
        self,
        calls: CudaCalls,
        profile: str,
        out: Path,
        budget_s: float,
        fail_section: str | None = None,
        argv: list[str] | None = None,
        started: float | None = None,
    ) -> None:
        self.calls, self.out, self.p = calls, out, PROFILES[profile]
        self.started = time.monotonic() if started is None else started
        self.deadline = self.started + budget_s - _RESERVE_S
        self.fail_section = fail_section
        self.current: str | None = None
        # Replaced by the preflight's facts; enough for the file to say what ran it if not.
        self.facts: dict[str, Any] = {
            "type": "cpu" if calls.rehearsal else "cuda",
            "name": device_label(calls),
            "rehearsal": calls.rehearsal,
        }
        self.features: dict[str, Any] = {}
        self.sizes: dict[str, Any] = {}
        self.doc: dict[str, Any] = {
            "schema": records.SCHEMA,
            "rehearsal": calls.rehearsal,
            "status": "running",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": argv or [],
            "profile": profile,
            "budget_s": budget_s,
            "device": self.facts,
            "datasheet": None,
            "preflight": {},
            "sizes": self.sizes,
            "harness": {
                "rep_s": self.p["rep_s"],
                "warmup_s": self.p["warmup_s"],
                "cache": "cold unless stated",
                "statistic": "median; p20 and p80 beside it",
            },
            "sections": {name: {"status": "pending"} for name in SECTIONS},
            "measurements": [],
            "failed_measurements": [],
            "skipped": [],
            "results": {},
            "summary": {},
            "elapsed_s": 0.0,
        }

    # The file ------------------------------------------------------------------------

    def save(self) -> None:
        """Recompute the summary and rewrite the file: it is valid JSON after every step, on
        one line while the run goes on, indented for a reader once it has ended."""
        self.doc["elapsed_s"] = round(time.monotonic() - self.started, 3)
        copies = [m for m in self.doc["measurements"] if m["name"].startswith("copy/")]
        largest = max(copies, key=lambda m: m["settings"]["bytes_copied"], default=None)
        self.doc["summary"] = records.summarise(
            self.doc["measurements"],
            largest["name"] if largest else "copy/none",
            GOAL_KV_READ_OVER_STREAM,
        )
        ended = self.doc["status"] in ("complete", "interrupted")
        write_json_atomic(self.out, self.doc, indent=1 if ended else None)

    def result(self) -> None:
        """Save after a result; inside the ``--fail-section`` section, then raise."""
        self.save()
        if self.current is not None and self.current == self.fail_section:
            self.fail_section = None  # once
            raise RehearsedFailure(
                f"--fail-section {self.current}: raised after its first "
                "result, to check that the other sections survive"
            )

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def settings(self, values: dict[str, Any]) -> None:
        """Record the current section's settings before it does any work."""
        assert self.current is not None
        self.doc["sections"][self.current]["settings"] = values
        self.save()

    # Measurements ----------------------------------------------------------------------

    def skip(self, name: str, reason: str) -> None:
        self.doc["skipped"].append({"name": name, "section": self.current, "reason": reason})
        self.save()

    def time(
        self,
        name: str,
        build: Callable[[], Any],
        settings: dict[str, Any],
        cache: str = "cold",
        small: bool = False,
        rep_s: float | None = None,
        flush: str = "read",
    ) -> dict[str, Any] | None:
        """Build the workload, check its size and its output, time it, record it.

        A workload moving less than the cold-cache rule's bytes is refused unless
        ``small`` (a probe meant to fit in the L2); its output must match its
        reference first. Any failure is recorded as a failed measurement, not raised.
        """
        if self.out_of_time():
            self.skip(name, "time budget spent (--budget-s)")
            return None
        try:
            workload = build()
            if not small:
                require_traffic(workload, self.sizes["min_traffic_bytes"])
            checked = w.check_output(workload)
            result = bench(
                workload.fn,
                device=self.calls.device,
                cache=cache,
                rep_s=self.p["rep_s"] if rep_s is None else rep_s,
                warmup_s=self.p["warmup_s"],
                flush_bytes=self.sizes.get("flush_bytes"),
                flush=flush,
            )
            record = records.measurement_record(name, workload, result, settings)
        except Exception as exc:
            self.doc["failed_measurements"].append(
                {
                    "name": name,
                    "section": self.current,
                    "settings": settings,
                    "type": type(exc).__name__,
                    "message": str(exc)[:500],
                }
            )
            self.save()
            self._release()  # after an out-of-memory error, the next measurement starts clean
            return None
        finally:
            workload = None  # free the device memory before the next measurement
        record["output_check"] = checked
        record["section"] = self.current
        if self.calls.rehearsal:
            record["rehearsal"] = True
        self.doc["measurements"].append(record)
        self.result()
        return record

    def _release(self) -> None:
        try:
            self.calls.release()
        except Exception as exc:
            self.doc.setdefault("release_errors", []).append(f"{type(exc).__name__}: {exc}")

    def needs(self, feature: str) -> str | None:
        """None when ``feature`` is present, else why not (from the preflight)."""
        found = self.features.get(feature)
        if found is None and feature in FEATURE_PROBES:
            # The preflight did not get this far: ask now, what a missing feature costs is a
            # section, never the run.
            found = self.features[feature] = FEATURE_PROBES[feature](self)
        if found is None:
            return None  # unknown (the preflight failed): try, and let the guard record it
        if found.get("available"):
            return None
        return f"{feature} not available: {found.get('reason', 'absent')}"


class TooLittleTraffic(ValueError):
    """A timed kernel moves less than the cold-cache rule: its time would include L2 hits."""


def require_traffic(workload: w.Kernel, min_bytes: int) -> None:
    """Refuse ``workload`` if it moves fewer than ``min_bytes`` (``max(4 x L2, 256 MiB)``)."""
    if workload.bytes_moved < min_bytes:
        raise TooLittleTraffic(
            f"{workload.name} moves {workload.bytes_moved:,} bytes, under the cold-cache rule's "
            f"{min_bytes:,} (max(4 x L2, 256 MiB)): make it larger"
        )


# --------------------------------------------------------------------------- sections


def _probe(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``{"error": ...}``: one missing fact never loses the others."""
    try:
        return fn()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _feature(fn: Callable[[], object]) -> dict[str, Any]:
    """``{"available": True}`` if ``fn()`` runs, else False with the reason."""
    try:
        fn()
    except Exception as exc:
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}
    return {"available": True}


def _tiny_sdpa(device: str, backend: str | None = None, gqa: bool = True) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = torch.float32 if device == "cpu" else torch.bfloat16
    q = torch.randn(1, 2 if gqa else 1, 1, 64, dtype=kind, device=device)
    k = torch.randn(1, 1, 16, 64, dtype=kind, device=device)
    if backend is None:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=gqa)
        return
    with sdpa_kernel(getattr(SDPBackend, backend)):
        F.scaled_dot_product_attention(q, k, k, enable_gqa=gqa)


def _fp8(calls: CudaCalls) -> dict[str, Any]:
    """fp8 matmuls: ``torch._scaled_mm`` on tensor cores of compute capability 8.9 or more."""
    import torch

    if calls.rehearsal:
        return {"available": False, "reason": "a CPU has no fp8 tensor cores (torch._scaled_mm "
                "on a CPU is an emulation): the fp8 figures need a GPU of capability 8.9+"}
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return {"available": False, "reason": "this torch has no float8_e4m3fn or _scaled_mm"}
    major, minor = torch.cuda.get_device_capability(calls.device)
    if (major, minor) < (8, 9):
        return {"available": False, "reason": f"compute capability {major}.{minor} < 8.9: "
                "no fp8 tensor cores"}
    w.check_output(w.scaled_mm(16, 16, 16, calls.device))
    return {"available": True, "capability": f"{major}.{minor}"}


def _flex_paged(device: str) -> None:
    """torch's PagedAttention on flex_attention, eager, at the smallest size."""
    w.check_output(
        w.paged_decode_attention_flex(1, 16, 2, 1, 16, "fp32", 16, device, compile=False)
    )


def _triton() -> dict[str, Any]:
    try:
        import triton
    except ImportError as exc:
        return {"available": False, "reason": f"triton not importable: {exc}"}
    return {"available": True, "version": triton.__version__}


def _triton_kernels(device: str) -> dict[str, Any]:
    missing = tk.triton_missing(device)
    return {"available": True} if missing is None else {"available": False, "reason": missing}


def _ncu(calls: CudaCalls) -> dict[str, Any]:
    if calls.rehearsal:
        return {"available": False, "reason": "a rehearsal profiles no GPU counters"}
    path = shutil.which("ncu")
    if path is None:
        return {"available": False, "reason": "Nsight Compute (ncu) is not on PATH"}
    return {"available": True, "path": path}


def _nvml() -> dict[str, Any]:
    try:
        import pynvml  # type: ignore[import-not-found]  # from nvidia-ml-py, optional
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py (pynvml) not installed"}
    return {"available": True, "module": getattr(pynvml, "__file__", "pynvml")}


def _nvml_driver() -> str | None:
    """The driver version as NVML reports it, or None without nvidia-ml-py."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    version = pynvml.nvmlSystemGetDriverVersion()
    return version.decode() if isinstance(version, bytes) else str(version)


def _l2_bytes(check: Check) -> tuple[int, str]:
    """The L2 every size is derived from, and where it came from."""
    stand_in = check.p["stand_in_l2_bytes"]
    if stand_in is not None:
        return int(stand_in), "rehearsal stand-in"
    if isinstance(check.facts.get("l2_bytes"), int) and check.facts["l2_bytes"] > 0:
        return int(check.facts["l2_bytes"]), "cudaDeviceProp.l2CacheSize"
    from kvlib.hardware import gpu_from_torch_name

    try:
        known = gpu_from_torch_name(str(check.facts.get("name"))).l2_bytes
    except KeyError:
        known = None
    if known:
        return int(known), "kvlib.hardware row"
    return UNKNOWN_L2_BYTES, "unknown: assumed"


def kv_cache_bytes(batch: int, context_tokens: int, shape: dict[str, Any] = KV_SHAPE) -> int:
    """K and V of ``batch`` sequences of ``context_tokens`` at ``shape`` (bf16: 2 bytes)."""
    return 2 * batch * shape["kv_heads"] * context_tokens * shape["head_dim"] * 2


def plan_sizes(p: dict[str, Any], l2_bytes: int) -> dict[str, Any]:
    """Every size for an L2 of ``l2_bytes``, from one rule: ``max(4 x L2, 256 MiB)``.

    The flush reads that much; every timed kernel moves at least that much
    (copies, reads, KV caches, stacked matmul weights); the cold probe is that
    large and the in-L2 probe a quarter of the L2. A decode-sweep point whose
    cache is smaller keeps its batch and gets a longer context (a whole multiple
    of the one asked, so block sizes still divide it).
    """
    rule = dev.cold_cache_bytes(l2_bytes, p["min_flush_bytes"])
    streams = sorted({rule, *(size for size in p["stream_bytes"] if size > rule)})
    sweep = []
    for batch, context in p["decode_sweep"]:
        factor = -(-rule // kv_cache_bytes(batch, context))
        sweep.append((batch, context * max(1, factor)))
    weight_bytes = p["matmul_nk"] * p["matmul_nk"] * 2  # one bf16 weight matrix
    return {
        "l2_bytes": l2_bytes,
        "rule": f"max({L2_FACTOR} x L2, {p['min_flush_bytes']:,} bytes)",
        "min_traffic_bytes": rule,
        "flush_bytes": rule,
        "flush": "read",
        "copy_bytes": streams,
        "read_bytes": max(p["read_bytes"], rule),
        "probe_in_l2_bytes": l2_bytes // 4,
        "probe_cold_bytes": rule,
        "agreement_bytes": max(p["agreement_bytes"], rule),
        "decode_sweep": sweep,
        "matmul_layers": max(1, -(-rule // weight_bytes)),
    }


def ensure_sizes(check: Check) -> None:
    """Sizes from the device's L2 if the preflight did not get as far as planning them."""
    if "flush_bytes" in check.sizes:
        return
    try:
        l2, source = _l2_bytes(check)
    except Exception as exc:
        l2, source = UNKNOWN_L2_BYTES, f"unknown ({type(exc).__name__}): assumed"
    check.sizes.update(plan_sizes(check.p, l2), l2_source=source)


def preflight(check: Check) -> None:
    """Versions, device, memory and features, written first."""
    import torch

    calls = check.calls
    check.settings(
        {
            "device": calls.device,
            "profile": check.doc["profile"],
            "sdpa_backends": list(SDPA_BACKENDS),
        }
    )
    check.facts.update(calls.facts())
    pre: dict[str, Any] = check.doc["preflight"]
    pre["python"] = {"version": platform.python_version(), "executable": sys.executable}
    pre["torch"] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _probe(torch.backends.cudnn.version),
    }
    pre["numpy"] = _probe(lambda: __import__("numpy").__version__)
    pre["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    pre["device"] = dict(check.facts)
    pre["driver"] = {
        "nvidia_smi": check.facts.get("driver"),
        "nvml": _probe(_nvml_driver),
        "cuda_driver_api": _probe(lambda: torch._C._cuda_getDriverVersion()),
    }
    if not calls.rehearsal:
        props = torch.cuda.get_device_properties(calls.device)
        pre["device_properties"] = {
            k: _probe(partial(getattr, props, k)) for k in dir(props) if not k.startswith("_")
        }
    pre["memory"] = {
        "torch_mem_get_info": _probe(calls.mem_get_info),
        "nvidia_smi": _probe(
            lambda: calls.smi(check.facts, "memory.total,memory.used,memory.free")
        ),
    }
    l2, source = _l2_bytes(check)
    check.sizes.update(plan_sizes(check.p, l2), l2_source=source)
    check.result()  # versions and sizes are on file before any feature is probed
    device = calls.device
    feats: dict[str, Any] = {"enable_gqa": _feature(partial(_tiny_sdpa, device))}
    for impl, backend in SDPA_BACKENDS.items():
        feats[impl] = _feature(partial(_tiny_sdpa, device, backend, gqa=False))
    feats["flex_paged"] = _feature(partial(_flex_paged, device))
    feats.update(
        fp8=_fp8_dtypes(),
        fp8_matmul=_probe_feature(partial(_fp8, calls)),
        triton=_triton(),
        triton_kernels=_triton_kernels(device),
        nvml=_nvml(),
        ncu=_ncu(calls),
    )
    check.features.update(feats)
    pre["features"] = feats
    _datasheet(check)
    check.result()


def _fp8_dtypes() -> dict[str, Any]:
    import torch

    names = [n for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
    if not names:
        return {"available": False, "reason": "this torch has no float8 dtypes"}
    return {"available": True, "dtypes": names}


def _probe_feature(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()``'s verdict, or unavailable with the exception that stopped it."""
    try:
        return fn()
    except Exception as exc:
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}


def _datasheet(check: Check) -> None:
    from kvlib.hardware import gpu_from_torch_name

    if check.calls.rehearsal:
        return
    try:
        spec = gpu_from_torch_name(str(check.facts["name"]))
    except KeyError:
        return
    check.doc["datasheet"] = {
        "gpu": spec.name,
        "source": spec.source,
        "hbm_bandwidth_bytes_per_s": spec.hbm_bandwidth_bytes_per_s,
        "bf16_dense_flops_per_s": spec.bf16_dense_flops_per_s,
        "fp8_dense_flops_per_s": spec.fp8_dense_flops_per_s,
        "l2_bytes": spec.l2_bytes,
    }


def _read_clocks(check: Check) -> dict[str, Any]:
    """One reading of the clocks now, or the error that stopped it."""
    try:
        _, read = check.calls.clock_reader(check.facts)
        return read()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def warmup(check: Check) -> None:
    """Square bf16 matmuls back to back for ``warmup_run_s``: clocks up before any timing."""
    sq = check.p["square"]
    seconds = check.p["warmup_run_s"]
    check.settings({"m": sq, "n": sq, "k": sq, "dtype": "bf16", "seconds": seconds})
    out: dict[str, Any] = check.doc["results"].setdefault("warmup", {})
    out["clocks_before"] = _read_clocks(check)
    check.save()
    mm = w.matmul(sq, sq, sq, "bf16", check.calls.device)
    started, calls = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        for _ in range(8):
            mm.fn()
        check.calls.synchronize()
        calls += 8
    out.update(
        seconds=round(time.monotonic() - started, 3),
        matmuls=calls,
        clocks_after=_read_clocks(check),
    )
    check.result()


def bandwidth(check: Check) -> None:
    s = check.sizes
    triton_missing = check.needs("triton_kernels")
    check.settings(
        {
            "copy_bytes": s["copy_bytes"],
            "read_bytes": s["read_bytes"],
            "flush_bytes": s["flush_bytes"],
            "counting": "copy 2N, read N",
            "read_kernels": ["torch.sum", *(f"triton {c}" for c in tk.STREAM_READ_CONFIGS)],
        }
    )
    for size in s["copy_bytes"]:
        check.time(
            f"copy/{size}",
            partial(w.copy, size, check.calls.device),
            {"bytes_copied": size, "counting": "read + write (2N)"},
        )
    check.time(
        "read",
        partial(w.read, s["read_bytes"], check.calls.device),
        {"bytes": s["read_bytes"], "counting": "read (N)", "kernel": "torch.sum"},
    )
    for block, iters, warps in tk.STREAM_READ_CONFIGS:
        name = f"read-triton/{block}x{iters}w{warps}"
        if triton_missing:
            check.skip(name, triton_missing)
            continue
        check.time(
            name,
            partial(tk.stream_read, s["read_bytes"], check.calls.device, (block, iters, warps)),
            {"bytes": s["read_bytes"], "counting": "read (N)", "kernel": "triton",
             "block": block, "iters": iters, "warps": warps},
        )


def l2_probe(check: Check) -> None:
    """A copy that fits in the L2 and one of the rule's size, each warm and cold."""
    s = check.sizes
    sizes = {"in-l2": s["probe_in_l2_bytes"], "beyond-l2": s["probe_cold_bytes"]}
    check.settings({**{f"{k}_bytes": v for k, v in sizes.items()}, "l2_bytes": s["l2_bytes"]})
    for label, size in sizes.items():
        for cache in ("warm", "cold"):
            check.time(
                f"l2-probe/{label}/{cache}",
                partial(w.copy, size, check.calls.device),
                {"bytes_copied": size, "cache": cache},
                cache=cache,
                small=label == "in-l2",
            )


def _sdpa_backend(impl: str, workload: w.Kernel) -> w.Kernel:
    """The workload with ``scaled_dot_product_attention`` held to one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, SDPA_BACKENDS[impl])

    def fn() -> object:
        with sdpa_kernel(backend):
            return workload.fn()

    fn()  # an unsupported shape raises here, before any timing
    return dataclasses.replace(workload, fn=fn, description=f"{workload.description}, {impl}")


def kv_read(check: Check) -> None:
    shape = {**KV_SHAPE, **check.p["kv_read"]}
    impls = ("sdpa", "matmul", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "triton")
    check.settings({**shape, "impls": impls, "output_check": "float32 reference"})
    for impl in impls:
        name = f"kv-read/{impl}"
        if impl == "triton":
            missing = check.needs("triton_kernels")
        else:
            missing = check.needs("enable_gqa") if impl != "matmul" else None
            missing = missing or (check.needs(impl) if impl.startswith("sdpa-") else None)
        if missing:
            check.skip(name, missing)
            continue

        def build(impl: str = impl) -> w.Kernel:
            if impl == "triton":
                return tk.paged_decode(**shape, block_size=None, device=check.calls.device)
            base = "matmul" if impl == "matmul" else "sdpa"
            workload = w.decode_attention(**shape, device=check.calls.device, impl=base)
            return workload if impl in ("sdpa", "matmul") else _sdpa_backend(impl, workload)

        check.time(name, build, {**shape, "impl": impl})


def paged_kv_read(check: Check) -> None:
    """The KV read through a block table, by kernels that read each block where it lies."""
    shape = {**KV_SHAPE, **check.p["kv_read"]}
    compiled = check.p["compile_flex"]
    impls = {
        "flex": "torch PagedAttention + flex_attention" + (" (compiled)" if compiled else ""),
        "triton": "Triton block-table decode kernel",
    }
    check.settings({**shape, "block_sizes": PAGED_BLOCK_SIZES, "impls": impls,
                    "contiguous": "kv-read/* (same shape, one block per sequence)"})
    for impl in ("triton", "flex"):  # flex last: its first call compiles for a while
        missing = check.needs("flex_paged" if impl == "flex" else "triton_kernels")
        left_s = check.deadline - time.monotonic()
        if impl == "flex" and compiled and left_s < FLEX_COMPILE_MIN_LEFT_S:
            missing = missing or (f"{left_s:.0f} s of budget left, under "
                                  f"{FLEX_COMPILE_MIN_LEFT_S:.0f} s: torch.compile of "
                                  "flex_attention is not started")
        for block in PAGED_BLOCK_SIZES:
            name = f"kv-read-paged/{impl}-{block}"
            if missing:
                check.skip(name, missing)
                continue
            if impl == "flex":
                build = partial(w.paged_decode_attention_flex, **shape, block_size=block,
                                device=check.calls.device, compile=compiled)
            else:
                build = partial(tk.paged_decode, **shape, block_size=block,
                                device=check.calls.device)
            check.time(name, build, {**shape, "block_size": block, "impl": impls[impl]})


def fp8(check: Check) -> None:
    """fp8 e4m3: the matmul peak by ``torch._scaled_mm``, and a decode read of an fp8 cache."""
    sq = check.p["fp8_square"]
    shape = {**KV_SHAPE, **check.p["kv_read"], "dtype": "fp8"}
    check.settings({"scaled_mm": {"m": sq, "n": sq, "k": sq}, "kv_read": shape,
                    "scales": "one float32 per tensor"})
    check.time("fp8/scaled-mm", partial(w.scaled_mm, sq, sq, sq, check.calls.device),
               {"m": sq, "n": sq, "k": sq, "dtype": "fp8_e4m3", "out": "bf16"}, cache="warm",
               small=True)  # compute-bound, as matmul-peak
    missing = check.needs("triton_kernels")
    for block in (None, PAGED_BLOCK_SIZES[0]):
        name = "fp8/kv-read" + ("" if block is None else f"-paged-{block}")
        if missing:
            check.skip(name, missing)
            continue
        check.time(name, partial(tk.paged_decode, **shape, block_size=block,
                                 device=check.calls.device), {**shape, "block_size": block})


def decode_sweep(check: Check) -> None:
    points = check.sizes["decode_sweep"]
    check.settings({**KV_SHAPE, "batch_x_context": points, "asked": check.p["decode_sweep"],
                    "impl": "sdpa"})
    for batch, context in points:
        settings = {**KV_SHAPE, "batch": batch, "context_tokens": context, "impl": "sdpa"}
        check.time(
            f"decode/{batch}x{context}",
            partial(w.decode_attention, **settings, device=check.calls.device),
            settings,
        )


def compute(check: Check) -> None:
    """The roofline's matmuls, then a sustained square matmul: the peak, clocks around it."""
    nk, sq, layers = check.p["matmul_nk"], check.p["square"], check.sizes["matmul_layers"]
    sustained = check.p["sustained_s"]
    check.settings({"m": check.p["matmul_ms"], "n": nk, "k": nk, "layers": layers,
                    "square": sq, "sustained_s": sustained, "dtype": "bf16"})
    for m in check.p["matmul_ms"]:
        settings = {"m": m, "n": nk, "k": nk, "dtype": "bf16", "layers": layers}
        check.time(
            f"matmul/{m}", partial(w.matmul, **settings, device=check.calls.device), settings
        )
    settings = {"m": sq, "n": sq, "k": sq, "dtype": "bf16", "sustained_s": sustained}
    peak: dict[str, Any] = check.doc["results"].setdefault("matmul_peak", {})
    peak["clocks_before"] = _read_clocks(check)
    record = check.time(
        "matmul-peak",
        partial(w.matmul, sq, sq, sq, "bf16", device=check.calls.device),
        settings,
        cache="warm",
        rep_s=sustained,
        small=True,  # compute-bound: the L2 does not change its time
    )
    peak["clocks_after"] = _read_clocks(check)
    if record is not None:
        times = record["times_s"]
        tenth = max(1, len(times) // 10)
        peak.update(
            sustained_s=round(math.fsum(times), 3),
            reps=len(times),
            first_tenth_median_s=statistics.median(times[:tenth]),
            last_tenth_median_s=statistics.median(times[-tenth:]),
        )
    check.save()


def _tiny_kernel(device: str) -> w.Kernel:
    import torch

    x = torch.zeros(1, device=device)
    return w.Kernel("tiny", partial(x.add_, 1), 8, 1, "x.add_(1) on one float32")


def overhead(check: Check) -> None:
    """A one-element kernel: warm (host launch gaps inside the events) and cold (hidden)."""
    check.settings({"elements": 1, "caches": ("warm", "cold")})
    out: dict[str, Any] = check.doc["results"].setdefault("overhead", {})
    for cache in ("warm", "cold"):
        record = check.time(
            f"tiny/{cache}", partial(_tiny_kernel, check.calls.device), {"elements": 1},
            cache=cache, small=True,
        )
        out[f"tiny_kernel_{cache}_median_s"] = None if record is None else record["median_s"]


def unsynchronised(check: Check) -> None:
    """Host clock around one launch, without and with ``synchronize``: the classic mistake."""
    size = check.sizes["agreement_bytes"]
    check.settings({"bytes_copied": size, "launches": 20})
    copy = w.copy(size, check.calls.device)
    copy.fn()
    check.calls.synchronize()
    launches, synced = [], []
    for _ in range(20):
        start = time.perf_counter()
        copy.fn()
        launches.append(time.perf_counter() - start)
        check.calls.synchronize()
        synced.append(time.perf_counter() - start)
    check.doc["results"]["unsynchronised"] = {
        "bytes_copied": size,
        "host_median_without_sync_s": statistics.median(launches),
        "host_median_with_sync_s": statistics.median(synced),
        "clock": "perf_counter (host)",
    }
    check.result()


def _agree(check: Check, workload: w.Kernel, rounds: int = 3) -> dict[str, Any]:
    """kvlib's cold medians (read flush, and do_bench's write flush) over do_bench's, each
    round; every repetition of the last round of each kept."""
    warmup_ms, rep_ms = (25, 100) if not check.calls.rehearsal else (1, 5)
    ours_read, ours_write, theirs = [], [], []
    out: dict[str, Any] = {"bytes_moved": workload.bytes_moved, "rounds": rounds}
    for _ in range(rounds):
        for flush, into in (("read", ours_read), ("write", ours_write)):
            into.append(bench(
                workload.fn, device=check.calls.device, rep_s=check.p["rep_s"],
                warmup_s=check.p["warmup_s"], flush_bytes=check.sizes["flush_bytes"],
                flush=flush,
            ))
        theirs.append([t / 1e3 for t in check.calls.do_bench(workload.fn, warmup_ms, rep_ms)])
    medians = [statistics.median(t) for t in theirs]
    ratio_read = [o.median_s / m for o, m in zip(ours_read, medians, strict=True)]
    ratio_write = [o.median_s / m for o, m in zip(ours_write, medians, strict=True)]
    out.update(
        over_do_bench_read_flush=statistics.median(ratio_read),
        over_do_bench_write_flush=statistics.median(ratio_write),
        kvlib_read_flush_times_s=list(ours_read[-1].times_s),
        kvlib_write_flush_times_s=list(ours_write[-1].times_s),
        do_bench_times_s=theirs[-1],
    )
    return out


def agreement(check: Check) -> None:
    """kvlib's medians over triton's do_bench (cold; the copy and the KV read) and torch's
    Timer (warm, the copy), every repetition kept."""
    from torch.utils.benchmark import Timer

    size, rep_s = check.sizes["agreement_bytes"], check.p["rep_s"]
    shape = {**KV_SHAPE, **check.p["kv_read"]}
    check.settings({"bytes_copied": size, "kv_read": shape, "repeats": 3,
                    "do_bench": "warmup=25, rep=100 (ms), return_mode='all'"})
    copy = w.copy(size, check.calls.device)
    out: dict[str, Any] = check.doc["results"].setdefault("agreement", {"bytes_copied": size})
    ratios = []
    for _ in range(3):
        ours = bench(
            copy.fn,
            device=check.calls.device,
            cache="warm",
            rep_s=rep_s,
            warmup_s=check.p["warmup_s"],
        )
        theirs = Timer("fn()", globals={"fn": copy.fn}).blocked_autorange(min_run_time=rep_s)
        ratios.append(ours.median_s / theirs.median)
    out["over_torch_timer_warm"] = statistics.median(ratios)
    check.result()
    missing = check.needs("triton")
    if missing and not check.calls.rehearsal:
        out["over_triton_do_bench_cold"] = None
        out["triton"] = missing
        check.save()
        return
    out["triton"] = "do_bench stand-in (rehearsal)" if check.calls.rehearsal else "do_bench"
    out["copy"] = _agree(check, copy)
    out["over_triton_do_bench_cold"] = out["copy"]["over_do_bench_read_flush"]
    check.save()
    kv = w.decode_attention(**shape, device=check.calls.device)
    w.check_output(kv)
    out["kv_read"] = _agree(check, kv)
    check.save()


def _ncu_command(target: str) -> list[str]:
    return [
        "ncu", "--nvtx", "--nvtx-include", "measure/", "--metrics", ",".join(NCU_METRICS),
        "--csv", "--print-units", "base",
        sys.executable, str(Path(__file__).resolve()), "--ncu-target", target,
    ]


def parse_ncu_csv(text: str) -> dict[str, Any]:
    """Sum each metric over the kernels of ncu's ``--csv`` output: ``{metric: bytes,
    "kernels": n}``. Lines before the CSV header (the target's own output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return {"kernels": 0}
    totals: dict[str, Any] = {}
    kernels = set()
    for row in csv.DictReader(lines[start:]):
        metric, value = row.get("Metric Name"), row.get("Metric Value", "")
        if metric not in NCU_METRICS:
            continue
        kernels.add(row.get("ID"))
        number = float(value.replace(",", "")) if value else 0.0
        totals[metric] = totals.get(metric, 0.0) + number
    totals["kernels"] = len(kernels)
    return totals


def _ncu_counted_bytes(stdout: str) -> int | None:
    """The bytes the course counts, as the target printed them (one JSON line)."""
    for line in stdout.splitlines():
        if line.startswith('{"target"'):
            return int(json.loads(line)["bytes_moved"])
    return None


def ncu_target_workload(target: str, device: str = "cuda") -> w.Kernel:
    """What ``--ncu-target`` runs once under Nsight Compute, at the full profile's sizes."""
    p = PROFILES["full"]
    if target == "copy":
        return w.copy(p["agreement_bytes"], device)
    if target == "kv-read":
        return w.decode_attention(**{**KV_SHAPE, **p["kv_read"]}, device=device)
    nk = p["matmul_nk"]
    return w.matmul(1, nk, nk, "bf16", device)


def ncu_target(target: str) -> int:
    """Run one workload once inside an NVTX range ``measure`` (after one call outside it)."""
    import torch

    workload = ncu_target_workload(target)
    workload.fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("measure")
    workload.fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(json.dumps({"target": target, "bytes_moved": workload.bytes_moved}))
    return 0


def ncu(check: Check) -> None:
    """DRAM bytes by Nsight Compute's counters beside the bytes the course counts."""
    check.settings({"metrics": NCU_METRICS, "targets": NCU_TARGETS,
                    "timeout_s": NCU_TIMEOUT_S})
    out: dict[str, Any] = check.doc["results"].setdefault("ncu", {})
    for target in NCU_TARGETS:
        if time.monotonic() + NCU_TIMEOUT_S > check.deadline:
            check.skip(f"ncu/{target}", "time budget too short for another ncu run")
            continue
        command = _ncu_command(target)
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=NCU_TIMEOUT_S, cwd=ROOT)
        except subprocess.TimeoutExpired:
            check.skip(f"ncu/{target}", f"ncu ran past {NCU_TIMEOUT_S:.0f} s")
            continue
        totals = parse_ncu_csv(done.stdout)
        if not totals.get("kernels"):
            tail = (done.stdout + done.stderr)[-600:]
            reason = ("ncu may not read the GPU's counters here (ERR_NVGPUCTRPERM)"
                      if "ERR_NVGPUCTRPERM" in tail else f"ncu reported no kernel (exit "
                      f"{done.returncode})")
            check.skip(f"ncu/{target}", f"{reason}: {tail}")
            continue
        counted = _ncu_counted_bytes(done.stdout)
        moved = totals.get(NCU_METRICS[0], 0.0) + totals.get(NCU_METRICS[1], 0.0)
        out[target] = {**totals, "bytes_counted": counted,
                       "dram_over_counted": moved / counted if counted else None}
        check.result()


# Features a section cannot run without, asked again if the preflight did not record them.
FEATURE_PROBES: dict[str, Callable[[Check], dict[str, Any]]] = {
    "fp8_matmul": lambda check: _probe_feature(partial(_fp8, check.calls)),
    "ncu": lambda check: _ncu(check.calls),
}

SECTION_FUNCTIONS: dict[str, Callable[[Check], None]] = {
    "preflight": preflight,
    "warmup": warmup,
    "bandwidth": bandwidth,
    "l2_probe": l2_probe,
    "kv_read": kv_read,
    "paged_kv_read": paged_kv_read,
    "fp8": fp8,
    "decode_sweep": decode_sweep,
    "compute": compute,
    "overhead": overhead,
    "unsynchronised": unsynchronised,
    "agreement": agreement,
    "ncu": ncu,
}


# --------------------------------------------------------------------------- the run


@contextmanager
def _sampled(check: Check, name: str) -> Iterator[ClockSampler | None]:
    """Clock readings on a thread while a heavy section runs; none for the light ones."""
    if name not in HEAVY_SECTIONS:
        yield None
        return
    try:
        source, read = check.calls.clock_reader(check.facts)
    except Exception as exc:
        check.doc["sections"][name]["clocks"] = {"error": f"{type(exc).__name__}: {exc}"}
        yield None
        return
    with ClockSampler(read, source, check.p["clock_interval_s"]) as sampler:
        yield sampler


def run_section(check: Check, name: str) -> None:
    """Run one section under its own guard: an exception is recorded, never raised."""
    entry: dict[str, Any] = check.doc["sections"][name]
    if check.out_of_time():
        entry.update(status="skipped", reason="time budget spent (--budget-s)")
        check.save()
        return
    missing = [r for r in (check.needs(f) for f in SECTION_NEEDS.get(name, ())) if r]
    if missing:
        entry.update(status="skipped", reason="; ".join(missing))
        check.save()
        return
    check.current = name
    entry.update(status="running", started_s=round(time.monotonic() - check.started, 3))
    check.save()
    started = time.monotonic()
    try:
        if name != "preflight":
            ensure_sizes(check)
        with _sampled(check, name) as sampler:
            try:
                SECTION_FUNCTIONS[name](check)
            finally:
                if sampler is not None:
                    sampler.stop()
                    entry["clocks"] = sampler.summary()
        entry["status"] = "ok"
    except (Interrupted, KeyboardInterrupt) as exc:
        entry.update(status="interrupted", reason=f"{type(exc).__name__}: {exc}")
        raise
    except Exception as exc:
        entry.update(
            status="failed",
            error={
                "type": type(exc).__name__,
                "message": str(exc)[:1000],
                "settings": entry.get("settings"),
                "traceback": traceback.format_exc(limit=6)[-2000:],
            },
        )
        print(
            f"gpu_check: section {name} failed: {type(exc).__name__}: {exc}"[:400],
            file=sys.stderr,
            flush=True,
        )
    finally:
        entry["elapsed_s"] = round(time.monotonic() - started, 3)
        check.current = None
        check._release()
        check.save()


def run_checks(check: Check) -> dict[str, Any]:
    """Every section in order; the document as it was last written."""
    for name in SECTIONS:
        run_section(check, name)
    check.doc["status"] = "complete"
    check.save()
    return check.doc


def summary_line(doc: dict[str, Any], path: Path | str) -> str:
    """One line: the device, which sections ran, failed and were skipped, and the KV goal."""
    sections = doc.get("sections", {})
    by: dict[str, list[str]] = {}
    for name, entry in sections.items():
        by.setdefault(entry.get("status", "?"), []).append(name)
    failed = [
        f"{n} ({sections[n].get('error', {}).get('type', '?')})" for n in by.get("failed", [])
    ]
    kind = "REHEARSAL on CPU, not a GPU run" if doc.get("rehearsal") else "GPU run"
    parts = [
        f"gpu_check summary: {doc.get('device', {}).get('name', '?')} [{kind}], "
        f"{doc.get('status')}: ran {len(by.get('ok', []))}/{len(sections)}"
    ]
    parts.append(f"failed {len(failed)}" + (f" [{', '.join(failed)}]" if failed else ""))
    for status in ("skipped", "running", "pending"):
        if by.get(status):
            parts.append(f"{status} {len(by[status])} [{', '.join(by[status])}]")
    parts.append(
        f"{len(doc.get('measurements', []))} measurements, "
        f"{len(doc.get('failed_measurements', []))} failed, "
        f"{len(doc.get('skipped', []))} skipped"
    )
    s = doc.get("summary", {})
    for ref in ("read", "copy"):
        ratio = s.get(f"kv_read_over_{ref}")
        if isinstance(ratio, int | float) and doc.get("rehearsal"):
            parts.append(f"KV read / {ref} computed (a CPU rehearsal: no goal is judged)")
        elif isinstance(ratio, int | float):
            goal = "met" if ratio >= GOAL_KV_READ_OVER_STREAM else "NOT met"
            parts.append(
                f"KV read {ratio:.0%} of {ref} (goal {GOAL_KV_READ_OVER_STREAM:.0%} {goal})"
            )
    parts.append(f"{doc.get('elapsed_s', 0):.0f} s -> {path}")
    return "; ".join(parts)


def device_label(calls: CudaCalls) -> str:
    """The device's name, asked the cheapest way; "unknown GPU" rather than an exception."""
    if calls.rehearsal:
        return dev.device_name("cpu")
    try:
        import torch

        return str(torch.cuda.get_device_name(calls.device))
    except Exception:
        return "unknown GPU"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def default_out(name: str, folder: Path | None = None, rehearsal: bool = False) -> Path:
    """``book/data/gpu_<device>.json``; a rehearsal is named ``rehearsal_<cpu>.json`` and
    goes under ``_build/`` so the book's ``gpu_*.json`` never matches it."""
    if rehearsal:
        return (folder or ROOT / "_build") / f"rehearsal_{slug(name)}.json"
    return (folder or ROOT / "book" / "data") / f"gpu_{slug(name)}.json"


def _on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file (default book/data/gpu_<device>.json)")
    parser.add_argument(
        "--out-dir", type=Path, help="folder for gpu_<device>.json (the device tool's $OUT)"
    )
    parser.add_argument("--device", default="cuda", help="a CUDA device: cuda or cuda:N (cuda)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        help=f"start no section or measurement after this (default {BUDGET_S:.0f})",
    )
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="run every section on the CPU at tiny sizes (never a GPU figure)",
    )
    parser.add_argument(
        "--fail-section", choices=SECTIONS, help="raise inside this section after its first result"
    )
    parser.add_argument("--ncu-target", choices=NCU_TARGETS, help=argparse.SUPPRESS)
    parser.add_argument(
        "--summarize",
        type=Path,
        metavar="FILE",
        help="print the summary line of a written file and exit",
    )
    return parser


def _refuse(args: argparse.Namespace) -> str | None:
    import torch

    if args.rehearse:
        return None
    if not args.device.startswith("cuda") or not torch.cuda.is_available():
        return (
            f"gpu_check: error: no CUDA GPU here (torch.cuda.is_available() is "
            f"{torch.cuda.is_available()}, --device {args.device}). This script measures a "
            "GPU and never records CPU times; run it on a machine with an NVIDIA GPU and a "
            "CUDA build of torch, or rehearse it on the CPU with --rehearse."
        )
    return None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.ncu_target:  # the process the ncu section profiles
        return ncu_target(args.ncu_target)
    if args.summarize:
        print(summary_line(json.loads(args.summarize.read_text()), args.summarize))
        return 0
    if not (math.isfinite(args.budget_s) and args.budget_s > _RESERVE_S):
        print(
            f"gpu_check: error: --budget-s must be more than {_RESERVE_S:.0f} s, "
            f"got {args.budget_s}",
            file=sys.stderr,
        )
        return 2
    refusal = _refuse(args)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    if args.rehearse:
        import torch

        # One thread: on a shared CPU, torch's worker threads wait on each other and the
        # rehearsal, which checks code paths and not speed, would take minutes.
        torch.set_num_threads(1)
    calls = RehearsalCalls() if args.rehearse else CudaCalls(args.device)
    out = args.out or default_out(device_label(calls), args.out_dir, rehearsal=calls.rehearsal)
    check = Check(
        calls,
        "tiny" if args.rehearse else "full",
        out,
        args.budget_s,
        args.fail_section,
        sys.argv[1:] if argv is None else argv,
        # From the command line, the budget includes start-up; called in-process, from now.
        started=PROCESS_START if argv is None else None,
    )
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        run_checks(check)
    except (Interrupted, KeyboardInterrupt):
        check.doc["status"] = "interrupted"
        check.save()
        print(summary_line(check.doc, out), flush=True)
        return 3
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = any(e["status"] == "failed" for e in check.doc["sections"].values())
    print(summary_line(check.doc, out), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
