"""The chapter 8 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, the named mistakes stay away from the right value
and from each other, and each right value is what an independent computation gives:
kvlib.tiers (the link table, the reload, the hand-off's pairs and DistServe's instance
ratio) and the step model (kvlib.step) on a config built from the drawn fields.

Each hidden test of ``solutions/08_beyond_one_gpu/beyond_one_gpu.ipynb`` is swept
(``sweep.py``): run with ``numbers`` returning each combination of its choices in turn and
``expect`` replaced by a recorder, so the right value and the mistakes are the hidden
test's own.
"""

from __future__ import annotations

from typing import Any

import pytest

from assignments import sweep
from kvlib.bounds import kv_bytes_per_gpu, prefill_attention_flops
from kvlib.hardware import get_gpu
from kvlib.step import StepTime, decode_attention_flops, step_time_from_counts
from kvlib.tiers.handoff import InstanceRatio, handoff, transfer_s
from kvlib.tiers.links import get_link, pcie_gbit_per_s
from kvlib.tiers.reload import reload_s

NOTEBOOK = sweep.Notebook("08_beyond_one_gpu/beyond_one_gpu.ipynb")
TESTS = NOTEBOOK.tests


def test_four_challenges_worth_eight_points() -> None:
    assert TESTS == ["reload_ms", "handoff_ms", "prefill_per_decode", "ttft_saved_ms"]
    assert sum(NOTEBOOK.points) == 8


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    sweep.assert_solved_with_distinct_mistakes(NOTEBOOK, grade_id, after_numbers_cell=True)


@pytest.mark.parametrize("grade_id", TESTS)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    sweep.assert_visible_check_accepts_right_answers(NOTEBOOK, grade_id)


def test_the_prompt_draws_the_numbers_the_hidden_test_draws() -> None:
    sweep.assert_prompts_draw_as_hidden_tests(NOTEBOOK)


_config = sweep.llama_like


def _links(grade_id: str) -> list[tuple[Any, ...]]:
    return list(sweep.choices(NOTEBOOK.hidden(grade_id))[1]["link"])


@pytest.mark.parametrize("grade_id", ["reload_ms", "handoff_ms", "ttft_saved_ms"])
def test_each_printed_link_is_a_row_of_kvlibs_table(grade_id: str) -> None:
    """The rate a prompt prints is the datasheet figure kvlib.tiers.links records, in the
    same unit; a PCIe link is printed per lane in GT/s and recorded as x16 in Gb/s."""
    for link in _links(grade_id):
        name, rate, unit = (link[0], link[1], "GT/s") if len(link) == 2 else (
            link[0], link[2], link[3])
        row = get_link(name)
        if unit == "GT/s":
            assert row.datasheet_unit == "Gb/s", name
            assert row.datasheet_rate == pytest.approx(pcie_gbit_per_s(rate, 16), rel=1e-15)
        else:
            assert (row.datasheet_rate, row.datasheet_unit) == (rate, unit), name


def test_every_unit_of_the_table_is_drawn() -> None:
    units = {link[3] for link in _links("reload_ms")}
    assert units == {"GT/s", "GB/s", "MB/s", "Gb/s"}


def test_reload_ms_is_kvlib_tiers_reload() -> None:
    """Every draw against kvlib.tiers.reload.reload_s: one GPU's share of the prefix
    (kvlib.bounds.kv_bytes_per_gpu) over the link's bytes a second in kvlib's table."""
    for draw, right in NOTEBOOK.right_values("reload_ms"):
        cfg = _config(*draw.model)
        link = get_link(draw.link[0])
        expected = 1e3 * reload_s(cfg, draw.prefix, link.bytes_per_s, tp=draw.tp)
        assert right == pytest.approx(expected, rel=1e-12), draw


def test_handoff_ms_is_kvlib_tiers_handoff() -> None:
    """Every draw against kvlib.tiers.handoff, which assigns each KV head of each layer to
    a (prefill GPU, decode GPU) pair and times the busiest GPU on its own link."""
    for draw, right in NOTEBOOK.right_values("handoff_ms"):
        cfg = _config(*draw.model)
        prefill_tp, decode_tp = draw.tps
        plan = handoff(cfg, draw.prompt, prefill_tp=prefill_tp, decode_tp=decode_tp)
        expected = 1e3 * transfer_s(plan, get_link(draw.link[0]).bytes_per_s)
        assert right == pytest.approx(expected, rel=1e-12), draw
        # No head is replicated here: the pairs carry the request's cache exactly once.
        assert plan.wire_bytes == plan.transfer_bytes, draw


def _step(draw: Any, *, decode: int = 0, context: int = 0, prefill: int = 0) -> StepTime:
    """The step model (kvlib.step) on the drawn sizes: weights read once, 2 FLOPs a
    parameter a token, the decodes' caches and attention FLOPs, the prompt's causal
    attention, at MFU x the card's dense bf16 peak."""
    layers, heads, kv_heads, head_dim, params = draw.model
    cfg = _config(layers, heads, kv_heads, head_dim)
    card = get_gpu(draw.gpu)
    return step_time_from_counts(
        weight_bytes=2 * params * 10**9,
        weight_flops=2 * params * 10**9 * (decode + prefill),
        decode_tokens=decode,
        decode_kv_bytes=decode * kv_bytes_per_gpu(cfg, context) if decode else 0,
        decode_attention_flops=decode * decode_attention_flops(cfg, context) if decode else 0,
        prefill_tokens=prefill,
        prefill_attention_flops=prefill_attention_flops(cfg, prefill) if prefill else 0,
        matmul_flops_per_s=card.bf16_dense_flops_per_s,
        bandwidth_bytes_per_s=card.hbm_bandwidth_bytes_per_s,
        mfu=draw.mfu,
    )


def test_prefill_per_decode_is_distserves_ratio_on_the_step_model() -> None:
    """Every draw: the two steps from kvlib.step (decode attention's FLOPs counted too:
    they stay under its bytes), their rates balanced as kvlib.tiers.handoff's
    InstanceRatio balances them."""
    for draw, right in NOTEBOOK.right_values("prefill_per_decode"):
        prefill = _step(draw, prefill=draw.prompt)
        decode = _step(draw, decode=draw.batch, context=draw.prompt + draw.output // 2)
        assert prefill.reachable() and decode.reachable(), draw
        ratio = InstanceRatio(prefill.total_s, decode.total_s, 1 / prefill.total_s,
                              draw.batch / (draw.output * decode.total_s))
        assert right == pytest.approx(ratio.prefill_per_decode, rel=1e-12), draw
        assert 0.05 < right < 50, draw  # a ratio a deployment could build


def test_ttft_saved_ms_is_the_step_models_recompute_less_kvlibs_reload() -> None:
    """Every draw: recomputing the prefix is a prefill step of kvlib.step, reloading it is
    kvlib.tiers.reload.reload_s over the PCIe row of kvlib's link table."""
    for draw, right in NOTEBOOK.right_values("ttft_saved_ms"):
        cfg = _config(*draw.model[:4])
        recompute = _step(draw, prefill=draw.prefix).total_s
        reload = reload_s(cfg, draw.prefix, get_link(draw.link[0]).bytes_per_s)
        assert reload < recompute, draw  # the host tier pays on every drawn turn
        assert right == pytest.approx(1e3 * draw.reuse * (recompute - reload), rel=1e-12), draw
