"""kvlib.nn.quant*: round trips within the format's bound, codes equal torch's own
quantizers, stored bytes counted from the tensors equal the documented formulas."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvlib.dtypes import bytes_for  # noqa: E402
from kvlib.nn.quant import Quantized, measure_error, require_input  # noqa: E402
from kvlib.nn.quant_fp8 import FP8_MAX, quantize_fp8  # noqa: E402
from kvlib.nn.quant_int import (  # noqa: E402
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _samples(kind: str, rows: int = 64, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """Matrices with the shapes of trouble: Gaussian, heavy tails, one outlier, sparse."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    if kind == "heavy":  # Student-t with 2 degrees of freedom: rare huge values
        x = x / torch.sqrt(torch.distributions.Chi2(2.0).sample((rows, cols)) / 2)
    elif kind == "outlier":
        x[3, 17] = 300.0
    elif kind == "sparse":
        x[torch.rand(rows, cols, generator=g) < 0.7] = 0.0
    elif kind == "positive":
        x = x.abs() + 5.0  # a range that does not contain 0
    return x


KINDS = ["gauss", "heavy", "outlier", "sparse", "positive"]
FORMATS: dict[str, Callable[[torch.Tensor], Quantized]] = {
    "int8-row": lambda x: quantize_int8(x, axis=0),
    "int8-col": lambda x: quantize_int8(x, axis=-1),
    "int4-g32": lambda x: quantize_int4(x, group_size=32),
    "int4-g128": lambda x: quantize_int4(x, group_size=128),
    "int4-g128-fp32": lambda x: quantize_int4(x, group_size=128, scale_dtype=torch.float32),
    "fp8-tensor": lambda x: quantize_fp8(x),
    "fp8-token": lambda x: quantize_fp8(x, granularity="token"),
}


# --- round trips against the format's bound ------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_round_trip_within_the_formats_bound(fmt: str, kind: str) -> None:
    x = _samples(kind)
    report = measure_error(x, FORMATS[fmt](x))
    assert report.within_bound, f"{fmt} on {kind}: {report}"
    assert report.rel_rms <= report.rel_rms_bound
    assert report.saturated_fraction == 0.0  # scales from the data never clip


_FLOATS = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, width=32)
_SMALL_FORMATS: dict[str, Callable[[torch.Tensor], Quantized]] = {
    **{k: v for k, v in FORMATS.items() if not k.startswith("int4")},
    "int4-g4": lambda x: quantize_int4(x, group_size=4),
    "int4-g8-bf16": lambda x: quantize_int4(x, group_size=8, scale_dtype=torch.bfloat16),
}


_TINY = 2.0**-149  # float32's smallest subnormal


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    st.lists(st.lists(_FLOATS, min_size=8, max_size=8), min_size=1, max_size=3),
    st.sampled_from(sorted(_SMALL_FORMATS)),
)
@example([[0.0] * 7 + [_TINY]], "fp8-tensor")  # max/448 underflows to a zero scale
@example([[0.0] * 7 + [1000 * _TINY]], "fp8-token")  # a subnormal scale, rounded down
@example([[1e4] + [0.0] * 6 + [_TINY]], "int8-col")  # one column of subnormals
@example([[_TINY * k for k in range(8)]], "int8-row")
def test_any_values_round_trip_within_bound(rows: list[list[float]], fmt: str) -> None:
    """Any finite float32 values, subnormals and exact zeros included: a scale never
    goes below float32's smallest normal number, so it is never zero or inexact."""
    x = torch.tensor(rows, dtype=torch.float32)
    assert measure_error(x, _SMALL_FORMATS[fmt](x)).within_bound


@pytest.mark.parametrize(
    ("fmt", "tight"),
    [("int8-row", 0.95), ("int4-g128", 0.95), ("fp8-tensor", 0.5)],
)
def test_bound_is_not_vacuous(fmt: str, tight: float) -> None:
    """On enough Gaussian data the worst element comes close to the bound."""
    x = _samples("gauss", 256, 1024)
    report = measure_error(x, FORMATS[fmt](x))
    assert report.max_abs >= tight * report.max_abs_bound, str(report)


@pytest.mark.parametrize("fmt", ["int8-row", "int4-g128"])
def test_uniform_grid_error_is_a_third_of_the_half_step_squared(fmt: str) -> None:
    """Rounding to a uniform grid leaves errors uniform on [-s/2, s/2]: RMS = (s/2)/sqrt(3)."""
    x = _samples("gauss", 256, 1024)
    report = measure_error(x, FORMATS[fmt](x))
    assert report.rel_rms == pytest.approx(report.rel_rms_bound / math.sqrt(3), rel=0.02)


# --- codes equal torch's own quantizers -----------------------------------------------


def test_int8_equals_torch_fake_quantize_per_channel() -> None:
    x = _samples("heavy")
    q = quantize_int8(x, axis=0)
    scale = q.scale.flatten()
    ref = torch.fake_quantize_per_channel_affine(
        x, scale, torch.zeros_like(scale, dtype=torch.int32), 0, -128, 127
    )
    assert torch.equal(q.dequantize(), ref)


