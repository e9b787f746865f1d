"""Accelerator specifications, one row per card, each with its sources.

Memory: ``memory_bytes`` is what the driver reports as the card's total
(``nvidia-smi --query-gpu=memory.total``, in MiB), the figure every seat count
here uses. The datasheet prints a round "80 GB" (``datasheet_memory_gb``);
the HBM stacks hold 80 GiB, part of which the driver keeps for ECC and
itself, so an H100 reports 81,559 MiB (79.6 GiB) and an L4 "24 GB" card
23,034 MiB (22.5 GiB). Where no driver reading is recorded the row says so
(``driver_reported`` is False) and ``memory_bytes`` falls back to the printed
figure read as decimal GB, the lower of the two readings.

vLLM does not use the driver's figure: it multiplies ``gpu_memory_utilization``
by CUDA's total, ``torch.cuda.mem_get_info()[1]``, which is smaller by what the
CUDA context and driver keep (``vllm/v1/worker/utils.py`` ``request_memory``:
``ceil(total_memory x gpu_memory_utilization)``). ``cuda_total_bytes`` records
that reading where one is known (None otherwise), and :func:`vllm_budget_bytes`
computes vLLM's budget from it, falling back to the driver's figure (an upper
bound) where it is None. ``VLLM_GPU_MEMORY_UTILIZATION`` is vLLM's current
default, 0.92 (``CacheConfig.gpu_memory_utilization``, ``vllm/config/cache.py``
at commit ``002f10e0cfa1``; 0.9 in releases up to v0.6.4's documentation and
for years after).
Bandwidth and FLOP/s are decimal (1 TB/s = 10**12 B/s) and dense: datasheets
also print "with sparsity" figures, twice as large, that dense transformer
inference does not reach. L2 sizes are binary (50 MB of L2 is 50 MiB).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvlib._validate import require_fraction
from kvlib.units import GB, TB, GiB, MiB

__all__ = [
    "VLLM_GPU_MEMORY_UTILIZATION",
    "GPUSpec",
    "GPUS",
    "get_gpu",
    "gpu_from_torch_name",
    "gpu_names",
    "vllm_budget_bytes",
]

TFLOP = 10**12

# vLLM's default --gpu-memory-utilization (CacheConfig, vllm/config/cache.py, commit 002f10e0cfa1).
VLLM_GPU_MEMORY_UTILIZATION = 0.92


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator: driver-reported memory (bytes), bandwidth and dense FLOP/s (decimal)."""

    name: str
    datasheet_memory_gb: int
    driver_memory_mib: int | None
    hbm_bandwidth_bytes_per_s: float
    bf16_dense_flops_per_s: float
    fp8_dense_flops_per_s: float | None
    l2_bytes: int | None
    source: str
    memory_source: str
    cuda_total_bytes: int | None = None  # torch.cuda.mem_get_info()[1]; None: no reading
    cuda_total_source: str = "no CUDA reading recorded"

    @property
    def vllm_total_bytes(self) -> int:
        """The total vLLM multiplies by ``gpu_memory_utilization``: CUDA's where recorded,
        else the driver's (:attr:`memory_bytes`, an upper bound)."""
        return self.memory_bytes if self.cuda_total_bytes is None else self.cuda_total_bytes

    @property
    def vllm_total_label(self) -> str:
        """Which total :attr:`vllm_total_bytes` is: ``"CUDA"`` or ``"driver"``."""
        return "driver" if self.cuda_total_bytes is None else "CUDA"

    @property
    def driver_reported(self) -> bool:
        """Whether ``memory_bytes`` is a recorded driver reading (else the datasheet's)."""
        return self.driver_memory_mib is not None

    @property
    def memory_bytes(self) -> int:
        """Total memory as the driver reports it; the datasheet's GB when no reading exists."""
        if self.driver_memory_mib is not None:
            return self.driver_memory_mib * MiB
        return self.datasheet_memory_gb * GB

    @property
    def ridge_flops_per_byte(self) -> float:
        """Roofline ridge point: bf16 FLOP/s over bandwidth, FLOPs per byte read."""
        return self.bf16_dense_flops_per_s / self.hbm_bandwidth_bytes_per_s


