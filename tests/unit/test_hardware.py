"""kvlib.hardware: lookups and the datasheet figures the book quotes."""

from __future__ import annotations

import math

import pytest

from kvlib.hardware import (
    GPUS,
    VLLM_GPU_MEMORY_UTILIZATION,
    get_gpu,
    gpu_from_torch_name,
    gpu_names,
    vllm_budget_bytes,
)
from kvlib.units import GB, GiB, MiB


@pytest.mark.parametrize(
    ("device_name", "row"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200 NVL", "H200-NVL"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_torch_device_names(device_name: str, row: str) -> None:
    assert gpu_from_torch_name(device_name).name == row


@pytest.mark.parametrize("device_name", ["NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA H1000"])
def test_a_card_without_its_own_row_is_refused_not_matched_to_a_neighbour(
    device_name: str,
) -> None:
    with pytest.raises(KeyError, match="no spec for device"):
        gpu_from_torch_name(device_name)


def test_nvl_rows_differ_from_the_sxm_rows() -> None:
    # NVL cards run at a lower power limit: fewer FLOP/s than the SXM parts.
    assert GPUS["H100-NVL"].bf16_dense_flops_per_s < GPUS["H100-SXM"].bf16_dense_flops_per_s
    assert GPUS["H200-NVL"].bf16_dense_flops_per_s < GPUS["H200"].bf16_dense_flops_per_s
    assert GPUS["H100-NVL"].datasheet_memory_gb == 94


def test_lookup_ignores_case_and_punctuation() -> None:
    assert get_gpu("h100 sxm") is GPUS["H100-SXM"]
    assert get_gpu("rtx4090") is GPUS["RTX-4090"]
    with pytest.raises(KeyError, match="H100-SXM"):
        get_gpu("V100")


def test_every_row_cites_a_source_and_is_dense() -> None:
    for name in gpu_names():
        spec = GPUS[name]
        assert "datasheet" in spec.source or "whitepaper" in spec.source or "sheet" in spec.source
        # Dense fp8 is twice dense bf16 on every card that has fp8.
        if spec.fp8_dense_flops_per_s is not None:
            ratio = spec.fp8_dense_flops_per_s / spec.bf16_dense_flops_per_s
            assert ratio == pytest.approx(2, rel=0.03)  # L40S sheet: 362.05 vs 733


@pytest.mark.parametrize(
    ("name", "mib"),
    [
        # nvidia-smi memory.total, as the sources in kvlib.hardware record them.
        ("H100-SXM", 81_559),
        ("A100-80GB", 81_920),
        ("A100-40GB", 40_960),
        ("L4", 23_034),
        ("L40S", 46_068),
        ("H200", 143_771),
        ("B200", 183_359),
        ("RTX-4090", 24_564),
    ],
)
def test_memory_is_what_the_driver_reports(name: str, mib: int) -> None:
    spec = get_gpu(name)
    assert spec.memory_bytes == mib * MiB and spec.driver_reported
    assert "nvidia-smi" in spec.memory_source


def test_driver_memory_differs_from_the_printed_figure() -> None:
    """An "80 GB" H100 reports 79.6 GiB; a "24 GB" L4 reports 22.5 GiB, 6 % below 24 GiB."""
    assert get_gpu("H100-SXM").memory_bytes / GiB == pytest.approx(79.65, abs=0.01)
    assert get_gpu("L4").memory_bytes / GiB == pytest.approx(22.49, abs=0.01)
    assert get_gpu("L4").datasheet_memory_gb == 24


def test_rows_without_a_reading_say_so_and_take_the_lower_figure() -> None:
    for name in gpu_names():
        spec = GPUS[name]
        if not spec.driver_reported:
            assert spec.memory_bytes == spec.datasheet_memory_gb * GB
            assert "no driver reading" in spec.memory_source


def test_datasheet_figures() -> None:
    h100 = get_gpu("H100-SXM")
    assert h100.datasheet_memory_gb == 80
    assert h100.hbm_bandwidth_bytes_per_s == 3.35e12
    assert h100.bf16_dense_flops_per_s == pytest.approx(989.4e12)
    # Roofline ridge: about 295 FLOPs per byte on an H100 SXM.
    assert h100.ridge_flops_per_byte == pytest.approx(295.3, abs=0.1)
    # A 24 GB card with a 1008 GB/s bus is an RTX 4090.
    assert get_gpu("RTX-4090").hbm_bandwidth_bytes_per_s == 1.008e12


@pytest.mark.parametrize(("name", "gib"), [("H100-SXM", 79.10), ("H200", 139.81)])
def test_cuda_total_sits_below_the_drivers(name: str, gib: float) -> None:
    """vLLM multiplies CUDA's total (79.10 GiB on an H100, 139.81 on an H200), not nvidia-smi's."""
    spec = get_gpu(name)
    assert spec.cuda_total_bytes is not None
    assert spec.cuda_total_bytes / GiB == pytest.approx(gib, abs=0.005)
    assert spec.cuda_total_bytes < spec.memory_bytes
    assert spec.vllm_total_bytes == spec.cuda_total_bytes and spec.vllm_total_label == "CUDA"
    assert "mem_get_info" in spec.cuda_total_source


def test_without_a_cuda_reading_vllm_totals_fall_back_to_the_driver() -> None:
    l4 = get_gpu("L4")
    assert l4.cuda_total_bytes is None and "no CUDA reading" in l4.cuda_total_source
    assert l4.vllm_total_bytes == l4.memory_bytes and l4.vllm_total_label == "driver"


def test_vllm_budget_is_the_ceiling_of_total_times_u() -> None:
    """vllm/v1/worker/utils.py request_memory: ceil(total_memory x gpu_memory_utilization)."""
    h200 = get_gpu("H200")
    total = 13_981 * GiB // 100
    assert vllm_budget_bytes(h200, 0.92) == math.ceil(total * 0.92)
    assert VLLM_GPU_MEMORY_UTILIZATION == 0.92
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        vllm_budget_bytes(h200, 92)


@pytest.mark.parametrize(("name", "l2_mib"), [("H100-SXM", 50), ("H200", 60), ("H200-NVL", 60)])
def test_l2_is_what_cuda_reports(name: str, l2_mib: int) -> None:
    """cudaDeviceProp.l2CacheSize: 50 MiB on an H100 SXM, 60 MiB on an H200 (torch prints
    "L2_cache_size=60MB" for an H200); the H200 rows cite where the 60 comes from."""
    gpu = get_gpu(name)
    assert gpu.l2_bytes == l2_mib * 2**20
    if name.startswith("H200"):
        assert "60 MiB" in gpu.source and "l2CacheSize" in gpu.source
