"""The chapter 7 assignment on every draw of its numbers: each challenge is a sensible
problem, the solution gets it right, the named mistakes stay away from the right value
and from each other, and each right value is what an independent computation gives:
vLLM's pool arithmetic (kvlib.paging.vllm_pool), kvlib.sizing and kvlib.bounds on a config built
from the drawn fields, the engine's own scheduler, and kvlib.capacity.crossover.

Each hidden test of ``solutions/07_capstone/capstone.ipynb`` is swept (``sweep.py``): run
with ``numbers`` returning each combination of its choices in turn and ``expect`` replaced
by a recorder, so the right value and the mistakes are the hidden test's own.
"""

from __future__ import annotations

from typing import Any

import pytest

from assignments import sweep
from kvlib.bounds import kv_bytes_per_gpu, prefill_attention_flops
from kvlib.capacity.crossover import crossover
from kvlib.config import load_config
from kvlib.engine.scheduler import Scheduler, SeqState
from kvlib.hardware import get_gpu
from kvlib.paging.table import PagedKVCache
from kvlib.paging.vllm_pool import kv_pool
from kvlib.sizing import seats_for_context
from kvlib.step import step_time_from_counts
from kvlib.units import GiB

NOTEBOOK = sweep.Notebook("07_capstone/capstone.ipynb")
CELLS = NOTEBOOK.cells
TESTS = NOTEBOOK.tests
UNITS = NOTEBOOK.units
# Fewest named mistakes every draw keeps; a GPU count has few wrong values to be.
MIN_MISTAKES = {"tp_gpus": 2, "first_token_step": 2}


def test_eight_challenges_worth_sixteen_points() -> None:
    points = NOTEBOOK.points
    assert TESTS == ["seats_freed", "fp8_seats", "tp_gpus", "still_running", "crossover",
                     "config_seats", "first_token_step", "step_ms"]
    assert sum(points) == 16


@pytest.mark.parametrize("grade_id", TESTS)
def test_every_draw_is_sensible_solved_and_its_mistakes_distinct(grade_id: str) -> None:
    # The student's cell runs after the numbers cell (which may define `config`).
    sweep.assert_solved_with_distinct_mistakes(
        NOTEBOOK, grade_id, min_mistakes=MIN_MISTAKES.get(grade_id, 3), after_numbers_cell=True
    )


@pytest.mark.parametrize("grade_id", TESTS)
def test_the_visible_check_accepts_every_right_answer(grade_id: str) -> None:
    sweep.assert_visible_check_accepts_right_answers(NOTEBOOK, grade_id)


def test_the_prompt_draws_the_numbers_the_hidden_test_draws() -> None:
    sweep.assert_prompts_draw_as_hidden_tests(NOTEBOOK)


_config = sweep.llama_like


def test_seats_freed_is_the_change_in_vllms_maximum_concurrency() -> None:
    for i, (draw, right) in enumerate(NOTEBOOK.right_values("seats_freed")):
        if i % 7:
            continue  # every seventh draw: vLLM's pool arithmetic is slow to build
        cfg = _config(*draw.model)
        free = draw.free_gib * GiB
        before = kv_pool(cfg, free, max_model_len=draw.model_max).max_concurrency
        after = kv_pool(cfg, free, max_model_len=draw.need).max_concurrency
        assert right == int(after) - int(before), draw


