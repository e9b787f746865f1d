"""A small serving engine: a request queue, batched forward passes over a paged KV cache,
static or continuous batching, preemption by recompute, tokens streamed per request.

It runs :class:`kvlib.nn.decoder.TinyDecoder` (a random-weight Llama-style model)
on the CPU with greedy decoding, so that every request's tokens can be checked
against the same request run alone. The scheduling decisions are
:class:`kvlib.engine.scheduler.Scheduler`'s; the block tables are
:class:`kvlib.paging.table.PagedKVCache`'s; the keys and values live in the slots
those tables name (:class:`kvlib.nn.decoder.PagedKV`).

Bad input (an empty prompt, token ids outside the vocabulary, a prompt and
output longer than the model's context, a request the pool could never hold)
fails that request alone: its result carries the error, and the others run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvlib._validate import require_int
from kvlib.engine.scheduler import Plan, Policy, Scheduler, SeqState
from kvlib.nn.decoder import PagedKV, SeqInput, TinyDecoder
from kvlib.paging.table import PagedKVCache, blocks_for_tokens

__all__ = ["Engine", "EngineConfig", "Request", "RequestResult", "StepRecord"]


@dataclass(frozen=True)
class Request:
    """A prompt to continue greedily for ``max_new_tokens`` tokens.

    ``on_token(request_id, token)`` is called for every token as it is decoded.
    """

    request_id: str
    prompt: Sequence[int]
    max_new_tokens: int
    arrival_s: float = 0.0
    on_token: Callable[[str, int], None] | None = None


@dataclass
class RequestResult:
    """What became of one request: its tokens, or the error that stopped it."""

    request_id: str
    output_tokens: list[int] = field(default_factory=list)
    error: str | None = None
    arrival_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: from arrival to the first decoded token."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s


@dataclass(frozen=True)
class StepRecord:
    """The pool and the batch after one step (for timelines)."""

    step: int
    time_s: float
    used_blocks: int
    running: int
    waiting: int
    prefill_tokens: int
    decode_tokens: int
    preempted: int


@dataclass(frozen=True)
class EngineConfig:
    """Pool size in blocks, block size, batch limits and the batching policy."""

    num_blocks: int
    block_size: int = 16
    max_batch_size: int = 8
    max_wait_s: float = 0.0
    policy: Policy = "continuous"


class Engine:
    """Serve :class:`Request` objects on one model replica."""

    def __init__(
        self,
        model: TinyDecoder,
        config: EngineConfig,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        require_int(config.num_blocks, "num_blocks", 1)
        self.model, self.config, self.clock = model, config, clock
        self.cache = PagedKVCache(config.num_blocks, config.block_size,
                                  enable_prefix_caching=False)  # fmt: skip
        self.kv = PagedKV(model.cfg, config.num_blocks, config.block_size, model.dtype)
        self.scheduler = Scheduler(
            self.cache,
            max_batch_size=config.max_batch_size,
            policy=config.policy,
            max_wait_s=config.max_wait_s,
        )
        self.results: dict[str, RequestResult] = {}
        self.steps: list[StepRecord] = []
        self._pending: list[Request] = []  # not yet arrived
        self._states: dict[str, tuple[Request, SeqState]] = {}
        self._start = clock()  # times in results and records are seconds after this

    def submit(self, request: Request) -> RequestResult:
        """Queue ``request`` (it joins at its ``arrival_s``); a bad one fails alone, now."""
        result = RequestResult(request.request_id, arrival_s=request.arrival_s)
        if request.request_id in self.results:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.results[request.request_id] = result
        result.error = self._problem(request)
        if result.error is None:
            self._pending.append(request)
            self._pending.sort(key=lambda r: r.arrival_s)
        return result

    def _problem(self, request: Request) -> str | None:
        prompt, cfg = list(request.prompt), self.model.cfg
        if not prompt:
            return "empty prompt: a request needs at least one token"
        vocab = cfg.vocab_size or 0
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            return f"prompt token ids must be integers in [0, {vocab})"
        if isinstance(request.max_new_tokens, bool) or not isinstance(request.max_new_tokens, int):
            return "max_new_tokens must be an integer"
        if request.max_new_tokens < 1:
            return "max_new_tokens must be at least 1"
        total = len(prompt) + request.max_new_tokens
        limit = cfg.max_position_embeddings
        if limit is not None and total > limit:
            return f"prompt ({len(prompt)}) + max_new_tokens exceeds the model's context ({limit})"
        needed = blocks_for_tokens(total, self.config.block_size)
        if needed > self.config.num_blocks:
            return (
                f"needs {needed} blocks of {self.config.block_size} tokens but the pool has "
                f"{self.config.num_blocks}: it could never run"
            )
        return None

    def run(self, requests: Sequence[Request] = ()) -> list[RequestResult]:
        """Submit ``requests`` and step until every request is finished or failed."""
        self._start = self.clock()
        for request in requests:
            self.submit(request)
        while self._pending or self.scheduler.has_work:
            if not self.step(self.now_s()):
                # Nothing can run yet: the next arrival is in the future.
                wait = self._pending[0].arrival_s - self.now_s() if self._pending else 0.0
                time.sleep(max(0.0, min(wait, 0.01)))
        return [self.results[r.request_id] for r in requests]

    def now_s(self) -> float:
        """Seconds since the engine started (or since :meth:`run` last started)."""
        return self.clock() - self._start

    def _release_arrivals(self, now_s: float) -> None:
        while self._pending and self._pending[0].arrival_s <= now_s:
            request = self._pending.pop(0)
            state = SeqState(request.request_id, list(request.prompt), request.max_new_tokens,
                             request.arrival_s)  # fmt: skip
            self._states[request.request_id] = (request, state)
            self.scheduler.add(state)

    def step(self, now_s: float) -> bool:
        """Queue the requests arrived by ``now_s``, then one scheduling decision and one
        forward pass; False when nothing could run."""
        self._release_arrivals(now_s)
        plan = self.scheduler.schedule(now_s, more_coming=bool(self._pending))
        for seq in plan.preempted:
            self.results[seq.request_id].preemptions = seq.preemptions
        if not plan:
            return False
        prefill_tokens = sum(len(seq.tokens) for seq in plan.prefill)
        logits = self.model.forward_batch(self._inputs(plan), self.kv)
        done_at = self.now_s()
        for seq, row in zip(plan.prefill + plan.decode, logits, strict=True):
            self._emit(seq, int(torch.argmax(row)), done_at)
        self.steps.append(self._record(plan, now_s, prefill_tokens))
        return True

    def _inputs(self, plan: Plan) -> list[SeqInput]:
        batch = []
        for seq in plan.prefill:
            tokens = seq.tokens
            batch.append(SeqInput(tokens, 0, self._slots(seq.request_id, len(tokens))))
        for seq in plan.decode:
            n = len(seq.tokens)
            batch.append(SeqInput([seq.generated[-1]], n - 1, self._slots(seq.request_id, n)))
        return batch

    def _slots(self, request_id: str, num_tokens: int) -> list[int]:
        table, size = self.cache.block_table(request_id), self.config.block_size
        return [table[p // size] * size + p % size for p in range(num_tokens)]

    def _emit(self, seq: SeqState, token: int, now: float) -> None:
        request, result = self._states[seq.request_id][0], self.results[seq.request_id]
        seq.generated.append(token)
        result.output_tokens.append(token)
        if result.first_token_s is None:
            result.first_token_s = now
        if request.on_token is not None:
            request.on_token(seq.request_id, token)
        if seq.done:
            self.scheduler.finish(seq)
            result.finish_s = now

    def _record(self, plan: Plan, now_s: float, prefill_tokens: int) -> StepRecord:
        pool = self.cache.pool
        return StepRecord(
            step=len(self.steps),
            time_s=now_s,
            used_blocks=pool.num_blocks - pool.num_free_blocks,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            prefill_tokens=prefill_tokens,
            decode_tokens=len(plan.decode),
            preempted=len(plan.preempted),
        )
