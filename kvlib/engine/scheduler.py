"""Which sequences run in the next forward pass: batching, admission by free blocks, preemption.

Two policies, as serving engines define them:

- **static**: a batch forms from the queue (up to ``max_batch_size`` requests, or
  fewer once the oldest has waited ``max_wait_s``, whichever comes first) and runs
  until its last sequence finishes; nothing joins it meanwhile.
- **continuous** (iteration-level, Orca, OSDI 2022; vLLM's scheduler): between
  any two decode steps, waiting requests join while there are batch slots and
  free blocks for their prompts.

Admission is first come, first served: a request whose prompt does not fit in
the free blocks waits, and so does everyone behind it. When a running sequence
needs a block for its next token and none is free, the most recently admitted
sequence is preempted by recompute (vLLM's default): its blocks are freed, and
it goes back to the head of the queue with the tokens it has generated, to be
prefilled again later. Block accounting is :class:`kvlib.paging.table.PagedKVCache`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from kvlib._validate import require_int
from kvlib.paging.table import PagedKVCache, blocks_for_tokens

__all__ = ["Plan", "Policy", "Scheduler", "SeqState"]

Policy = Literal["continuous", "static"]


@dataclass(eq=False)
class SeqState:
    """A request as the scheduler tracks it: its prompt and the tokens generated so far."""

    request_id: str
    prompt: list[int]
    max_new_tokens: int
    arrival_s: float
    generated: list[int] = field(default_factory=list)
    preemptions: int = 0

    @property
    def tokens(self) -> list[int]:
        """Prompt then generated tokens: what a recompute prefills."""
        return self.prompt + self.generated

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.max_new_tokens


@dataclass
class Plan:
    """One step: sequences to prefill (their whole token list), to decode (their last
    generated token), and those preempted to make room."""

    prefill: list[SeqState] = field(default_factory=list)
    decode: list[SeqState] = field(default_factory=list)
    preempted: list[SeqState] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


class Scheduler:
    """Queue, running batch and block accounting for one model replica."""

    def __init__(
        self,
        cache: PagedKVCache,
        *,
        max_batch_size: int,
        policy: Policy = "continuous",
        max_wait_s: float = 0.0,
    ) -> None:
        require_int(max_batch_size, "max_batch_size", 1)
        if policy not in ("continuous", "static"):
            raise ValueError(f"policy must be 'continuous' or 'static', got {policy!r}")
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        self.cache, self.policy = cache, policy
        self.max_batch_size, self.max_wait_s = max_batch_size, max_wait_s
        self.waiting: deque[SeqState] = deque()
        self.running: list[SeqState] = []  # in admission order
        self._in_static_batch = False

    def add(self, seq: SeqState) -> None:
        """Queue a request (the caller has checked it can ever fit the pool)."""
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, now_s: float, more_coming: bool = False) -> Plan:
        """Decide the next step at time ``now_s``; ``more_coming`` says requests are still
        to arrive (a static batch may wait for them up to ``max_wait_s``)."""
        plan = Plan()
        self._grow_running(plan)
        if self._may_admit(now_s, more_coming):
            self._admit(plan)
        if self.policy == "static" and self.running:
            self._in_static_batch = True
        return plan

    def finish(self, seq: SeqState) -> None:
        """Release a finished sequence's blocks and batch slot."""
        self.running.remove(seq)
        self.cache.free(seq.request_id)
        if not self.running:
            self._in_static_batch = False

    def _may_admit(self, now_s: float, more_coming: bool) -> bool:
        if self.policy == "continuous":
            return True
        if self._in_static_batch or not self.waiting:
            return False
        full = len(self.waiting) >= self.max_batch_size
        waited = now_s - self.waiting[0].arrival_s >= self.max_wait_s
        return full or waited or not more_coming

    def _admit(self, plan: Plan) -> None:
        """FCFS: admit while a batch slot and the prompt's blocks are free."""
        while self.waiting and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            needed = blocks_for_tokens(len(seq.tokens), self.cache.block_size)
            if needed > self.cache.pool.num_free_blocks:
                break
            self.waiting.popleft()
            self.cache.add_sequence(seq.request_id, seq.tokens)
            self.running.append(seq)
            plan.prefill.append(seq)

    def _grow_running(self, plan: Plan) -> None:
        """Give each decoding sequence the slot for its next token, preempting if needed."""
        for seq in list(self.running):
            if seq not in self.running:  # preempted while making room for an earlier one
                continue
            while self.cache.blocks_needed(seq.request_id, 1) > self.cache.pool.num_free_blocks:
                victim = self.running[-1]
                self._preempt(victim, plan)
                if victim is seq:
                    break
            if seq in self.running:
                self.cache.append_tokens(seq.request_id, [seq.generated[-1]])
                plan.decode.append(seq)

    def _preempt(self, seq: SeqState, plan: Plan) -> None:
        """Recompute preemption: free the blocks, requeue first with its generated tokens."""
        self.running.remove(seq)
        self.cache.free(seq.request_id)
        seq.preemptions += 1
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)
        if seq in plan.decode:
            plan.decode.remove(seq)