def _vllm_budget(gpu: str) -> int:
    """vLLM's request_memory: ceil(total x 0.92), CUDA's total as the card's row records it
    to 0.01 GiB (vllm/v1/worker/utils.py), computed here from that reading directly."""
    hundredths = {"H100-SXM": 7_910, "H200": 13_981}[gpu]
    return -(-(hundredths * GiB // 100) * 92 // 100)


def test_fp8_seats_are_sizings_seats_in_the_pool_left() -> None:
    for draw, right in NOTEBOOK.right_values("fp8_seats"):
        gpu, layers, heads, kv_heads, head_dim, params = draw.setup
        pool = _vllm_budget(gpu) - 2 * params * 10**9 - draw.runtime_gib * GiB
        cfg = _config(layers, heads, kv_heads, head_dim)
        assert right == seats_for_context(cfg, pool, draw.context, "fp8"), draw


def _tp_fits(case: tuple[Any, ...], tp: int) -> bool:
    """Whether ``tp`` GPUs hold the case's weights and caches, per kvlib.bounds's KV share."""
    layers, heads, kv_heads, head_dim, params, gpu, sequences, context = case
    cfg = _config(layers, heads, kv_heads, head_dim)
    room = _vllm_budget(str(gpu)) - 2 * GiB - 2 * params * 10**9 // tp
    return bool(room >= sequences * kv_bytes_per_gpu(cfg, context, "bf16", tp))


def test_tp_gpus_is_the_smallest_degree_kvlib_deploy_fits() -> None:
    for draw, right in NOTEBOOK.right_values("tp_gpus"):
        assert _tp_fits(draw.case, right), draw
        assert not any(_tp_fits(draw.case, tp) for tp in (1, 2, 4, 8) if tp < right), draw
        assert right in (2, 4, 8), draw  # one GPU never suffices: the question is TP


def test_still_running_is_what_the_engines_scheduler_does() -> None:
    """Every draw, run through kvlib.engine.scheduler (the engine's scheduler) step by
    step until the first preemption."""
    for draw, right in NOTEBOOK.right_values("still_running"):
        blocks = draw.admitted * draw.prompt_blocks + draw.extra_blocks
        prompt = draw.prompt_blocks * draw.block_size - draw.prompt_gap
        cache = PagedKVCache(blocks, draw.block_size, enable_prefix_caching=False)
        scheduler = Scheduler(cache, max_num_seqs=16)
        for i in range(draw.admitted + draw.waiting):
            scheduler.add(SeqState(f"r{i}", list(range(prompt)), 64, 0.0))
        plan = scheduler.schedule(0.0)
        assert len(plan.prefill) == draw.admitted
        for seq in plan.prefill:
            seq.generated.append(1)
        for step in range(1, 64):
            plan = scheduler.schedule(float(step))
            assert not plan.prefill, "nobody is admitted before the first preemption"
            for seq in plan.decode:
                seq.generated.append(1)
            if plan.preempted:
                break
        assert plan.preempted, draw
        assert len(scheduler.running) == right, draw
        # The newest were evicted: the survivors are the oldest requests.
        assert [s.request_id for s in scheduler.running] == [f"r{i}" for i in range(right)]


def test_crossover_is_kvlib_costs() -> None:
    for draw, right in NOTEBOOK.right_values("crossover"):
        point = crossover(draw.gpu_hour_price, draw.gpus, draw.gpus * draw.tokens_per_s_per_gpu,
                          draw.price_per_million)
        assert right == pytest.approx(point.utilization, rel=1e-12)
        assert point.dedicated_pays, draw


def test_config_seats_are_vllms_maximum_concurrency_on_each_gpu() -> None:
    """Every draw against vLLM's pool arithmetic (kvlib.paging.vllm_pool: whole 16-token
    blocks of each GPU's page) on the real config, the latent replicated under tp."""
    for draw, right in NOTEBOOK.right_values("config_seats"):
        cfg = load_config(draw.model)
        pool = kv_pool(cfg, draw.pool_gib * GiB, max_model_len=draw.context, tp=draw.tp)
        assert right == int(pool.max_concurrency), draw
        assert right >= 1, draw


def test_both_kinds_of_attention_are_drawn() -> None:
    models = sweep.choices(NOTEBOOK.hidden("config_seats"))[1]["model"]
    kinds = {load_config(m).mla is not None for m in models}
    assert kinds == {True, False}


def test_first_token_step_is_what_the_engines_scheduler_does() -> None:
    """Every draw through kvlib.engine.scheduler with a token budget: the decoding
    sequences scheduled first, the prompt chunked over what is left."""
    for draw, right in NOTEBOOK.right_values("first_token_step"):
        cache = PagedKVCache(4_096, 16, enable_prefix_caching=False)
        scheduler = Scheduler(cache, max_num_seqs=draw.decoding + 1,
                              max_num_batched_tokens=draw.budget)
        for i in range(draw.decoding):
            scheduler.add(SeqState(f"d{i}", [1], 10**6, 0.0))
        plan = scheduler.schedule(0.0)
        for seq in plan.sampled:
            seq.generated.append(1)
        scheduler.add(SeqState("long", list(range(draw.prompt)), 4, 1.0))
        for step in range(1, 10_000):
            plan = scheduler.schedule(float(step))
            assert not plan.preempted
            for seq in plan.sampled:
                seq.generated.append(1)
            if any(s.request_id == "long" for s in plan.sampled):
                break
        assert step == right, draw


def test_step_ms_is_the_step_models_time() -> None:
    """Every draw against kvlib.step (the one place kvlib times a step), from the drawn
    sizes: weights read once, 2 FLOPs a parameter a token, the decoding caches read, the
    chunk's causal attention at MFU x the card's dense bf16 peak."""
    for draw, right in NOTEBOOK.right_values("step_ms"):
        layers, heads, kv_heads, head_dim, params = draw.model
        card = get_gpu(draw.gpu)
        cfg = _config(layers, heads, kv_heads, head_dim)
        step = step_time_from_counts(
            weight_bytes=2 * params * 10**9,
            weight_flops=2 * params * 10**9 * (draw.decoding + draw.chunk),
            decode_tokens=draw.decoding,
            decode_kv_bytes=draw.decoding * kv_bytes_per_gpu(cfg, draw.context),
            prefill_tokens=draw.chunk,
            prefill_attention_flops=prefill_attention_flops(cfg, draw.chunk),
            matmul_flops_per_s=card.bf16_dense_flops_per_s,
            bandwidth_bytes_per_s=card.hbm_bandwidth_bytes_per_s,
            mfu=draw.mfu,
        )
        assert right == pytest.approx(1e3 * step.total_s, rel=1e-12), draw
        assert step.reachable(), draw
