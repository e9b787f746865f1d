"""What is being timed on: the device, its name, and the cache a cold run must flush.

A GPU is named by ``torch.cuda.get_device_name``; a CPU by ``/proc/cpuinfo``
(or :mod:`platform`) and torch's thread count, so a CPU time always says it
is one. :func:`cuda_device_facts` and :func:`nvidia_smi` record what a GPU
run must carry (capability, L2, driver, clocks, temperature, power). torch is
imported inside the functions.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

from kvlib.hardware import gpu_from_torch_name
from kvlib.units import KiB, MiB

__all__ = [
    "FALLBACK_FLUSH_BYTES",
    "cache_flush_bytes",
    "cpu_cache_bytes",
    "cpu_model_name",
    "cuda_device_facts",
    "default_device",
    "device_name",
    "gpu_l2_bytes",
    "nvidia_smi",
    "resolve_device",
]

# When no cache size is known: what triton's do_bench zeroes before every call, a fixed
# 256 MiB (``cache_size = 256 * 1024 * 1024`` in the NVIDIA driver's
# ``get_empty_cache_for_benchmark``; releases before it used ``int(256e6)`` bytes).
FALLBACK_FLUSH_BYTES = 256 * MiB


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"``."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str) -> Any:
    """``device`` as a ``torch.device`` with its index; refuses a GPU that is not there."""
    import torch

    if not isinstance(device, str):
        raise TypeError(f"device must be a string such as 'cpu' or 'cuda', got {device!r}")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a torch device: use 'cpu' or 'cuda'") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {device!r}: torch sees no CUDA GPU (torch.cuda.is_available() is "
                "False); time on device 'cpu' instead, which is labelled as a CPU time"
            )
        index = torch.cuda.current_device() if resolved.index is None else resolved.index
        return torch.device("cuda", index)
    if resolved.type != "cpu":
        raise ValueError(f"device {device!r}: only 'cpu' and 'cuda' can be timed")
    return resolved


def cpu_model_name() -> str:
    """The processor's name from ``/proc/cpuinfo`` (Linux), else from :mod:`platform`."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: str = "cpu") -> str:
    """``"NVIDIA H200"`` for a GPU; ``"AMD EPYC (1 torch thread)"`` for the CPU."""
    import torch

    resolved = resolve_device(device)
    if resolved.type == "cuda":
        return str(torch.cuda.get_device_name(resolved))
    threads = torch.get_num_threads()
    return f"{cpu_model_name()} ({threads} torch thread{'s' if threads != 1 else ''})"


def cpu_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache of CPU 0 (the last level before memory) from Linux sysfs, or None.

    sysfs writes sizes as ``"32768K"`` (binary kilobytes).
    """
    sizes = []
    for entry in root.glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": KiB, "M": MiB}.get(text[-1:], 1)
        digits = text.rstrip("KMB")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def gpu_l2_bytes(device: str = "cuda") -> int | None:
    """The GPU's L2 size: ``cudaDeviceProp.l2CacheSize`` (torch's ``L2_cache_size``),
    else the :mod:`kvlib.hardware` row for its name, else None."""
    import torch

    props = torch.cuda.get_device_properties(resolve_device(device))
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    if l2 > 0:
        return l2
    try:
        return gpu_from_torch_name(str(props.name)).l2_bytes
    except KeyError:
        return None


def cache_flush_bytes(device: str = "cpu") -> int:
    """Bytes to write before each cold repetition: twice the last cache before memory.

    Twice, because neither cache evicts in strict least-recently-used order
    (a GPU's L2 is split into partitions, CPU caches are set-associative), so a
    buffer of exactly the cache's size can leave lines of the timed data
    behind. :data:`FALLBACK_FLUSH_BYTES` when the size is unknown.
    """
    resolved = resolve_device(device)
    cache = gpu_l2_bytes(str(resolved)) if resolved.type == "cuda" else cpu_cache_bytes()
    return FALLBACK_FLUSH_BYTES if cache is None else 2 * cache


# What nvidia-smi reports about a GPU's state: clocks in MHz, watts, degrees C.
_SMI_FIELDS = (
    "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,"
    "temperature.gpu,power.draw,power.limit,persistence_mode"
)


def nvidia_smi(index: int, command: str = "nvidia-smi") -> dict[str, str]:
    """``nvidia-smi`` readings of GPU ``index`` by field name, or ``{"error": why}``."""
    argv = [command, "-i", str(index), f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"nvidia-smi unavailable: {exc}"}
    lines = out.stdout.strip().splitlines()
    if not lines:
        return {"error": "nvidia-smi printed nothing"}
    values = [v.strip() for v in lines[0].split(",")]
    return dict(zip(_SMI_FIELDS.split(","), values, strict=False))


def cuda_device_facts(device: str) -> dict[str, Any]:
    """Name, capability, SMs, L2, memory, driver and software versions of a CUDA ``device``."""
    import torch

    resolved = resolve_device(device)
    if resolved.type != "cuda":
        raise ValueError(f"device {device!r} is not a CUDA GPU")
    index = resolved.index
    props = torch.cuda.get_device_properties(index)
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "type": "cuda",
        "index": index,
        "name": torch.cuda.get_device_name(index),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "memory_bytes": int(props.total_memory),
        "driver": nvidia_smi(index).get("driver_version"),
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version,
    }
