"""Reservation policies: each request gets one contiguous range of slots at admission."""

from __future__ import annotations

import bisect
import heapq
from collections import deque

from kvlib.paging.fragmentation.shares import MemoryShares, ShareTotals
from kvlib.paging.fragmentation.workload import RequestLengths

__all__ = ["RESERVATION_POLICIES", "FirstFit", "reservation_tokens", "simulate_reserved"]

RESERVATION_POLICIES = ("max", "pow2", "oracle")


def reservation_tokens(request: RequestLengths, policy: str, max_seq_len: int = 2048) -> int:
    """Slots a policy sets aside for ``request`` when it is admitted.

    ``"max"``: ``max_seq_len``; ``"pow2"``: prompt + output rounded up to a power
    of two (at most ``max_seq_len``); ``"oracle"``: exactly prompt + output.
    """
    if policy == "max":
        return max_seq_len
    if policy == "pow2":
        rounded = 1 << (request.output_tokens - 1).bit_length()
        return min(request.prompt_tokens + rounded, max_seq_len)
    if policy == "oracle":
        return request.final_tokens
    raise ValueError(f"policy must be one of {', '.join(RESERVATION_POLICIES)}, got {policy!r}")


class FirstFit:
    """Contiguous ranges of one address space, placed in the lowest hole that fits."""

    def __init__(self, capacity: int) -> None:
        self.starts = [0]  # holes, sorted by address
        self.sizes = [capacity]

    def place(self, size: int) -> int | None:
        """Address of a new range of ``size`` slots, or None if no hole is large enough."""
        for i, hole in enumerate(self.sizes):
            if hole >= size:
                address = self.starts[i]
                if hole == size:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += size
                    self.sizes[i] -= size
                return address
        return None

    def release(self, address: int, size: int) -> None:
        """Free a range, merging it with the holes on either side."""
        i = bisect.bisect_left(self.starts, address)
        if i < len(self.starts) and address + size == self.starts[i]:
            self.starts[i] = address
            self.sizes[i] += size
        else:
            self.starts.insert(i, address)
            self.sizes.insert(i, size)
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == address:
            self.sizes[i - 1] += self.sizes[i]
            del self.starts[i], self.sizes[i]


def simulate_reserved(
    requests: list[RequestLengths],
    policy: str,
    capacity: int,
    max_seq_len: int,
    max_num_seqs: int,
    timeline: bool = False,
) -> MemoryShares:
    """Event-driven: between two completions the running set, and every sum, is fixed."""
    sizes = [reservation_tokens(r, policy, max_seq_len) for r in requests]
    if max(sizes) > capacity:
        raise ValueError(
            f"capacity_tokens={capacity} cannot hold one {max(sizes)}-slot reservation"
        )
    memory, queue = FirstFit(capacity), deque(range(len(requests)))
    running: list[tuple[int, int, int]] = []  # heap of (finish step, request, address)
    # Over the running requests: sum of (prompt - admit step + 1), of final lengths, of sizes.
    offset = final = held = 0
    totals, points, t = ShareTotals(capacity), [], 0
    while queue or running:
        while running and running[0][0] == t:
            _, i, address = heapq.heappop(running)
            memory.release(address, sizes[i])
            admitted = t - requests[i].output_tokens
            offset -= requests[i].prompt_tokens - admitted + 1
            final -= requests[i].final_tokens
            held -= sizes[i]
        while queue and len(running) < max_num_seqs:
            placed = memory.place(sizes[queue[0]])
            if placed is None:
                break  # first come, first served: the head waits for a hole that fits
            i = queue.popleft()
            heapq.heappush(running, (t + requests[i].output_tokens, i, placed))
            offset += requests[i].prompt_tokens - t + 1
            final += requests[i].final_tokens
            held += sizes[i]
        if not running:
            break  # everything has finished
        n, end = len(running), running[0][0]
        # During steps t .. end - 1 the token states at step s number offset + n * s.
        steps = end - t
        states = steps * offset + n * (t + end - 1) * steps // 2
        if timeline:
            points += [(s, held, offset + n * s, n) for s in range(t, end)]
        if queue:
            totals.add(steps, states, steps * final - states, steps * (held - final), steps * n)
        t = end
    return totals.shares(policy, None, total_steps=t, timeline=tuple(points))
