"""What is being timed on: the device, its name, and the cache a cold run must flush.

:func:`cuda_device_facts` and :func:`nvidia_smi` record what a GPU run must
carry (capability, L2, driver, clocks, temperature, power); :func:`clock_reader`
reads the clocks and why they are held down while work runs. A GPU is addressed
by its PCI bus id, which names the same board for torch, NVML and nvidia-smi
whatever ``CUDA_VISIBLE_DEVICES`` renumbers.
"""

from __future__ import annotations

import importlib
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvlib._validate import is_int
from kvlib.hardware import gpu_from_torch_name
from kvlib.units import KiB, MiB

__all__ = [
    "COLD_CACHE_FACTOR",
    "FALLBACK_FLUSH_BYTES",
    "THROTTLE_REASONS",
    "cache_flush_bytes",
    "clock_reader",
    "cold_cache_bytes",
    "cpu_cache_bytes",
    "cpu_model_name",
    "cuda_device_facts",
    "default_device",
    "device_name",
    "gpu_l2_bytes",
    "nvidia_smi",
    "nvml_clock_reader",
    "pci_bus_id",
    "resolve_device",
    "smi_clock_reader",
    "throttle_reasons",
]

# When no cache size is known: what triton's do_bench zeroes before every call, a fixed
# 256 MiB (``cache_size = 256 * 1024 * 1024`` in the NVIDIA driver's
# ``get_empty_cache_for_benchmark``; releases before it used ``int(256e6)`` bytes).
FALLBACK_FLUSH_BYTES = 256 * MiB
# A cold measurement moves, and a flush reads, at least this many last-level caches: a GPU's
# L2 is split into partitions and neither it nor a CPU's set-associative cache evicts in
# strict least-recently-used order, so one cache's worth of traffic can leave lines behind.
COLD_CACHE_FACTOR = 4


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


def cold_cache_bytes(cache_bytes: int | None, floor_bytes: int = FALLBACK_FLUSH_BYTES) -> int:
    """The one cold-cache rule: ``max(4 x cache, floor)``, the floor do_bench's 256 MiB.

    Both the harness's flush and the GPU check's smallest timed traffic use it, so
    a "cold" time means the same everywhere: an H100 SXM (50 MiB of L2) and an H200
    (60 MiB) both get 256 MiB, a B200 (126 MiB) 504 MiB. An unknown cache gets the
    floor. ``floor_bytes=0`` leaves the bare 4 x cache (the check's CPU rehearsal,
    whose "L2" is a stand-in of a few hundred KiB).
    """
    if cache_bytes is not None and (not is_int(cache_bytes) or cache_bytes < 1):
        raise ValueError(f"cache_bytes must be a positive int or None, got {cache_bytes!r}")
    if not is_int(floor_bytes) or floor_bytes < 0:
        raise ValueError(f"floor_bytes must be an int >= 0, got {floor_bytes!r}")
    if cache_bytes is None:
        return max(floor_bytes, FALLBACK_FLUSH_BYTES)
    return max(COLD_CACHE_FACTOR * cache_bytes, floor_bytes)


def cache_flush_bytes(device: str = "cpu") -> int:
    """Bytes a cold repetition's flush reads: :func:`cold_cache_bytes` of the last cache
    before memory (the GPU's L2, the CPU's last level)."""
    resolved = resolve_device(device)
    cache = gpu_l2_bytes(str(resolved)) if resolved.type == "cuda" else cpu_cache_bytes()
    return cold_cache_bytes(cache)


# What nvidia-smi reports about a GPU's state: clocks in MHz, watts, degrees C.
_SMI_FIELDS = (
    "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,"
    "temperature.gpu,power.draw,power.limit,persistence_mode"
)

# Why the clocks are below their maximum: the bits of NVML's clocks-event reasons
# (nvml.h, ``nvmlClocksEventReason*``, formerly ``nvmlClocksThrottleReason*``), which
# nvidia-smi prints as ``clocks_event_reasons.active``.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_reasons(mask: int) -> list[str]:
    """The names of the reasons set in NVML's bit ``mask`` (unknown bits as hex)."""
    if not is_int(mask) or mask < 0:
        raise ValueError(f"mask must be an int >= 0 (NVML's reason bits), got {mask!r}")
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    return names + ([f"unknown_bits_{unknown:#x}"] if unknown else [])


def nvidia_smi(
    gpu_id: int | str, command: str = "nvidia-smi", fields: str = _SMI_FIELDS
) -> dict[str, str]:
    """``nvidia-smi`` readings of one GPU by field name, or ``{"error": why}``.

    ``gpu_id`` is what ``nvidia-smi --id`` takes: a PCI bus id
    (``"00000000:19:00.0"``, the same board whatever ``CUDA_VISIBLE_DEVICES``
    says), a UUID, or nvidia-smi's own index (which torch's index need not equal).
    """
    argv = [command, f"--id={gpu_id}", f"--query-gpu={fields}", "--format=csv,noheader"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"nvidia-smi unavailable: {exc}"}
    lines = out.stdout.strip().splitlines()
    if not lines:
        return {"error": "nvidia-smi printed nothing"}
    values = [v.strip() for v in lines[0].split(",")]
    return dict(zip(fields.split(","), values, strict=False))


