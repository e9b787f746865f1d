"""kvlib.nn.recall: recall against context for well and badly calibrated fp8 KV scales,
the saturation-tie mechanism checked against torch's own e4m3 rounding."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kvlib.nn.quant import measure_error  # noqa: E402
from kvlib.nn.quant_fp8 import quantize_fp8  # noqa: E402
from kvlib.nn.recall import (  # noqa: E402
    VLLM_K_SCALE_CONSTANT,
    VLLM_V_SCALE_CONSTANT,
    Calibration,
    Head,
    calibrate,
    recall_curves,
    tie_recall_bound,
)

CONTEXTS = [256, 1024, 4096]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _calibrated(head: Head, seed: int = 99) -> Calibration:
    """Scales from 2,048 tokens of the same distribution, 32 of them needle-like."""
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (32, head.massive_channels), generator=g) * 2.0 - 1
    keys = torch.cat([head.keys(2048, g), head.needle_keys(signs, g)])
    return calibrate("calibrated", keys, head.values(2048, g))


@pytest.fixture(scope="module")
def curves() -> dict[str, tuple[float, ...]]:
    torch.set_num_threads(1)
    head = Head()
    cals = [
        Calibration("float32"),
        _calibrated(head),
        Calibration("scale 1.0", k_scale=1.0, v_scale=1.0),
        Calibration("per-token", per_token=True),
    ]
    found = recall_curves(CONTEXTS, cals, head=head, haystacks=6, needles=24, seed=3)
    assert all(c.trials == 144 and c.contexts == tuple(CONTEXTS) for c in found.values())
    return {name: c.recall for name, c in found.items()}


def test_unquantized_and_well_calibrated_caches_retrieve_at_every_context(
    curves: dict[str, tuple[float, ...]],
) -> None:
    for name in ("float32", "calibrated", "per-token"):
        assert min(curves[name]) >= 0.97, (name, curves[name])


def test_scale_one_passes_short_contexts_and_fails_long_ones(
    curves: dict[str, tuple[float, ...]],
) -> None:
    bad = curves["scale 1.0"]
    assert bad[0] >= 0.85, bad  # a short spot check would pass
    assert bad[-1] <= bad[0] - 0.3, bad  # and the long context breaks
    assert all(later <= earlier + 0.05 for earlier, later in zip(bad, bad[1:], strict=False))


def test_recall_stays_under_the_tie_bound(curves: dict[str, tuple[float, ...]]) -> None:
    """A fair tie-break is the best a saturated needle can hope for; averaging does worse."""
    bound = tie_recall_bound(Head(), 1.0, CONTEXTS)
    for simulated, limit in zip(curves["scale 1.0"], bound, strict=True):
        assert simulated <= limit + 0.1


def test_saturation_ties_occur_at_the_rate_the_bound_assumes() -> None:
    """Distractors whose every massive channel rounds to the needle's +-448: (T - 1) p of them.

    Counted on the codes torch's float8_e4m3fn cast produces, against
    ``p = P(z > 432 s / sigma)^m`` (432: the midpoint between 416 and 448).
    """
    head = Head(head_dim=4, massive_channels=2)
    g = torch.Generator().manual_seed(7)
    tokens, scale = 400_000, 1.0
    keys = quantize_fp8(head.keys(tokens, g), scale=scale).dequantize()
    top = 448 * scale
    tied = int((keys[:, :2] == top).all(dim=1).sum())  # the query's signs: + and +
    tail = 0.5 * math.erfc(432 * scale / head.massive_std / math.sqrt(2))
    expected = tokens * tail**2
    assert abs(tied - expected) <= 4 * math.sqrt(expected), (tied, expected)
    (bound,) = tie_recall_bound(head, scale, [tokens])
    assert bound == pytest.approx((1 - (1 - tail**2) ** tokens) / (tokens * tail**2))


@pytest.mark.parametrize(("tokens", "p"), [(1, 0.3), (7, 0.2), (40, 0.01), (300, 0.004)])
def test_tie_bound_is_the_expected_share_of_a_fair_tie_break(tokens: int, p: float) -> None:
    """``(1 - (1 - p)^T) / (T p) = sum_k C(T-1, k) p^k (1-p)^(T-1-k) / (k + 1)``."""
    exact = sum(
        math.comb(tokens - 1, k) * p**k * (1 - p) ** (tokens - 1 - k) / (k + 1)
        for k in range(tokens)
    )
    # the static scale at which each massive channel saturates with probability sqrt(p)
    scale = math.sqrt(2) * Head().massive_std * _erfc_inverse(2 * math.sqrt(p)) / 432
    (bound,) = tie_recall_bound(Head(), scale, [tokens])
    assert bound == pytest.approx(exact, rel=1e-6)


def _erfc_inverse(y: float) -> float:
    """Solve erfc(x) = y by bisection (the stdlib has no inverse)."""
    lo, hi = -6.0, 6.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid) > y else (lo, mid)
    return (lo + hi) / 2


def test_no_tie_without_saturation() -> None:
    head = Head()
    generous = head.needle_sigmas * head.massive_std / 400  # the needle stays below 448
    assert tie_recall_bound(head, generous, [10, 10_000]) == [1.0, 1.0]


def test_calibrated_scales_never_saturate_the_cache() -> None:
    head = Head()
    cal = _calibrated(head)
    g = torch.Generator().manual_seed(5)
    keys = head.keys(4096, g)
    assert cal.k_scale is not None
    report = measure_error(keys, quantize_fp8(keys, scale=cal.k_scale))
    assert report.saturated_fraction == 0 and report.within_bound
    one = measure_error(keys, quantize_fp8(keys, scale=1.0))
    assert one.saturated_fraction > 0  # massive channels beyond 448 at scale 1.0


def test_keys_and_values_are_both_stored_in_fp8() -> None:
    cal = Calibration("c", k_scale=0.5, v_scale=2.0**-6)  # powers of 2: x / s is exact
    x = torch.randn(16, 8)
    for scale in (0.5, 2.0**-6):
        stored = cal.store(x, scale)
        codes = stored / scale
        assert torch.equal(codes.to(torch.float8_e4m3fn).float(), codes)
        assert not torch.equal(stored, x)
    assert torch.equal(Calibration("none").store(x, None), x)


def test_seeded_and_reproducible() -> None:
    cals = [Calibration("scale 1.0", 1.0, 1.0)]
    a = recall_curves([512, 2048], cals, haystacks=2, needles=8, seed=11)
    b = recall_curves([512, 2048], cals, haystacks=2, needles=8, seed=11)
    assert a == b


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: recall_curves([], [Calibration("a")]), "contexts"),
        (lambda: recall_curves([2048, 1024], [Calibration("a")]), "increasing"),
        (lambda: recall_curves([0, 8], [Calibration("a")]), "positive"),
        (lambda: recall_curves([8], [Calibration("a"), Calibration("a")]), "distinct"),
        (lambda: recall_curves([8], [Calibration("a")], haystacks=0), "haystacks"),
        (lambda: Calibration("a", k_scale=1.0), "both"),
        (lambda: Calibration("a", 1.0, 1.0, per_token=True), "per_token"),
        (lambda: Head(massive_channels=0), "massive_channels"),
        (lambda: Head(massive_std=-1.0), "massive_std"),
    ],
)
def test_bad_arguments_are_named(call: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        call()  # type: ignore[operator]


def test_vllm_scale_constants_leave_headroom_above_the_calibration_maximum() -> None:
    keys, values = torch.full((4, 8), 300.0), torch.full((4, 8), 2.0)
    llm_compressor = calibrate("llmc", keys, values)
    vllm = calibrate("vllm", keys, values, k_divisor=VLLM_K_SCALE_CONSTANT,
                     v_divisor=VLLM_V_SCALE_CONSTANT)
    assert llm_compressor.k_scale == pytest.approx(300 / 448)
    assert vllm.k_scale == pytest.approx(300 / 200) and vllm.v_scale == pytest.approx(2 / 100)
    # A key 2x the calibration maximum saturates under max/448, not under max/200.
    key = torch.tensor([[600.0]])
    assert float(llm_compressor.store(key, llm_compressor.k_scale)) == pytest.approx(300.0)
    assert float(vllm.store(key, vllm.k_scale)) == pytest.approx(600.0, rel=0.07)
    with pytest.raises(ValueError, match="k_divisor must be positive"):
        calibrate("bad", keys, values, k_divisor=0)


def test_a_query_off_the_massive_channels_breaks_the_saturation_ties() -> None:
    """At scale 1.0 the needle ties with distractors on the saturated channels; a query that
    also reads ordinary channels (where the needle stands out, unsaturated) tells them apart."""
    head = Head()
    contexts = [1_024, 16_384]
    bad = [Calibration("scale 1.0", k_scale=1.0, v_scale=1.0)]
    only = recall_curves(contexts, bad, head=head, haystacks=2, needles=16, seed=3)
    mixed = recall_curves(contexts, bad, head=head, haystacks=2, needles=16, seed=3,
                          massive_share=0.5)
    assert only["scale 1.0"].recall[-1] < 0.5
    assert mixed["scale 1.0"].recall[-1] > only["scale 1.0"].recall[-1] + 0.3
    with pytest.raises(ValueError, match="massive_share must be in"):
        recall_curves(contexts, bad, head=head, massive_share=0.0)


def test_a_q4_0_cache_keeps_the_massive_channels_and_loses_their_neighbours() -> None:
    """q4_0 scales each block of 32 channels by its largest value: in the block that holds
    a massive channel the ordinary channels round to zero."""
    head = Head()
    keys = head.keys(64, torch.Generator().manual_seed(1))
    stored = Calibration("q4_0", q4_0=True).store(keys, None)
    assert torch.allclose(stored[:, 0], keys[:, 0], rtol=0.1, atol=head.massive_std / 8)
    first_block_ordinary = stored[:, head.massive_channels : 32]
    assert float((first_block_ordinary == 0).float().mean()) > 0.9
    # The other blocks, with no massive channel, keep their values to a 16th of their range.
    assert float((stored[:, 32:] - keys[:, 32:]).abs().max()) < 0.6
