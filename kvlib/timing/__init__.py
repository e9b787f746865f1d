"""The benchmark harness: honest timings of torch code on a GPU or a CPU.

- :mod:`kvlib.timing.harness`: ``bench`` (CUDA events or ``perf_counter_ns``,
  time-set warm-up and repetitions, cache flush, median and quantiles),
  ``sweep`` with a progress bar, and the ``TimingResult`` they return.
- :mod:`kvlib.timing.devices`: the device's name and the cache a cold run flushes.
- :mod:`kvlib.timing.workloads`: a device-to-device copy, a matrix multiply and
  decode attention over a KV cache, each with the bytes it moves and the FLOPs
  it does.

Every module here imports torch inside its functions only, so importing
``kvlib.timing`` costs nothing until something is timed. The roofline
arithmetic that needs no torch lives in :mod:`kvlib.timing.roofline`.
"""

from kvlib.timing.devices import cache_flush_bytes, default_device, device_name
from kvlib.timing.harness import (
    CUDA_EVENT_RESOLUTION_S,
    DEFAULT_QUANTILES,
    TimingResult,
    bench,
    quantile,
    sweep,
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
]
