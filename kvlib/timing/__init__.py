"""The benchmark harness: one timing loop for torch code on a GPU or a CPU, one result type.

The package also holds what it times on (:mod:`~kvlib.timing.devices`), what the
course times (:mod:`~kvlib.timing.workloads`), the roofline arithmetic
(:mod:`~kvlib.timing.roofline`, no torch). torch is imported inside the functions only, so
importing ``kvlib.timing`` costs nothing until something is timed.

``bench(fn, device="cuda")`` times ``fn`` the way ``triton.testing.do_bench``
does (triton ``python/triton/testing.py``): every repetition bracketed by a pair
of CUDA events, after a flush of ``max(4 x L2, 256 MiB)``
(:func:`~kvlib.timing.devices.cold_cache_bytes`) so each starts cold; one
``synchronize`` after the loop. ``device="cpu"`` runs the same loop
with ``time.perf_counter_ns`` stamps and a buffer larger than the last-level
cache, and is labelled ``cpu``: it can never pass for a GPU time.

What the numbers mean:
- CUDA events time the GPU's stream between two points, at about 0.5 us
  resolution (CUDA Runtime API, ``cudaEventElapsedTime``). If the host is
  slower to launch ``fn``'s kernels than the GPU is to run them, the gaps are
  inside the interval: launch overhead is measured, not hidden. A cold run's
  flush kernel keeps the GPU busy while the host records and launches, so the
  start event fires just before ``fn``'s first kernel.
- The flush reads its buffer (``flush="read"``, the default): the lines ``fn``
  left dirty are written back during the flush, outside the timed span, and
  the L2 then holds only clean lines of the buffer. ``do_bench`` writes its
  buffer instead (``flush="write"``), which leaves up to one L2 of dirty lines
  to be written back while ``fn`` runs: a bias of up to one L2 of traffic.
- ``fn`` must run on the current stream; work on other streams is not timed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvlib._validate import is_int, require_positive
from kvlib.timing.devices import (
    cache_flush_bytes,
    default_device,
    device_name,
    resolve_device,
)

__all__ = [
    "CUDA_EVENT_RESOLUTION_S",
    "DEFAULT_QUANTILES",
    "TimingResult",
    "bench",
    "cache_flush_bytes",
    "default_device",
    "device_name",
    "quantile",
    "sweep",
    "timing_fields",
]

# CUDA Runtime API, cudaEventElapsedTime: "in milliseconds with a resolution of around
# 0.5 microseconds".
CUDA_EVENT_RESOLUTION_S = 0.5e-6
# The median with the 20th and 80th percentiles, the quantiles triton's tutorials ask
# do_bench for (quantiles=[0.5, 0.2, 0.8]).
DEFAULT_QUANTILES = (0.2, 0.5, 0.8)
# A repetition whose median is under this many clock resolutions reads with >1% error.
_RESOLUTION_FACTOR = 100
_ESTIMATE_RUNS = 5

T = TypeVar("T")


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``values`` by linear interpolation between order statistics.

    Position ``q x (n - 1)`` in the sorted values, as ``numpy.quantile`` and
    ``torch.quantile`` compute it by default.
    """
    if not values:
        raise ValueError("quantile of no values: time at least one repetition")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q!r}")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (position - lower) * (ordered[upper] - ordered[lower])


