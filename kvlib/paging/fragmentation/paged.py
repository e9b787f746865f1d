"""Paging: blocks taken one at a time as tokens arrive, with vLLM's preemption."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from kvlib.paging.fragmentation.shares import MemoryShares, ShareTotals
from kvlib.paging.fragmentation.workload import Request

__all__ = ["simulate_paged"]


@dataclass(eq=False)
class _Running:
    uid: int
    request: int
    base: int  # tokens it held when admitted: prompt, plus output produced before a preemption
    admitted: int  # step of admission
    end: int  # first step it no longer runs
    key: int  # it needs a new block at steps s with s % B == key


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def simulate_paged(
    requests: list[Request],
    capacity_tokens: int,
    block_size: int,
    max_num_seqs: int,
    timeline: bool = False,
) -> MemoryShares:
    """Step by step. At step ``s`` a request admitted at ``a`` holds ``base + s - a + 1``
    token states, so it needs a new block exactly when ``(base + s - a) % B == 0``:
    requests are bucketed by ``(a - base) % B`` and a step's demand is one lookup.
    """
    size = block_size
    total = free = capacity_tokens // size
    queue: deque[tuple[int, int]] = deque((i, 0) for i in range(len(requests)))
    running: list[_Running] = []  # in admission order: the last is preempted first
    finishing: list[tuple[int, int]] = []  # heap of (end, uid); stale entries skipped
    alive: dict[int, _Running] = {}
    due = [0] * size  # running requests per bucket
    offset = 0  # sum over running of (base - admitted + 1): states at step s = offset + n*s
    prompts = [r.prompt_tokens for r in requests]
    outputs = [r.output_tokens for r in requests]
    preemptions = recomputed = uid = 0
    # Sums over the steps in which requests wait: steps, token states, slots held, running.
    waited = states_sum = held_sum = running_sum = 0
    points: list[tuple[int, int, int, int]] = []
    preempted_at: list[int] = []
    t = 0

    def stop(r: _Running) -> int:
        nonlocal offset
        del alive[r.uid]
        due[r.key] -= 1
        offset -= r.base - r.admitted + 1
        return _cdiv(r.base + t - r.admitted, size)  # blocks it held after step t - 1

    while queue or running:
        while finishing and finishing[0][0] == t:
            _, done = heapq.heappop(finishing)
            if done in alive:
                r = alive[done]
                running.remove(r)
                free += stop(r)
        need = due[t % size]
        preempted = False
        while need > free:
            victim = running.pop()
            free += stop(victim)
            need -= victim.key == t % size
            prompt = prompts[victim.request]
            produced = victim.base - prompt + t - victim.admitted
            queue.appendleft((victim.request, produced))
            preemptions += 1
            recomputed += prompt + produced
            preempted = True
            if timeline:
                preempted_at.append(t)
        free -= need
        # vLLM's scheduler admits no waiting request in a step that preempted one.
        while queue and not preempted and len(running) < max_num_seqs:
            i, produced = queue[0]
            base = prompts[i] + produced
            blocks = _cdiv(base + 1, size)
            if blocks > free:
                break
            queue.popleft()
            free -= blocks
            uid += 1
            r = _Running(uid, i, base, t, t + outputs[i] - produced, (t - base) % size)
            running.append(r)
            alive[uid] = r
            due[r.key] += 1
            offset += base - t + 1
            heapq.heappush(finishing, (r.end, uid))
        if queue:
            waited += 1
            states_sum += offset + len(running) * t
            held_sum += total - free
            running_sum += len(running)
        if timeline:
            points.append((t, (total - free) * size, offset + len(running) * t, len(running)))
        t += 1
    totals = ShareTotals(capacity_tokens)
    totals.add(waited, states_sum, 0, held_sum * size - states_sum, running_sum)
    return totals.shares(
        "paged",
        block_size,
        total_steps=t,
        preemptions=preemptions,
        recomputed_tokens=recomputed,
        timeline=tuple(points),
        preempted_at=tuple(preempted_at),
    )
