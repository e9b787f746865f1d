"""kvlib.engine.scheduler: admission by free blocks, FCFS, preemption, static vs continuous."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.engine.scheduler import Plan, Scheduler, SeqState
from kvlib.paging.table import PagedKVCache


def seq(name: str, prompt_tokens: int, max_new: int = 8, arrival_s: float = 0.0) -> SeqState:
    return SeqState(name, list(range(prompt_tokens)), max_new, arrival_s)


def run_step(sched: Scheduler, now: float = 0.0, more: bool = False) -> list[str]:
    """Schedule, then pretend the forward pass produced token 1 for every sequence."""
    plan = sched.schedule(now, more)
    for s in plan.prefill + plan.decode:
        s.generated.append(1)
        if s.done:
            sched.finish(s)
    return [s.request_id for s in plan.prefill]


def test_admission_stops_at_the_first_prompt_that_does_not_fit() -> None:
    sched = Scheduler(PagedKVCache(4, 4, enable_prefix_caching=False), max_num_seqs=8)
    for s in (seq("a", 8), seq("b", 12), seq("c", 1)):
        sched.add(s)
    assert run_step(sched) == ["a"]  # b needs 3 blocks, 2 are free; c waits behind b (FCFS)
    assert [s.request_id for s in sched.waiting] == ["b", "c"]


def test_batch_size_caps_admission() -> None:
    sched = Scheduler(PagedKVCache(64, 4, enable_prefix_caching=False), max_num_seqs=2)
    for name in "abc":
        sched.add(seq(name, 4))
    assert run_step(sched) == ["a", "b"]


def test_the_newest_sequence_is_preempted_and_requeued_first() -> None:
    cache = PagedKVCache(4, 2, enable_prefix_caching=False)
    sched = Scheduler(cache, max_num_seqs=4)
    sched.add(seq("old", 4))  # 2 blocks, full: its next token needs a third
    sched.add(seq("new", 3))  # 2 blocks, one slot left
    assert run_step(sched) == ["old", "new"]
    plan = sched.schedule(0.0)
    assert [s.request_id for s in plan.preempted] == ["new"]
    assert [s.request_id for s in plan.decode] == ["old"]
    assert sched.waiting[0].request_id == "new" and sched.waiting[0].preemptions == 1
    assert sched.waiting[0].tokens == [0, 1, 2, 1]  # recomputed with its generated token


def test_static_batch_admits_nothing_until_it_drains() -> None:
    sched = Scheduler(PagedKVCache(64, 4, enable_prefix_caching=False), max_num_seqs=2,
                      policy="static")
    sched.add(seq("a", 4, max_new=1))
    sched.add(seq("b", 4, max_new=3))
    sched.add(seq("c", 4))
    assert run_step(sched) == ["a", "b"]  # a finishes at once; its slot stays empty
    assert run_step(sched) == []
    assert run_step(sched) == []  # b's last token
    assert run_step(sched) == ["c"]


def test_static_batch_waits_for_a_full_batch_or_the_wait_cap() -> None:
    sched = Scheduler(PagedKVCache(64, 4, enable_prefix_caching=False), max_num_seqs=4,
                      policy="static", max_wait_s=0.5)
    sched.add(seq("a", 4, arrival_s=0.0))
    assert run_step(sched, now=0.1, more=True) == []  # one of four, waited 0.1 s
    assert run_step(sched, now=0.6, more=True) == ["a"]  # the cap passed
    continuous = Scheduler(PagedKVCache(64, 4, enable_prefix_caching=False), max_num_seqs=4)
    continuous.add(seq("a", 4))
    assert run_step(continuous, now=0.0, more=True) == ["a"]


def test_continuous_batch_admits_between_decode_steps() -> None:
    sched = Scheduler(PagedKVCache(64, 4, enable_prefix_caching=False), max_num_seqs=4)
    sched.add(seq("a", 4))
    run_step(sched)
    sched.add(seq("b", 4))
    plan = sched.schedule(0.0)
    assert [s.request_id for s in plan.decode] == ["a"]
    assert [s.request_id for s in plan.prefill] == ["b"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"max_num_seqs": 1, "max_num_batched_tokens": 0}, "max_num_batched_tokens"),
     ({"max_num_seqs": 0}, "max_num_seqs"), ({"max_num_seqs": 1, "policy": "lifo"},
     "policy"), ({"max_num_seqs": 1, "max_wait_s": -1.0}, "max_wait_s")],
)
def test_bad_settings_name_the_setting(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Scheduler(PagedKVCache(4, 4), **kwargs)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 20), st.integers(1, 12)), min_size=1, max_size=12),
    st.integers(1, 5),
    st.sampled_from(["continuous", "static"]),
)
def test_every_request_finishes_within_the_pool(
    requests: list[tuple[int, int]], batch: int, policy: str
) -> None:
    """Blocks in use never exceed the pool, the batch never exceeds its cap, and every
    request that can fit alone eventually finishes (no deadlock under preemption)."""
    cache = PagedKVCache(10, 4, enable_prefix_caching=False)
    sched = Scheduler(cache, max_num_seqs=batch, policy=policy)  # type: ignore[arg-type]
    states = [seq(f"r{i}", p, m) for i, (p, m) in enumerate(requests) if -(-(p + m) // 4) <= 10]
    for s in states:
        sched.add(s)
    for _ in range(2000):
        if not sched.has_work:
            break
        run_step(sched)
        assert len(sched.running) <= batch
        assert cache.pool.num_used_blocks <= 10
    assert all(s.done for s in states)


def test_no_admission_in_a_step_that_preempted(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM v1 skips the waiting queue in a step whose running batch needed a preemption
    (``if not preempted_reqs``). Under first-come-first-served the victim heads the
    queue, so the rule shows in which steps the scheduler looks at the queue at all."""
    cache = PagedKVCache(4, 2, enable_prefix_caching=False)
    sched = Scheduler(cache, max_num_seqs=4)
    looked: list[bool] = []
    admit = sched._admit

    def recording(plan: Plan, budget: int | None) -> None:
        looked.append(True)
        admit(plan, budget)

    monkeypatch.setattr(sched, "_admit", recording)
    sched.add(seq("old", 4))  # 2 full blocks: its next token needs a third
    sched.add(seq("new", 3))
    assert run_step(sched) == ["old", "new"] and looked == [True]
    plan = sched.schedule(0.0)
    assert [s.request_id for s in plan.preempted] == ["new"]
    assert looked == [True]  # the step that preempted left the queue alone
    for s in plan.sampled:
        s.generated.append(1)
    sched.schedule(0.0)
    assert looked == [True, True]