@dataclass(frozen=True)
class TimingResult:
    """Seconds per repetition of one function, and how they were measured.

    ``device`` is ``"cpu"`` or ``"cuda:N"``; ``clock`` is ``"cuda-events"`` or
    ``"perf_counter_ns"``; ``cache`` is ``"cold"`` (a ``flush_bytes`` buffer
    read, or written, before every repetition: ``flush``) or ``"warm"``.
    """

    device: str
    device_name: str
    clock: str
    cache: str
    flush_bytes: int
    warmup_reps: int
    reps: int
    resolution_s: float
    times_s: tuple[float, ...]
    flush: str = "read"

    @property
    def median_s(self) -> float:
        """The median repetition: robust to the slow outliers a busy machine adds."""
        return quantile(self.times_s, 0.5)

    @property
    def min_s(self) -> float:
        return min(self.times_s)

    @property
    def mean_s(self) -> float:
        return math.fsum(self.times_s) / len(self.times_s)

    def quantile_s(self, q: float) -> float:
        """The ``q``-quantile of the repetition times, in seconds."""
        return quantile(self.times_s, q)

    def quantiles_s(self) -> dict[str, float]:
        """``{"p20": ..., "p50": ..., "p80": ...}`` in seconds."""
        return {f"p{round(q * 100)}": quantile(self.times_s, q) for q in DEFAULT_QUANTILES}

    @property
    def resolution_limited(self) -> bool:
        """True when the median is under 100 clock ticks: each reading is >1% quantisation."""
        return self.median_s < _RESOLUTION_FACTOR * self.resolution_s

    def bandwidth_bytes_per_s(self, bytes_moved: int) -> float:
        """``bytes_moved / median_s``: count every byte read and every byte written."""
        if bytes_moved < 0:
            raise ValueError(f"bytes_moved must be >= 0, got {bytes_moved}")
        return bytes_moved / self.median_s

    def flops_per_s(self, flops: float) -> float:
        """``flops / median_s``."""
        if flops < 0:
            raise ValueError(f"flops must be >= 0, got {flops}")
        return flops / self.median_s


def timing_fields(workload: Any, result: Any) -> dict[str, Any]:
    """What every report of a timed ``workload`` carries: the device and clock, the cache
    state, the repetitions, the time quantiles and the bandwidth (``kvlib bench`` and the
    course's GPU check share them)."""
    return {
        "description": workload.description,
        "device": result.device,
        "device_name": result.device_name,
        "clock": result.clock,
        "cache": result.cache,
        "flush_bytes": result.flush_bytes,
        "reps": result.reps,
        "median_s": result.median_s,
        "p20_s": result.quantile_s(0.2),
        "p80_s": result.quantile_s(0.8),
        "min_s": result.min_s,
        "resolution_limited": result.resolution_limited,
        "bytes_moved": workload.bytes_moved,
        "bandwidth_bytes_per_s": result.bandwidth_bytes_per_s(workload.bytes_moved),
    }


class _Clock:
    """Stamps on the host with ``perf_counter_ns``; the CUDA clock overrides each step."""

    name = "perf_counter_ns"
    resolution_s = max(time.get_clock_info("perf_counter").resolution, 1e-9)

    def __init__(self, device: Any) -> None:
        self.device = device

    def slots(self, n: int) -> list[Any]:
        return [0] * n

    def stamp(self, slot: Any) -> Any:
        return time.perf_counter_ns()

    def sync(self) -> None:
        """Host stamps are taken after the work they follow; nothing to wait for."""

    def seconds(self, start: Any, end: Any) -> float:
        return float(end - start) / 1e9


class _CudaClock(_Clock):
    """Events recorded on the current stream, read after one synchronize."""

    name = "cuda-events"
    resolution_s = CUDA_EVENT_RESOLUTION_S

    def slots(self, n: int) -> list[Any]:
        # Created before the loop, as do_bench does, to keep the host quick between stamps.
        import torch

        return [torch.cuda.Event(enable_timing=True) for _ in range(n)]  # type: ignore[no-untyped-call]

    def stamp(self, slot: Any) -> Any:
        import torch

        slot.record(torch.cuda.current_stream(self.device))
        return slot

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize(self.device)

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in milliseconds


def _timed(
    clock: _Clock, fn: Callable[[], object], flush: Callable[[], object], n: int
) -> list[float]:
    """``n`` repetitions of flush, stamp, fn, stamp; one sync; seconds per repetition."""
    starts, ends = clock.slots(n), clock.slots(n)
    for i in range(n):
        flush()
        starts[i] = clock.stamp(starts[i])
        fn()
        ends[i] = clock.stamp(ends[i])
    clock.sync()
    return [clock.seconds(s, e) for s, e in zip(starts, ends, strict=True)]


def _flush(size: int, kind: str, device: Any) -> Callable[[], object]:
    """A flush of ``size`` bytes: sum a clean float32 buffer ("read") or zero it ("write").

    The buffer is written once here, so a read flush finds it clean: what the
    timed function left dirty is written back while the flush runs, untimed.
    """
    import torch

    if kind == "write":
        return torch.empty(size, dtype=torch.uint8, device=device).zero_
    buffer = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)
    return buffer.sum


