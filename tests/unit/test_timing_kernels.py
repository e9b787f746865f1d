"""kvlib.timing.kernels: the Triton kernels import without triton and say why they cannot
run; what the read kernel must return is the count each program read."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kvlib.timing import kernels as tk


def test_missing_triton_or_gpu_is_a_reason_not_an_error() -> None:
    reason = tk.triton_missing("cpu")
    if importlib.util.find_spec("triton") is None:
        assert reason is not None and "triton is not importable" in reason
    else:  # triton without a GPU: only its interpreter could run the kernels
        assert reason is None or "TRITON_INTERPRET=1" in reason


@pytest.mark.parametrize(("elements", "per_program"), [(10, 4), (8, 4), (1, 64), (4097, 4096)])
def test_read_kernel_reference_counts_each_programs_elements(
    elements: int, per_program: int
) -> None:
    counts = tk._partials_of_ones(elements, per_program, torch.device("cpu"))
    assert counts.numel() == -(-elements // per_program) and int(counts.sum()) == elements
    assert all(0 < c <= per_program for c in counts.tolist())


def test_configs_are_whole_warps_of_vector_loads() -> None:
    for block, iters, warps in tk.STREAM_READ_CONFIGS:
        assert block % (32 * warps * 4) == 0 and iters >= 1  # 16-byte loads, every thread