@pytest.mark.parametrize("budget", [1, 3, 5])
def test_a_step_never_computes_more_than_its_token_budget(budget: int) -> None:
    cache = PagedKVCache(64, 4, enable_prefix_caching=False)
    sched = Scheduler(cache, max_num_seqs=8, max_num_batched_tokens=budget)
    for name, length in (("a", 9), ("b", 2), ("c", 6)):
        sched.add(seq(name, length, max_new=3))
    computed = {name: 0 for name in "abc"}
    for _ in range(100):
        if not sched.has_work:
            break
        plan = sched.schedule(0.0)
        assert plan.num_tokens <= budget
        for chunk in plan.chunks:
            assert chunk.start == computed[chunk.seq.request_id]  # no token twice, none skipped
            computed[chunk.seq.request_id] += chunk.num_tokens
        for s in plan.sampled:
            s.generated.append(1)
            if s.done:
                sched.finish(s)
    assert not sched.has_work
    # Each request computed its prompt and every generated token but the last.
    assert computed == {"a": 9 + 2, "b": 2 + 2, "c": 6 + 2}


def test_without_chunked_prefill_a_prompt_over_the_budget_waits() -> None:
    sched = Scheduler(PagedKVCache(64, 4, enable_prefix_caching=False), max_num_seqs=8,
                      max_num_batched_tokens=4, enable_chunked_prefill=False)
    sched.add(seq("long", 6))
    assert not sched.schedule(0.0)
    chunked = Scheduler(PagedKVCache(64, 4, enable_prefix_caching=False), max_num_seqs=8,
                        max_num_batched_tokens=4)
    chunked.add(seq("long", 6))
    plan = chunked.schedule(0.0)
    assert [(c.start, c.num_tokens, c.samples) for c in plan.chunks] == [(0, 4, False)]