@pytest.mark.parametrize("kind", KINDS)
def test_int4_equals_torch_fake_quantize_on_each_group(kind: str) -> None:
    """Each group is one channel of torch's affine fake quantizer (codes 0..15)."""
    x = _samples(kind)
    q = quantize_int4(x, group_size=32)
    ref = torch.fake_quantize_per_channel_affine(
        x.reshape(-1, 32), q.scale.float().flatten(), q.zeros().flatten().int(), 0, 0, 15
    )
    assert torch.equal(q.dequantize(), ref.reshape(x.shape))


def _e4m3_values() -> torch.Tensor:
    """Every finite float8_e4m3fn value, from its 256 bit patterns."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return values[torch.isfinite(values)].unique()


def test_fp8_rounds_to_the_nearest_e4m3_value_and_saturates() -> None:
    """Brute force: the nearest of the 253 finite e4m3 values, clipped at +-448."""
    table = _e4m3_values()
    assert table.numel() == 253 and float(table.max()) == FP8_MAX
    g = torch.Generator().manual_seed(1)
    y = torch.cat([torch.randn(4000, generator=g) * 10.0 ** torch.randint(-4, 3, (4000,))])
    y = torch.cat([y, torch.tensor([500.0, -1000.0, 447.0, 2.0**-10, 3 * 2.0**-11])])
    q = quantize_fp8(y, scale=1.0).dequantize()
    distance = (y.clamp(-FP8_MAX, FP8_MAX).unsqueeze(1) - table).abs()
    nearest = distance.min(dim=1).values
    assert torch.equal((q - y.clamp(-FP8_MAX, FP8_MAX)).abs(), nearest)


def test_grid_values_are_exact() -> None:
    table = _e4m3_values()
    assert torch.equal(quantize_fp8(table, scale=1.0).dequantize(), table)
    codes = torch.arange(-127, 128, dtype=torch.float32).repeat(3, 1) * 0.5
    assert torch.equal(quantize_int8(codes).dequantize(), codes)
    zeros = torch.zeros(4, 128)
    for make in FORMATS.values():
        assert torch.equal(make(zeros).dequantize(), zeros)


# --- static fp8 scales: calibrated too small, values saturate -------------------------


def test_static_fp8_scale_too_small_saturates_within_the_stated_bound() -> None:
    x = _samples("gauss")
    scale = float(x.abs().max()) / FP8_MAX / 4  # a quarter of the scale the data needs
    q = quantize_fp8(x, scale=scale)
    report = measure_error(x, q)
    assert report.within_bound
    assert report.saturated_fraction > 0
    worst = float(x.abs().max()) - FP8_MAX * scale
    assert report.max_abs == pytest.approx(worst, rel=1e-6)


def test_static_fp8_scale_large_enough_is_like_the_dynamic_one() -> None:
    x = _samples("gauss")
    dynamic = measure_error(x, quantize_fp8(x))
    static = measure_error(x, quantize_fp8(x, scale=float(x.abs().max()) / FP8_MAX))
    assert static.saturated_fraction == 0 and static.rel_rms == pytest.approx(dynamic.rel_rms)


# --- stored bytes, measured from the tensors ------------------------------------------


@pytest.mark.parametrize(("rows", "cols", "group"), [(64, 256, 32), (96, 4096, 128), (5, 48, 16)])
def test_int4_stored_bytes_equal_the_documented_formula(rows: int, cols: int, group: int) -> None:
    """``P x 4/8 + P/g x (2 bytes of fp16 scale + half a byte of 4-bit zero)``."""
    q = quantize_int4(torch.randn(rows, cols), group_size=group)
    params, groups = rows * cols, rows * cols // group
    codes, scales = bytes_for(params, "int4"), groups * 2
    zeros = rows * math.ceil(cols // group / 2)  # zero points packed two a byte, per row
    assert q.stored_bytes == codes + scales + zeros
    assert q.packed.dtype == torch.uint8 and q.packed.numel() == codes


def test_int8_and_fp8_stored_bytes() -> None:
    x = torch.randn(96, 512)
    params = x.numel()
    assert quantize_int8(x, axis=0).stored_bytes == bytes_for(params, "int8") + 96 * 4
    assert quantize_int8(x, axis=1).stored_bytes == bytes_for(params, "int8") + 512 * 4
    assert quantize_fp8(x).stored_bytes == bytes_for(params, "fp8") + 4
    assert quantize_fp8(x, granularity="token").stored_bytes == params + 96 * 4
    cache = torch.randn(10, 8, 128)  # (tokens, kv heads, head_dim): a scale per token and head
    assert quantize_fp8(cache, granularity="token").stored_bytes == cache.numel() + 10 * 8 * 4


def test_packing_order_and_odd_lengths() -> None:
    codes = torch.tensor([[1, 2, 3, 4, 5]], dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.tolist() == [[0x21, 0x43, 0x05]]  # index 2j low nibble, 2j + 1 high
    assert torch.equal(unpack_int4(packed, 5), codes)
    every = torch.arange(16, dtype=torch.uint8).repeat(3, 2)
    assert torch.equal(unpack_int4(pack_int4(every), 32), every)


def test_inputs_in_half_precision_are_accepted() -> None:
    x = _samples("gauss").to(torch.bfloat16)
    for make in FORMATS.values():
        q = make(x)
        assert q.dequantize().dtype == torch.float32
        assert measure_error(x, q).within_bound


# --- bad arguments name themselves ----------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: quantize_int4(torch.randn(4, 100), group_size=128), ValueError, "group_size=128"),
        (lambda: quantize_int4(torch.randn(4, 64), group_size=0), ValueError, "group_size"),
        (lambda: quantize_int4(torch.randn(2, 4, 64)), ValueError, "2-D"),
        (
            lambda: quantize_int4(torch.randn(4, 64), group_size=32, scale_dtype=torch.int8),
            ValueError,
            "scale",
        ),
        (lambda: quantize_int4(torch.ones(2, 32) * 1e9, group_size=32), ValueError, "float32"),
        (lambda: quantize_int8(torch.randn(64)), ValueError, "dimension"),
        (lambda: quantize_int8(torch.randn(4, 4), axis=2), ValueError, "axis"),
        (lambda: quantize_int8(torch.arange(12).reshape(3, 4)), TypeError, "int64"),
        (lambda: quantize_int8([[1.0, 2.0]]), TypeError, "torch.Tensor"),
        (lambda: quantize_fp8(torch.tensor([1.0, float("nan")])), ValueError, "NaN"),
        (lambda: quantize_fp8(torch.tensor([[1.0, float("inf")]])), ValueError, "(0, 1)"),
        (lambda: quantize_fp8(torch.randn(8), granularity="token"), ValueError, "dimension"),
        (lambda: quantize_fp8(torch.randn(8), granularity="channel"), ValueError, "granularity"),
        (lambda: quantize_fp8(torch.randn(8), scale=0.0), ValueError, "positive"),
        (lambda: quantize_fp8(torch.randn(8), scale=float("nan")), ValueError, "positive"),
        (lambda: quantize_fp8(torch.randn(8), scale=torch.ones(2)), ValueError, "one number"),
        (
            lambda: quantize_fp8(torch.randn(2, 8), granularity="token", scale=1.0),
            ValueError,
            "per-token",
        ),
        (lambda: quantize_fp8(torch.empty(0, 4)), ValueError, "empty"),
        (
            lambda: quantize_int8(torch.tensor([[1.0, 1e300]], dtype=torch.float64)),
            ValueError,
            "float32's range",
        ),
    ],
)
def test_bad_arguments_are_named(call: Callable[[], object], error: type, words: str) -> None:
    with pytest.raises(error, match=None) as info:
        call()
    assert words in str(info.value)


def test_measure_error_refuses_a_mismatched_original() -> None:
    q = quantize_int8(torch.randn(4, 8))
    with pytest.raises(ValueError, match="shape"):
        measure_error(torch.randn(4, 9), q)
    assert require_input(torch.ones(2, dtype=torch.float16)).dtype == torch.float32


# --- llama.cpp q4_0 ---------------------------------------------------------------------


def _q4_0_by_hand(block: list[float]) -> list[float]:
    """ggml's quantize_row_q4_0_ref then dequantize_row_q4_0, one block, in plain floats."""
    m = max(block, key=abs)
    d = m / -8
    inv = 1 / d if d else 0.0
    d16 = float(torch.tensor(d, dtype=torch.float16))
    return [(min(15, int(v * inv + 8.5)) - 8) * d16 for v in block]


def test_q4_0_matches_ggml_reference_block_by_block() -> None:
    from kvlib.nn.quant_int import quantize_q4_0

    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)) * 5
    q = quantize_q4_0(x)
    got = q.dequantize()
    for r in range(3):
        for b in range(2):
            block = x[r, 32 * b : 32 * (b + 1)].tolist()
            expect = torch.tensor(_q4_0_by_hand(block))
            assert torch.allclose(got[r, 32 * b : 32 * (b + 1)], expect, atol=1e-6)
    assert q.stored_bytes == 3 * 2 * 18  # 18 bytes per block of 32: 4.5 bits a value
    # The block's extreme value is exact (code 0 times the fp16 scale, up to fp16 rounding).
    extreme = x[0, :32][x[0, :32].abs().argmax()]
    assert float(got[0, :32][x[0, :32].abs().argmax()]) == pytest.approx(float(extreme), rel=1e-3)


def test_q4_0_refuses_rows_not_in_whole_blocks() -> None:
    from kvlib.nn.quant_int import quantize_q4_0

    with pytest.raises(ValueError, match="multiple of 32 columns"):
        quantize_q4_0(torch.zeros(2, 40))
