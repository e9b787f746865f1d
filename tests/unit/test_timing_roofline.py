"""kvlib.timing.roofline: the two ceilings, the counts, and the batch at the ridge point."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.sizing import kv_bytes
from kvlib.timing import roofline
from kvlib.weights.params import active_param_count, weight_bytes

H100 = roofline.machine_from_gpu(get_gpu("H100-SXM"))


def test_published_ridge_points() -> None:
    """How to Scale Your Model (Austin et al., 2025), part 1 "All About Rooflines":
    TPU v5e 1.97e14 FLOP/s over 8.2e11 B/s is about 240 FLOPs per byte; an H100's
    9.89e14 over 3.35e12, about 295."""
    tpu = roofline.Machine("TPU v5e", 1.97e14, 8.2e11, "How to Scale Your Model, part 1")
    assert round(tpu.ridge_flops_per_byte) == 240
    assert round(H100.ridge_flops_per_byte) == 295
    assert H100.ridge_flops_per_byte == get_gpu("H100-SXM").ridge_flops_per_byte


def test_dense_figures_only() -> None:
    gpu = get_gpu("H100-SXM")
    assert H100.peak_flops_per_s == gpu.bf16_dense_flops_per_s
    fp8 = roofline.machine_from_gpu(gpu, "fp8")
    assert fp8.peak_flops_per_s == pytest.approx(2 * H100.peak_flops_per_s, rel=1e-3)
    with pytest.raises(ValueError, match="A100-80GB has no dense fp8"):
        roofline.machine_from_gpu(get_gpu("A100-80GB"), "fp8")


@given(st.floats(1e-3, 1e5))
def test_attainable_is_the_lower_ceiling(intensity: float) -> None:
    attainable = H100.attainable_flops_per_s(intensity)
    assert attainable <= H100.peak_flops_per_s
    assert attainable <= H100.bandwidth_bytes_per_s * intensity * (1 + 1e-12)
    assert math.isclose(
        attainable, min(H100.peak_flops_per_s, H100.bandwidth_bytes_per_s * intensity)
    )
    expected = "memory" if intensity < H100.ridge_flops_per_byte else "compute"
    assert H100.bound(intensity) == expected


def test_ceilings_meet_at_the_ridge() -> None:
    ridge = H100.ridge_flops_per_byte
    assert H100.attainable_flops_per_s(ridge) == pytest.approx(H100.peak_flops_per_s)
    assert H100.attainable_flops_per_s(ridge / 2) == pytest.approx(H100.peak_flops_per_s / 2)


def test_counts() -> None:
    assert roofline.copy_bytes_moved(1000) == 2000
    assert roofline.matmul_flops(2, 3, 4) == 48
    assert roofline.matmul_bytes(2, 3, 4, 2) == (8 + 12 + 6) * 2
    assert roofline.decode_kernel_flops(2, 32, 4096, 128) == 4 * 2 * 32 * 4096 * 128
    # Llama-3.1-8B-shaped attention, bf16: the cache dominates; q and output are 1/64 of it.
    moved = roofline.decode_kernel_bytes(1, 32, 8, 4096, 128, 2)
    assert moved == 2 * 8 * 4096 * 128 * 2 + 2 * 32 * 128 * 2


def test_decode_attention_intensity_is_two_per_group_per_element_byte() -> None:
    """FLOPs / cache bytes = 4 H T d / (2 H_kv T d b) = 2 (H / H_kv) / b, batch-free."""
    for batch in (1, 64):
        flops = roofline.decode_kernel_flops(batch, 32, 8192, 128)
        moved = roofline.decode_kernel_bytes(batch, 32, 8, 8192, 128, 2)
        assert flops / moved == pytest.approx(2 * 4 / 2, rel=1e-3)


def test_decode_step_intensity_grows_with_batch_until_caches_dominate() -> None:
    cfg = load_config("Llama-3.1-8B")
    p = active_param_count(cfg)
    w = 2 * p  # bf16 bytes of the weights a step reads (the embedding is looked up)
    assert w < weight_bytes(cfg, "bf16")  # the whole checkpoint holds the embedding too
    kv = kv_bytes(cfg, 8192, "bf16")
    assert roofline.decode_step_intensity(p, w, 1) == 1.0  # 2 FLOPs per 2-byte weight
    sizes = [roofline.decode_step_intensity(p, w, b, kv) for b in (1, 8, 64, 512, 4096)]
    assert sizes == sorted(sizes)
    assert sizes[-1] < 2 * p / kv  # the asymptote: 2 P / KV, ~15 FLOPs per byte here


@given(
    st.integers(10**8, 10**12),
    st.sampled_from([1, 2]),
    st.floats(10.0, 600.0),
    st.integers(0, 10**8),
)
def test_ridge_batch_reaches_the_ridge(params: int, b: int, ridge: float, kv: int) -> None:
    batch = roofline.ridge_batch(params, b * params, ridge, kv)
    if 2 * params <= ridge * kv:
        assert batch is None
        assert roofline.decode_step_intensity(params, b * params, 10**6, kv) < ridge
        return
    assert batch is not None and batch > 0
    flops = 2 * params * batch
    assert flops / (b * params + batch * kv) == pytest.approx(ridge, rel=1e-9)


def test_ridge_batch_without_caches_is_ridge_times_bytes_over_two() -> None:
    ridge = H100.ridge_flops_per_byte
    assert roofline.ridge_batch(8 * 10**9, 16 * 10**9, ridge) == pytest.approx(ridge)
    assert roofline.ridge_batch(8 * 10**9, 8 * 10**9, ridge) == pytest.approx(ridge / 2)


def test_long_contexts_never_reach_the_ridge() -> None:
    """Llama-3.1-8B on an H100: each 8K-token sequence reads 1 GiB of cache per step."""
    cfg = load_config("Llama-3.1-8B")
    p = active_param_count(cfg)
    w = 2 * p
    ridge = H100.ridge_flops_per_byte
    assert roofline.ridge_batch(p, w, ridge, kv_bytes(cfg, 8192, "bf16")) is None
    short = roofline.ridge_batch(p, w, ridge, kv_bytes(cfg, 64, "bf16"))
    assert short is not None and short > roofline.ridge_batch(p, w, ridge)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: roofline.Machine("x", 0, 1, "s"), "peak_flops_per_s"),
        (lambda: roofline.Machine("x", 1, float("inf"), "s"), "bandwidth_bytes_per_s"),
        (lambda: roofline.copy_bytes_moved(0), "n_bytes"),
        (lambda: roofline.matmul_flops(1, 0, 1), "n must"),
        (lambda: roofline.matmul_bytes(1, 1, 1, True), "bytes_per_element"),
        (lambda: roofline.decode_kernel_bytes(1, 6, 4, 8, 8, 2), "multiple of kv_heads"),
        (lambda: roofline.ridge_batch(10, 20, -1.0), "ridge_flops_per_byte"),
        (lambda: H100.bound(0), "intensity"),
    ],
)
def test_bad_input_names_the_argument(call: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_per_operation_step_adds_the_cache_reads_to_the_matmuls_roofline() -> None:
    """T = B KV / BW + max(2 B P / F, W / BW), against the merged max: equal while the matmuls
    are memory-bound (both are bytes over bandwidth), apart once they are compute-bound,
    the merged one low by the cache reads the matmuls' arithmetic cannot hide."""
    decode_step_s_merged = roofline.decode_step_s_merged
    decode_step_s_per_operation = roofline.decode_step_s_per_operation
    matmul_ridge_batch = roofline.matmul_ridge_batch
    llama = load_config("Llama-3.1-8B")
    p = active_param_count(llama)
    w = 2 * p
    h100 = H100
    kv = kv_bytes(llama, 512, "bf16")
    bw, peak = 3.35e12, 989.4e12
    small = decode_step_s_per_operation(p, w, 8, kv, h100)
    assert small == pytest.approx((w + 8 * kv) / bw)
    assert small == pytest.approx(decode_step_s_merged(p, w, 8, kv, h100))
    big = decode_step_s_per_operation(p, w, 512, kv, h100)
    assert big == pytest.approx(512 * kv / bw + 2 * 512 * p / peak)
    merged = decode_step_s_merged(p, w, 512, kv, h100)
    assert 0.15 < 1 - merged / big < 0.22  # the merged bound is about 18% low here
    # The matmuls cross the ridge at F W / (2 P BW): the ridge itself for bf16 weights,
    # the same batch for fp8 weights on fp8 arithmetic, half of it on bf16 arithmetic.
    assert matmul_ridge_batch(p, w, h100) == pytest.approx(peak / bw)
    fp8 = roofline.machine_from_gpu(get_gpu("H100-SXM"), "fp8")
    assert matmul_ridge_batch(p, p, fp8) == pytest.approx(matmul_ridge_batch(p, w, h100), rel=1e-3)
    assert matmul_ridge_batch(p, p, h100) == pytest.approx(peak / bw / 2)