def _spec(
    name: str,
    memory: tuple[int, int | None, str],
    bandwidth_tb_s: float,
    bf16_tflops: float,
    fp8_tflops: float | None,
    l2_mib: int | None,
    source: str,
    cuda_total: tuple[int, str] | None = None,
) -> GPUSpec:
    """``cuda_total``: CUDA's total in hundredths of a GiB (vLLM logs it so), and its source."""
    datasheet_gb, driver_mib, memory_source = memory
    cuda_bytes, cuda_source = None, "no CUDA reading recorded"
    if cuda_total is not None:
        cuda_bytes, cuda_source = cuda_total[0] * GiB // 100, cuda_total[1]
    return GPUSpec(
        name=name,
        datasheet_memory_gb=datasheet_gb,
        driver_memory_mib=driver_mib,
        hbm_bandwidth_bytes_per_s=bandwidth_tb_s * TB,
        bf16_dense_flops_per_s=bf16_tflops * TFLOP,
        fp8_dense_flops_per_s=None if fp8_tflops is None else fp8_tflops * TFLOP,
        l2_bytes=None if l2_mib is None else l2_mib * MiB,
        source=source,
        memory_source=memory_source,
        cuda_total_bytes=cuda_bytes,
        cuda_total_source=cuda_source,
    )


# Where each driver reading was seen (nvidia-smi memory.total, MiB).
_SMI_MODAL = "nvidia-smi memory.total listed in modal-labs/modal-client pull request 2797 (2025)"
_SMI_NCCL = "nvidia-smi on an HGX H100 SXM, NVIDIA/nccl issue 1264 (2024)"
_SMI_H200 = "nvidia-smi on HGX H200 nodes (driver 570), e.g. NVIDIA H200 143771MiB"
_SMI_B200 = "nvidia-smi on an HGX B200, NVIDIA/TensorRT-LLM issue 10278 (driver 580.95)"
_SMI_4090 = "nvidia-smi on an RTX 4090, vllm-project/vllm issue 7553 (driver 535)"
_NO_READING = "no driver reading recorded: the datasheet's GB, read as decimal"
# CUDA's total (torch.cuda.mem_get_info()[1]) as vLLM's start-up log prints it, to 0.01 GiB
# ("Free memory on device (free/total GiB)", "total_gpu_memory"); no byte-exact public reading.
_CUDA_H100 = (7_910, "torch.cuda.mem_get_info() on an H100 SXM 80GB: 79.10 GiB, to 0.01 GiB")
_CUDA_H200 = (13_981, "torch.cuda.mem_get_info() on an H200 SXM 141GB: 139.81 GiB, to 0.01 GiB")

# The H200's datasheet prints no L2; the CUDA runtime reports 60 MiB (an H100 SXM's 50):
# torch.cuda.get_device_properties on an H200 prints "L2_cache_size=60MB" (MiB), as quoted
# in ai-bot-pro/achatbot deploy/modal/src/llm/vllm/vlm/skywork_r1v.py (commit 859e2161).
_L2_H200 = "L2 60 MiB as cudaDeviceProp.l2CacheSize reports it on an H200"
_A100 = (
    "NVIDIA A100 Tensor Core GPU datasheet (2021), SXM column; L2 from the Ampere GA100 whitepaper"
)
_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet (2023); dense = half the sparse figures; "
    "L2 from the Hopper whitepaper"
)
_ADA = (
    "NVIDIA Ada Lovelace architecture whitepaper v1.1, appendix tables "
    "(FP32-accumulate tensor rates)"
)

