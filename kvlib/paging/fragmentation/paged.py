"""Paging: vLLM's scheduling loop over whole blocks, with its preemption."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvlib._validate import cdiv
from kvlib.paging.fragmentation.shares import MemoryShares, ShareTotals
from kvlib.paging.fragmentation.workload import RequestLengths

__all__ = ["simulate_paged"]


@dataclass(eq=False, slots=True)
class _Running:
    request: RequestLengths
    tokens: int  # token states it holds: its prompt and its output so far
    blocks: int  # whole blocks holding them: cdiv(tokens, B)
    final: int  # tokens when it finishes (the request's final_tokens, read every step)


def simulate_paged(
    requests: list[RequestLengths],
    capacity_tokens: int,
    block_size: int,
    max_num_seqs: int,
    timeline: bool = False,
) -> MemoryShares:
    """Each step, as vLLM v1's scheduler runs it over a pool of ``capacity / B`` blocks:

    1. finished requests free their blocks;
    2. every running request grows by one token, in admission order; one whose last
       block is full takes a new block, and when none is free the last admitted
       request is preempted: its blocks are freed and it waits at the head of the
       queue, to recompute its prompt and the output it had (v1 preempts by
       recompute only, ``Scheduler.schedule``);
    3. in a step that preempted nobody, waiting requests are admitted in order while
       their blocks fit and fewer than ``max_num_seqs`` run. Admission runs the
       prefill, which produces the first output token.

    The same loop on chapter 2's :class:`~kvlib.paging.table.PagedKVCache` gives the
    same counts (the tests run both); counting blocks keeps a 10,000-request run fast.
    """
    free = capacity_tokens // block_size
    # (request, token states to recompute: its prompt and the output it had produced)
    waiting = deque((r, r.prompt_tokens) for r in requests)
    running: list[_Running] = []  # in admission order: the last is preempted first
    totals = ShareTotals(capacity_tokens)
    points: list[tuple[int, int, int, int]] = []
    preempted_at: list[int] = []
    step = recomputed = 0
    while waiting or running:
        for done in [s for s in running if s.tokens == s.final]:
            running.remove(done)
            free += done.blocks
        preempted, i = False, 0
        while i < len(running):
            seq = running[i]
            if seq.tokens % block_size == 0:  # its last block is full
                if free == 0:
                    victim = running.pop()  # not grown yet in this step: i is at or before it
                    free += victim.blocks
                    waiting.appendleft((victim.request, victim.tokens))
                    recomputed += victim.tokens
                    preempted_at.append(step)
                    preempted = True
                    continue
                free -= 1
                seq.blocks += 1
            seq.tokens += 1
            i += 1
        while waiting and not preempted and len(running) < max_num_seqs:
            request, tokens = waiting[0]
            blocks = cdiv(tokens + 1, block_size)  # its prefill produces one output token
            if blocks > free:
                break
            waiting.popleft()
            running.append(_Running(request, tokens + 1, blocks, request.final_tokens))
            free -= blocks
        held = (capacity_tokens // block_size - free) * block_size
        states = sum(s.tokens for s in running)
        if waiting:  # memory is measured while requests wait for it
            totals.add(1, states, 0, held - states, len(running))
        if timeline:
            points.append((step, held, states, len(running)))
        step += 1
    return totals.shares(
        "paged",
        block_size,
        total_steps=step,
        preemptions=len(preempted_at),
        recomputed_tokens=recomputed,
        timeline=tuple(points),
        preempted_at=tuple(preempted_at) if timeline else (),
    )