def pci_bus_id(device: str = "cuda") -> str | None:
    """The GPU's PCI bus id as NVML and nvidia-smi write it (``"00000000:19:00.0"``), or None.

    From ``cudaDeviceProp``'s ``pciDomainID``, ``pciBusID`` and ``pciDeviceID``
    (torch's ``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``); function 0.
    """
    import torch

    props = torch.cuda.get_device_properties(resolve_device(device))
    parts = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if any(not isinstance(p, int) for p in parts):
        return None
    domain, bus, dev = parts
    return f"{domain:08X}:{bus:02X}:{dev:02X}.0"


# A clock reading: seconds since the reader was made, clocks in MHz, degrees C, watts,
# and the active reasons; None where the source gave nothing.
ClockReading = dict[str, Any]


def nvml_clock_reader(bus_id: str) -> Callable[[], ClockReading] | None:
    """A function reading the GPU at ``bus_id`` through NVML (``pynvml`` from
    ``nvidia-ml-py``), or None when that package is not installed."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    nvml.nvmlInit()
    # bytes: older nvidia-ml-py passes the argument to ctypes unconverted.
    handle = nvml.nvmlDeviceGetHandleByPciBusId(bus_id.encode())
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if reasons is None:  # nvidia-ml-py before the 535 driver's rename
        reasons = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    started = time.monotonic()

    def field(fn: Callable[[], Any]) -> Any:
        """One reading, or None: a query this board does not support loses only itself."""
        try:
            return fn()
        except Exception:  # NVMLError_NotSupported and its kin live in the optional package
            return None

    def read() -> ClockReading:
        mask = field(lambda: int(reasons(handle)))
        power_mw = field(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        return {
            "t_s": round(time.monotonic() - started, 3),
            "sm_mhz": field(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            "mem_mhz": field(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
            "temperature_c": field(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            ),
            "power_w": None if power_mw is None else power_mw / 1e3,  # NVML gives milliwatts
            "reasons": None if mask is None else throttle_reasons(mask),
        }

    return read


# nvidia-smi's names for the readings; the reasons field was ``clocks_throttle_reasons``
# before driver 535 renamed it ``clocks_event_reasons``.
_SMI_CLOCK_FIELDS = "clocks.sm,clocks.mem,temperature.gpu,power.draw,{}.active"
_SMI_REASON_NAMES = ("clocks_event_reasons", "clocks_throttle_reasons")


def _number(text: str | None) -> float | None:
    """``"1980 MHz"`` or ``"120.50 W"`` -> the number; ``"[N/A]"`` or None -> None."""
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def smi_clock_reader(gpu_id: int | str, command: str = "nvidia-smi") -> Callable[[], ClockReading]:
    """A function reading the GPU ``gpu_id`` (see :func:`nvidia_smi`) by running nvidia-smi."""
    started = time.monotonic()
    names = list(_SMI_REASON_NAMES)

    def read() -> ClockReading:
        raw = nvidia_smi(gpu_id, command, _SMI_CLOCK_FIELDS.format(names[0]))
        if "error" in raw and len(names) > 1:  # an older driver: the field's former name
            names.pop(0)
            raw = nvidia_smi(gpu_id, command, _SMI_CLOCK_FIELDS.format(names[0]))
        if "error" in raw:
            return {"t_s": round(time.monotonic() - started, 3), "error": raw["error"]}
        mask_text = raw.get(f"{names[0]}.active", "")
        try:
            reasons: list[str] | None = throttle_reasons(int(mask_text, 16))
        except ValueError:
            reasons = None
        return {
            "t_s": round(time.monotonic() - started, 3),
            "sm_mhz": _number(raw.get("clocks.sm")),
            "mem_mhz": _number(raw.get("clocks.mem")),
            "temperature_c": _number(raw.get("temperature.gpu")),
            "power_w": _number(raw.get("power.draw")),
            "reasons": reasons,
        }

    return read


def clock_reader(
    gpu_id: str, command: str = "nvidia-smi"
) -> tuple[str, Callable[[], ClockReading]]:
    """``(source, read)``: NVML when ``nvidia-ml-py`` is installed and ``gpu_id`` is a PCI
    bus id, else nvidia-smi. ``source`` says which, and why NVML was not used."""
    if ":" in gpu_id:
        try:
            read = nvml_clock_reader(gpu_id)
        except Exception as exc:  # NVML's own error types live in the optional package
            source = f"nvidia-smi (NVML failed: {type(exc).__name__}: {exc})"
        else:
            if read is not None:
                return "nvml", read
            source = "nvidia-smi (nvidia-ml-py is not installed)"
    else:
        source = "nvidia-smi (no PCI bus id for NVML)"
    return source, smi_clock_reader(gpu_id, command)


def cuda_device_facts(device: str) -> dict[str, Any]:
    """Name, capability, SMs, L2, memory, PCI bus id, driver and software versions of a
    CUDA ``device``."""
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
    bus_id = pci_bus_id(str(resolved))
    uuid = getattr(props, "uuid", None)
    return {
        "type": "cuda",
        "index": index,
        "name": torch.cuda.get_device_name(index),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "memory_bytes": int(props.total_memory),
        "pci_bus_id": bus_id,
        "uuid": None if uuid is None else str(uuid),
        "driver": nvidia_smi(bus_id if bus_id else index).get("driver_version"),
        "cuda_runtime": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version,
    }
