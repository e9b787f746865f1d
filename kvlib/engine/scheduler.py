"""Which sequences run in the next forward pass, and how many of their tokens.

Two batching policies, as serving engines define them:

- **static**: a batch forms from the queue (up to ``max_num_seqs`` requests, or
  fewer once the oldest has waited ``max_wait_s``, whichever comes first) and runs
  until its last sequence finishes; nothing joins it meanwhile.
- **continuous** (iteration-level, Orca, OSDI 2022; vLLM's scheduler): between
  any two decode steps, waiting requests join while there are batch slots, free
  blocks and token budget for them.

Each step follows vLLM v1's ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``):

1. **Running sequences first**, in admission order. Each asks for the tokens it has
   not computed yet (one in decode; the rest of its prompt if its prefill was
   chunked), capped by what is left of the step's **token budget**
   (``max_num_batched_tokens``). When a sequence needs a block and none is free, the
   most recently admitted sequence is preempted by recompute (v1 has no swap): its
   blocks are freed and it goes back to the head of the queue with the tokens it
   has generated.
2. **Then waiting requests**, first come first served, while a batch slot
   (``max_num_seqs``), budget and blocks remain, and only if this step preempted no
   one (v1's ``if not preempted_reqs``: a step that had to evict makes no room for
   newcomers). With prefix caching, a request's leading full blocks already in the
   pool count as computed (the prompt's last token is always recomputed, for its
   logits). With **chunked prefill** a prompt longer than the budget left is
   scheduled in part and finishes in later steps, so one long prompt no longer
   stalls every decode behind it; without it, such a prompt waits.

A sequence's ``num_computed_tokens`` advances when it is scheduled, as in v1, and
its blocks are allocated for exactly the tokens scheduled. Block accounting is
:class:`kvlib.paging.table.PagedKVCache`'s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from kvlib._validate import require_int
from kvlib.paging.block_pool import OutOfBlocksError
from kvlib.paging.prefix import block_hashes
from kvlib.paging.table import PagedKVCache

__all__ = ["Chunk", "Plan", "Policy", "Scheduler", "SeqState"]

Policy = Literal["continuous", "static"]


@dataclass(eq=False)
class SeqState:
    """A request as the scheduler tracks it: its prompt, the tokens generated so far, and
    how many of them have their keys and values in the cache."""

    request_id: str
    prompt: list[int]
    max_new_tokens: int
    arrival_s: float
    generated: list[int] = field(default_factory=list)
    preemptions: int = 0
    stop_token_ids: tuple[int, ...] = ()
    num_computed_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at the last admission

    @property
    def tokens(self) -> list[int]:
        """Prompt then generated tokens: what a recompute prefills."""
        return self.prompt + self.generated

    @property
    def stopped(self) -> bool:
        """The last generated token is one of the request's stop tokens (EOS)."""
        return bool(self.generated) and self.generated[-1] in self.stop_token_ids

    @property
    def done(self) -> bool:
        """Finished: a stop token, or ``max_new_tokens`` generated."""
        return self.stopped or len(self.generated) >= self.max_new_tokens

    @property
    def finish_reason(self) -> str | None:
        """``"stop"`` (a stop token), ``"length"`` (``max_new_tokens``), or None."""
        if self.stopped:
            return "stop"
        return "length" if self.done else None


@dataclass(frozen=True)
class Chunk:
    """The tokens of one sequence a step computes: positions ``start .. start + n - 1``.

    ``samples``: whether the chunk reaches the sequence's last known token, so that the
    step yields a new one (a chunk in the middle of a prompt yields nothing). Fixed when
    the step is planned, before the new token lengthens the sequence.
    """

    seq: SeqState
    start: int
    num_tokens: int
    samples: bool

    @classmethod
    def of(cls, seq: SeqState, start: int, num_tokens: int) -> Chunk:
        return cls(seq, start, num_tokens, start + num_tokens == len(seq.tokens))


@dataclass
class Plan:
    """One step: the chunks to compute, split into prefill (whole or partial prompts,
    recomputes) and decode (one token each), and the sequences preempted to make room."""

    prefill: list[SeqState] = field(default_factory=list)
    decode: list[SeqState] = field(default_factory=list)
    preempted: list[SeqState] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.chunks)

    @property
    def num_tokens(self) -> int:
        """Tokens the step computes: what the token budget limits."""
        return sum(c.num_tokens for c in self.chunks)

    @property
    def sampled(self) -> list[SeqState]:
        """Sequences that get a new token from this step."""
        return [c.seq for c in self.chunks if c.samples]


