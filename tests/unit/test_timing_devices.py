"""kvlib.timing.devices: the cache a cold run flushes, and what a GPU run records about its GPU."""

from __future__ import annotations

import stat
import sys
import types
from pathlib import Path

import pytest
import torch

from kvlib.timing.devices import (
    FALLBACK_FLUSH_BYTES,
    cache_flush_bytes,
    clock_reader,
    cold_cache_bytes,
    cpu_cache_bytes,
    cuda_device_facts,
    nvidia_smi,
    nvml_clock_reader,
    resolve_device,
    smi_clock_reader,
    throttle_reasons,
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


def test_cpu_flush_is_the_cold_cache_rule() -> None:
    llc = cpu_cache_bytes()
    assert cache_flush_bytes("cpu") == cold_cache_bytes(llc)
    assert cache_flush_bytes("cpu") >= (FALLBACK_FLUSH_BYTES if llc is None else 4 * llc)


@pytest.mark.parametrize(
    ("l2_mib", "floor", "expected_mib"),
    [(50, None, 256), (60, None, 256), (126, None, 504), (60, 0, 240), (None, None, 256)],
)
def test_cold_cache_rule_is_four_caches_and_do_benchs_256_mib(
    l2_mib: int | None, floor: int | None, expected_mib: int
) -> None:
    """H100 SXM (50 MiB of L2) and H200 (60) get do_bench's 256 MiB; a B200 (126) 504."""
    cache = None if l2_mib is None else l2_mib * MiB
    got = cold_cache_bytes(cache) if floor is None else cold_cache_bytes(cache, floor)
    assert got == expected_mib * MiB


@pytest.mark.parametrize("bad", [0, -1, 1.5, "60 MiB"])
def test_cold_cache_rule_names_a_bad_size(bad: object) -> None:
    with pytest.raises(ValueError, match="cache_bytes"):
        cold_cache_bytes(bad)  # type: ignore[arg-type]
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


def test_throttle_reasons_decode_nvml_bits() -> None:
    assert throttle_reasons(0) == []
    assert throttle_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert throttle_reasons(0x1000 | 0x1) == ["gpu_idle", "unknown_bits_0x1000"]
    with pytest.raises(ValueError, match="mask"):
        throttle_reasons(-1)


def _smi_by_field(tmp_path: Path, accepted: str, output: str) -> str:
    """A fake nvidia-smi that answers only a query naming ``accepted``, as a driver
    that knows one name of the reasons field does."""
    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *{accepted}*) printf \'%s\\n\' \'{output}\' ;; '
        "*) echo 'Field is not a valid field to query.' >&2; exit 2 ;; esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize("field", ["clocks_event_reasons", "clocks_throttle_reasons"])
def test_smi_clock_reader_reads_clocks_and_reasons(tmp_path: Path, field: str) -> None:
    line = "1755 MHz, 3201 MHz, 61, 612.30 W, 0x0000000000000004"
    read = smi_clock_reader("00000000:19:00.0", command=_smi_by_field(tmp_path, field, line))
    for _ in range(2):  # the second reading goes straight to the name that worked
        reading = read()
        assert reading["sm_mhz"] == 1755 and reading["mem_mhz"] == 3201
        assert reading["temperature_c"] == 61 and reading["power_w"] == pytest.approx(612.3)
        assert reading["reasons"] == ["sw_power_cap"]


def test_smi_clock_reader_reports_a_missing_program(tmp_path: Path) -> None:
    reading = smi_clock_reader(0, command=str(tmp_path / "absent"))()
    assert "unavailable" in reading["error"]
    source, _ = clock_reader("0", command=str(tmp_path / "absent"))
    assert source == "nvidia-smi (no PCI bus id for NVML)"


def test_nvml_reader_by_bus_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for nvidia-ml-py's module: the calls and constants the reader uses."""
    asked: list[object] = []

    def unsupported(handle: object) -> int:
        raise RuntimeError("NVMLError_NotSupported")

    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByPciBusId=lambda bus: asked.append(bus) or "h",
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4,
        nvmlDeviceGetClockInfo=lambda h, kind: {1: 1980, 2: 3201}[kind],
        nvmlDeviceGetTemperature=lambda h, sensor: 44,
        nvmlDeviceGetPowerUsage=unsupported,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source, read = clock_reader("00000000:19:00.0")
    reading = read()
    assert source == "nvml" and asked == [b"00000000:19:00.0"]
    assert reading["sm_mhz"] == 1980 and reading["mem_mhz"] == 3201
    assert reading["temperature_c"] == 44 and reading["reasons"] == ["sw_power_cap"]
    assert reading["power_w"] is None  # unsupported on this board: that field alone is lost


def test_nvml_absent_means_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert nvml_clock_reader("00000000:19:00.0") is None
    source, _ = clock_reader("00000000:19:00.0")
    assert source == "nvidia-smi (nvidia-ml-py is not installed)"
