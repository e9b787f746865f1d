"""kvlib.timing.devices: the cache a cold run flushes, and what a GPU run records about its GPU."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import torch

from kvlib.timing.devices import (
    FALLBACK_FLUSH_BYTES,
    cache_flush_bytes,
    cpu_cache_bytes,
    cuda_device_facts,
    nvidia_smi,
    resolve_device,
)
from kvlib.units import MiB


def test_sizes_read_from_sysfs(tmp_path: Path) -> None:
    for index, (level, size) in enumerate((("1", "32K"), ("2", "1024K"), ("3", "32768K"))):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(level)
        (folder / "size").write_text(size + "\n")
    assert cpu_cache_bytes(tmp_path) == 32 * 2**20
    assert cpu_cache_bytes(tmp_path / "missing") is None


def test_cpu_flush_is_twice_the_last_level_cache_or_tritons_buffer() -> None:
    llc = cpu_cache_bytes()
    assert cache_flush_bytes("cpu") == (FALLBACK_FLUSH_BYTES if llc is None else 2 * llc)
    # triton's do_bench zeroes 256 * 1024 * 1024 bytes (its NVIDIA driver's
    # get_empty_cache_for_benchmark): the fallback when no cache size is known.
    assert 256 * MiB == FALLBACK_FLUSH_BYTES


def _fake_smi(tmp_path: Path, output: str) -> str:
    """An executable that prints ``output`` as nvidia-smi would, ignoring its arguments."""
    script = tmp_path / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_nvidia_smi_readings_by_field(tmp_path: Path) -> None:
    line = "NVIDIA H200, 570.86, 1980, 1980, 3201, 3201, 35, 120.50 W, 700.00 W, Enabled"
    readings = nvidia_smi(0, command=_fake_smi(tmp_path, line))
    assert readings["name"] == "NVIDIA H200" and readings["driver_version"] == "570.86"
    assert readings["clocks.sm"] == "1980" and readings["power.draw"] == "120.50 W"


def test_nvidia_smi_missing_is_a_reason_not_an_exception(tmp_path: Path) -> None:
    readings = nvidia_smi(0, command=str(tmp_path / "no-such-program"))
    assert set(readings) == {"error"} and "unavailable" in readings["error"]
    assert set(nvidia_smi(0, command=_fake_smi(tmp_path, ""))) == {"error"}


def test_device_facts_refuse_a_cpu() -> None:
    with pytest.raises(ValueError, match="not a CUDA GPU"):
        cuda_device_facts("cpu")
    assert resolve_device("cpu").type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")
def test_device_facts_of_the_gpu() -> None:
    facts = cuda_device_facts("cuda")
    assert facts["type"] == "cuda" and facts["name"] == torch.cuda.get_device_name(0)
    assert facts["l2_bytes"] == torch.cuda.get_device_properties(0).L2_cache_size
