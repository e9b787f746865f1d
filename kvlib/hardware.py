"""Accelerator specifications, one row per card, each with its datasheet.

Units: ``memory_bytes`` is the HBM/GDDR capacity. Vendors print it as "80GB",
but memory stacks come in binary sizes, so an "80GB" card holds 80 GiB; the
driver reports slightly less (``nvidia-smi`` shows 81,559 MiB on an H100 SXM),
so plan with ``gpu_memory_utilization`` below 1. Bandwidth and FLOP/s are
decimal (1 TB/s = 10**12 B/s) and dense: datasheets also print "with sparsity"
figures, twice as large, that dense transformer inference does not reach.
L2 sizes are binary (50 MB of L2 is 50 MiB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvlib.units import GiB, MiB

__all__ = ["GPUSpec", "GPUS", "get_gpu", "gpu_from_torch_name", "gpu_names"]

TB = 10**12
TFLOP = 10**12


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator: capacity (binary bytes), bandwidth and dense FLOP/s (decimal)."""

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    bf16_dense_flops_per_s: float
    fp8_dense_flops_per_s: float | None
    l2_bytes: int | None
    source: str

    @property
    def ridge_flops_per_byte(self) -> float:
        """Roofline ridge point: bf16 FLOP/s over bandwidth, FLOPs per byte read."""
        return self.bf16_dense_flops_per_s / self.hbm_bandwidth_bytes_per_s


def _spec(
    name: str,
    memory_gib: int,
    bandwidth_tb_s: float,
    bf16_tflops: float,
    fp8_tflops: float | None,
    l2_mib: int | None,
    source: str,
) -> GPUSpec:
    return GPUSpec(
        name=name,
        memory_bytes=memory_gib * GiB,
        hbm_bandwidth_bytes_per_s=bandwidth_tb_s * TB,
        bf16_dense_flops_per_s=bf16_tflops * TFLOP,
        fp8_dense_flops_per_s=None if fp8_tflops is None else fp8_tflops * TFLOP,
        l2_bytes=None if l2_mib is None else l2_mib * MiB,
        source=source,
    )


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
        _spec("A100-40GB", 40, 1.555, 312, None, 40, _A100),
        _spec("A100-80GB", 80, 2.039, 312, None, 40, _A100),
        _spec("H100-SXM", 80, 3.35, 989.4, 1978.9, 50, _H100 + ", SXM column"),
        _spec("H100-PCIe", 80, 2.0, 756.5, 1513, 50, _H100 + ", PCIe column"),
        _spec(
            "H200",
            141,
            4.8,
            989.4,
            1978.9,
            50,
            "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM column",
        ),
        _spec(
            "B200",
            180,
            8.0,
            2250,
            4500,
            None,
            "NVIDIA HGX B200 datasheet (2025), per GPU; L2 not published",
        ),
        _spec("L4", 24, 0.3, 121, 242.5, 48, "NVIDIA L4 Tensor Core GPU datasheet (2023); " + _ADA),
        _spec("L40S", 48, 0.864, 362.05, 733, 96, "NVIDIA L40S GPU datasheet (2023); " + _ADA),
        _spec(
            "RTX-4090",
            24,
            1.008,
            165.2,
            330.3,
            72,
            "NVIDIA GeForce RTX 4090 specifications; " + _ADA,
        ),
        _spec(
            "MI300X",
            192,
            5.3,
            1307.4,
            2614.9,
            32,
            "AMD Instinct MI300X data sheet (2023); L2 4 MB x 8 XCDs, CDNA 3 whitepaper",
        ),
    )
}

# torch.cuda.get_device_name() spellings, most specific first.
_TORCH_NAMES: tuple[tuple[str, str], ...] = (
    (r"A100.*40", "A100-40GB"),
    (r"A100", "A100-80GB"),
    (r"H100.*PCIe", "H100-PCIe"),
    (r"H100", "H100-SXM"),
    (r"H200", "H200"),
    (r"B200", "B200"),
    (r"L40S", "L40S"),
    (r"\bL4\b", "L4"),
    (r"RTX 4090", "RTX-4090"),
    (r"MI300X", "MI300X"),
)


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