class Scheduler:
    """Queue, running batch, token budget and block accounting for one model replica."""

    def __init__(
        self,
        cache: PagedKVCache,
        *,
        max_num_seqs: int,
        policy: Policy = "continuous",
        max_wait_s: float = 0.0,
        max_num_batched_tokens: int | None = None,
        enable_chunked_prefill: bool = True,
    ) -> None:
        require_int(max_num_seqs, "max_num_seqs", 1)
        if max_num_batched_tokens is not None:
            require_int(max_num_batched_tokens, "max_num_batched_tokens", 1)
        if policy not in ("continuous", "static"):
            raise ValueError(f"policy must be 'continuous' or 'static', got {policy!r}")
        if not max_wait_s >= 0:
            raise ValueError(f"max_wait_s must be >= 0 seconds, got {max_wait_s!r}")
        self.cache, self.policy = cache, policy
        self.max_num_seqs, self.max_wait_s = max_num_seqs, max_wait_s
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
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
        budget = self._schedule_running(plan, self.max_num_batched_tokens)
        if not plan.preempted and self._may_admit(now_s, more_coming):
            self._admit(plan, budget)
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
        full = len(self.waiting) >= self.max_num_seqs
        waited = now_s - self.waiting[0].arrival_s >= self.max_wait_s
        return full or waited or not more_coming

    def _cached_prefix_tokens(self, seq: SeqState) -> int:
        """Tokens of ``seq`` whose blocks the pool holds already (leading full blocks, the
        last token excluded), 0 when prefix caching is off."""
        pool, size = self.cache.pool, self.cache.block_size
        if not pool.enable_prefix_caching:
            return 0
        tokens = seq.tokens
        hashes = block_hashes(tokens, size)[: (len(tokens) - 1) // size]
        misses = (i for i, h in enumerate(hashes) if pool.get_cached_block(h) is None)
        return next(misses, len(hashes)) * size

    def _admit(self, plan: Plan, budget: int | None) -> None:
        """FCFS: admit while a batch slot, token budget and the scheduled tokens' blocks are
        free; a prompt longer than the budget left is chunked (or waits, if chunking is off)."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            if budget is not None and budget <= 0:
                break
            seq = self.waiting[0]
            computed = self._cached_prefix_tokens(seq)
            wanted = len(seq.tokens) - computed
            n = wanted if budget is None else min(wanted, budget)
            if n < wanted and not self.enable_chunked_prefill:
                break
            try:
                found = self.cache.add_sequence(seq.request_id, seq.tokens[: computed + n])
            except OutOfBlocksError:
                break  # its blocks are not free: it waits, and so does everyone behind it
            assert found == computed, (found, computed)
            self.waiting.popleft()
            seq.num_computed_tokens, seq.cached_tokens = computed + n, computed
            self.running.append(seq)
            plan.prefill.append(seq)
            plan.chunks.append(Chunk.of(seq, computed, n))
            if budget is not None:
                budget -= n

    def _schedule_running(self, plan: Plan, budget: int | None) -> int | None:
        """Give each running sequence its next tokens within the budget, preempting the
        newest sequence while the pool lacks a block; return the budget left."""
        for seq in list(self.running):
            if seq not in self.running:  # preempted while making room for an earlier one
                continue
            if budget is not None and budget <= 0:
                break
            start = seq.num_computed_tokens
            wanted = len(seq.tokens) - start
            n = wanted if budget is None else min(wanted, budget)
            while self.cache.blocks_needed(seq.request_id, n) > self.cache.pool.num_free_blocks:
                victim = self.running[-1]
                self._preempt(victim, plan)
                if victim is seq:
                    break
            if seq not in self.running:
                break  # it preempted itself: nothing behind it was scheduled either
            self.cache.append_tokens(seq.request_id, seq.tokens[start : start + n])
            seq.num_computed_tokens += n
            decoding = bool(seq.generated) and start == len(seq.tokens) - 1
            (plan.decode if decoding else plan.prefill).append(seq)
            plan.chunks.append(Chunk.of(seq, start, n))
            if budget is not None:
                budget -= n
        return budget

    def _preempt(self, seq: SeqState, plan: Plan) -> None:
        """Recompute preemption: free the blocks, requeue first with its generated tokens."""
        self.running.remove(seq)
        self.cache.free(seq.request_id)
        seq.preemptions += 1
        seq.num_computed_tokens = 0
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)