def bench(
    fn: Callable[[], object],
    *,
    device: str,
    cache: str = "cold",
    warmup_s: float = 0.025,
    rep_s: float = 0.1,
    min_reps: int = 5,
    max_reps: int = 10_000,
    flush_bytes: int | None = None,
    flush: str = "read",
) -> TimingResult:
    """Time ``fn()`` on ``device`` ("cpu", "cuda", "cuda:1"), repeating it for ``rep_s`` seconds.

    The counts are set by time, as in ``triton.testing.do_bench(warmup=25,
    rep=100)`` (milliseconds): five calls estimate one cycle (flush and call),
    then ``warmup_s / cycle`` untimed and ``rep_s / cycle`` timed repetitions
    run (at least ``min_reps``, at most ``max_reps``). ``cache="cold"`` reads
    (``flush="read"``) or writes (``flush="write"``, as ``do_bench``) a buffer of
    ``flush_bytes`` (default :func:`~kvlib.timing.devices.cache_flush_bytes`,
    ``max(4 x L2, 256 MiB)``) before every repetition, outside the timed span.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a callable taking no arguments, got {type(fn).__name__}")
    if cache not in ("cold", "warm"):
        raise ValueError(f"cache must be 'cold' (flushed before each repetition) or 'warm', "
                         f"got {cache!r}")
    if not (isinstance(warmup_s, int | float) and math.isfinite(warmup_s) and warmup_s >= 0):
        raise ValueError(f"warmup_s must be a number of seconds >= 0, got {warmup_s!r}")
    require_positive(rep_s, "rep_s")
    if flush not in ("read", "write"):
        raise ValueError(f"flush must be 'read' (sum a clean buffer) or 'write' (zero it, as "
                         f"do_bench), got {flush!r}")
    if not 1 <= min_reps <= max_reps:
        raise ValueError(f"need 1 <= min_reps <= max_reps, got {min_reps} and {max_reps}")
    resolved = resolve_device(device)
    clock = _CudaClock(resolved) if resolved.type == "cuda" else _Clock(resolved)
    flush_fn: Callable[[], object] = lambda: None  # noqa: E731 - a no-op for a warm cache
    size = 0
    if cache == "cold":
        size = cache_flush_bytes(device) if flush_bytes is None else flush_bytes
        if not is_int(size) or size < 1:
            raise ValueError(f"flush_bytes must be a positive int number of bytes, got {size!r}")
        flush_fn = _flush(size, flush, resolved)
    fn()  # first call: compilation, allocation, lazy initialisation; not timed
    clock.sync()
    # One cycle (flush and call) by the host's wall clock, which counts for either device.
    started = time.perf_counter()
    _timed(clock, fn, flush_fn, _ESTIMATE_RUNS)
    cycle_s = max((time.perf_counter() - started) / _ESTIMATE_RUNS, 1e-9)
    warmup = max(1, min(max_reps, math.ceil(warmup_s / cycle_s)))
    reps = max(min_reps, min(max_reps, math.ceil(rep_s / cycle_s)))
    for _ in range(warmup):
        flush_fn()
        fn()
    clock.sync()
    return TimingResult(
        device=str(resolved),
        device_name=device_name(str(resolved)),
        clock=clock.name,
        cache=cache,
        flush_bytes=size,
        warmup_reps=warmup,
        reps=reps,
        resolution_s=clock.resolution_s,
        times_s=tuple(_timed(clock, fn, flush_fn, reps)),
        flush=flush,
    )


def sweep(
    cases: Sequence[T],
    make: Callable[[T], Callable[[], object]],
    *,
    device: str,
    progress: bool | None = None,
    desc: str = "bench",
    **bench_kwargs: Any,
) -> list[TimingResult]:
    """``bench(make(case), device=device, ...)`` for each case, with a tqdm progress bar.

    ``progress=None`` shows the bar only on a terminal (tqdm's ``disable=None``).
    """
    from tqdm.auto import tqdm

    bar = tqdm(cases, desc=desc, disable=None if progress is None else not progress)
    return [bench(make(case), device=device, **bench_kwargs) for case in bar]