GPUS: dict[str, GPUSpec] = {
    spec.name: spec
    for spec in (
        _spec("A100-40GB", (40, 40_960, _SMI_MODAL), 1.555, 312, None, 40, _A100),
        _spec("A100-80GB", (80, 81_920, _SMI_MODAL), 2.039, 312, None, 40, _A100),
        _spec(
            "H100-SXM",
            (80, 81_559, _SMI_NCCL),
            3.35,
            989.4,
            1978.9,
            50,
            _H100 + ", SXM column",
            _CUDA_H100,
        ),
        _spec("H100-PCIe", (80, None, _NO_READING), 2.0, 756.5, 1513, 50, _H100 + ", PCIe column"),
        _spec("H100-NVL", (94, None, _NO_READING), 3.9, 835.5, 1670.5, 50, _H100 + ", NVL column"),
        _spec(
            "H200",
            (141, 143_771, _SMI_H200),
            4.8,
            989.4,
            1978.9,
            60,
            "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column; " + _L2_H200,
            _CUDA_H200,
        ),
        _spec(
            "H200-NVL",
            (141, None, _NO_READING),
            4.8,
            835.5,
            1670.5,
            60,
            "NVIDIA H200 Tensor Core GPU datasheet (2024), NVL column; " + _L2_H200,
        ),
        _spec(
            "B200",
            (180, 183_359, _SMI_B200),
            8.0,
            2250,
            4500,
            None,
            "NVIDIA HGX B200 datasheet (2025), per GPU; L2 not published",
        ),
        _spec(
            "L4",
            (24, 23_034, _SMI_MODAL),
            0.3,
            121,
            242.5,
            48,
            "NVIDIA L4 Tensor Core GPU datasheet (2023); " + _ADA,
        ),
        _spec(
            "L40S",
            (48, 46_068, _SMI_MODAL),
            0.864,
            362.05,
            733,
            96,
            "NVIDIA L40S GPU datasheet (2023); " + _ADA,
        ),
        _spec(
            "RTX-4090",
            (24, 24_564, _SMI_4090),
            1.008,
            165.2,
            330.3,
            72,
            "NVIDIA GeForce RTX 4090 specifications; " + _ADA,
        ),
        _spec(
            "MI300X",
            (192, None, _NO_READING),
            5.3,
            1307.4,
            2614.9,
            32,
            "AMD Instinct MI300X data sheet (2023); L2 4 MB x 8 XCDs, CDNA 3 whitepaper",
        ),
    )
}

# torch.cuda.get_device_name() spellings, most specific first. Whole words only: a GH200
# (a Grace Hopper superchip, its own memory and bandwidth) is not an H200, a GB200 not a
# B200, and the NVL cards have their own rows.
_TORCH_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bA100\b.*\b40GB\b", "A100-40GB"),
    (r"\bA100\b", "A100-80GB"),
    (r"\bH100 NVL\b", "H100-NVL"),
    (r"\bH100\b.*\bPCIe\b", "H100-PCIe"),
    (r"\bH100\b", "H100-SXM"),
    (r"\bH200 NVL\b", "H200-NVL"),
    (r"\bH200\b", "H200"),
    (r"\bB200\b", "B200"),
    (r"\bL40S\b", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bRTX 4090\b", "RTX-4090"),
    (r"\bMI300X\b", "MI300X"),
)


def vllm_budget_bytes(gpu: GPUSpec, gpu_memory_utilization: float) -> int:
    """vLLM's memory budget on one GPU: ``ceil(total x u)`` with CUDA's total
    (``vllm/v1/worker/utils.py`` ``request_memory``); the driver's total where no CUDA
    reading is recorded (:attr:`GPUSpec.vllm_total_label` says which)."""
    u = require_fraction(gpu_memory_utilization, "gpu_memory_utilization")
    return math.ceil(gpu.vllm_total_bytes * u)


def gpu_names() -> list[str]:
    """Names accepted by :func:`get_gpu`."""
    return list(GPUS)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def get_gpu(name: str) -> GPUSpec:
    """Look a card up by name, ignoring case and punctuation (``"h100 sxm"``, ``"H100-SXM"``)."""
    wanted = _key(name)
    for spec_name, spec in GPUS.items():
        if _key(spec_name) == wanted:
            return spec
    try:
        return gpu_from_torch_name(name)
    except KeyError:
        raise KeyError(f"unknown GPU {name!r}: use one of {', '.join(GPUS)}") from None


def gpu_from_torch_name(device_name: str) -> GPUSpec:
    """The row for a ``torch.cuda.get_device_name()`` string such as ``"NVIDIA H100 80GB HBM3"``."""
    for pattern, spec_name in _TORCH_NAMES:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return GPUS[spec_name]
    raise KeyError(f"no spec for device {device_name!r}: known cards are {', '.join(GPUS)}")
