"""A small serving engine: batched forward passes of
:class:`kvlib.nn.decoder.TinyDecoder` over a paged KV cache, greedy decoding on the CPU,
so every request's tokens can be checked against the same request run alone.

The engine's limits are vLLM's: ``max_num_seqs`` sequences in a step,
``max_num_batched_tokens`` tokens computed in a step (prefill chunks and decode
tokens together), ``max_model_len`` tokens in a sequence. A request that sets no
``max_new_tokens`` may grow to ``max_model_len`` (vLLM's default ``max_tokens``).
Bad input fails that request alone: its result carries the error, and the others run.

Times are the engine's ``clock`` (wall or CPU seconds of this machine, or forward passes
with :class:`StepClock`). Given a :class:`kvlib.engine.gpu_clock.GpuClock`, the engine
also keeps a modelled clock: each step advances it by the step's time on a named GPU
from the step model, and every token gets a modelled time beside its measured one.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvlib._validate import is_int, require_int
from kvlib.engine.gpu_clock import GpuClock
from kvlib.engine.scheduler import Chunk, Plan, Policy, Scheduler, SeqState
from kvlib.nn.decoder import PagedKV, SeqInput, TinyDecoder
from kvlib.paging.table import PagedKVCache, blocks_for_tokens

__all__ = [
    "Engine",
    "EngineConfig",
    "Request",
    "RequestResult",
    "StepClock",
    "StepRecord",
    "serve_in_steps",
]


@dataclass(frozen=True)
class Request:
    """A prompt to continue greedily, until a stop token or ``max_new_tokens`` tokens
    (None: up to ``max_model_len``); ``on_token(request_id, token)`` sees each token."""

    request_id: str
    prompt: Sequence[int]
    max_new_tokens: int | None = None
    arrival_s: float = 0.0
    on_token: Callable[[str, int], None] | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class RequestResult:
    """What became of one request: its tokens and their times, or the error that stopped it."""

    request_id: str
    output_tokens: list[int] = field(default_factory=list)
    error: str | None = None
    arrival_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    finish_reason: str | None = None  # "stop" (a stop token) or "length"
    token_times_s: list[float] = field(default_factory=list)
    cached_prompt_tokens: int = 0  # found in the prefix cache at the last admission
    # On the modelled GPU clock (None without one): when the request was queued, and
    # when each token came.
    modelled_arrival_s: float | None = None
    modelled_token_times_s: list[float] = field(default_factory=list)

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: from arrival to the first decoded token."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: the time between consecutive tokens of the reply."""
        return [later - earlier for earlier, later in itertools.pairwise(self.token_times_s)]

    @property
    def modelled_ttft_s(self) -> float | None:
        """Time to first token on the modelled GPU: queue wait and prefill steps."""
        if self.modelled_arrival_s is None or not self.modelled_token_times_s:
            return None
        return self.modelled_token_times_s[0] - self.modelled_arrival_s

    @property
    def modelled_itl_s(self) -> list[float]:
        """Inter-token latencies on the modelled GPU: the time of the steps between tokens."""
        times = self.modelled_token_times_s
        return [later - earlier for earlier, later in itertools.pairwise(times)]


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
    modelled_s: float | None = None  # the step's time on the modelled GPU
    recompute_s: float = 0.0  # of it, recomputing preempted sequences
    recompute_tokens: int = 0


@dataclass(frozen=True)
class EngineConfig:
    """Pool size in blocks, block size, the step's limits and the batching policy.

    ``max_num_batched_tokens=None``: no token budget (every prompt prefills whole);
    ``max_model_len=None``: the model's ``max_position_embeddings``.
    """

    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 8
    max_wait_s: float = 0.0
    policy: Policy = "continuous"
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    max_model_len: int | None = None


class Engine:
    """Serve :class:`Request` objects on one model replica."""

    def __init__(
        self,
        model: TinyDecoder,
        config: EngineConfig,
        clock: Callable[[], float] = time.perf_counter,
        gpu_clock: GpuClock | None = None,
    ) -> None:
        require_int(config.num_blocks, "num_blocks", 1)
        self.model, self.config, self.clock = model, config, clock
        self.gpu_clock = gpu_clock
        self.modelled_now_s = 0.0  # seconds on the modelled GPU, when there is one
        self.cache = PagedKVCache(config.num_blocks, config.block_size,
                                  enable_prefix_caching=config.enable_prefix_caching)
        self.kv = PagedKV(model.cfg, config.num_blocks, config.block_size, model.dtype)
        self.scheduler = Scheduler(
            self.cache,
            max_num_seqs=config.max_num_seqs,
            policy=config.policy,
            max_wait_s=config.max_wait_s,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
        )
        self.max_model_len = self._max_model_len(model, config)
        self.results: dict[str, RequestResult] = {}
        self.steps: list[StepRecord] = []
        self._pending: list[Request] = []  # not yet arrived
        self._states: dict[str, tuple[Request, SeqState]] = {}
        self._start = clock()  # times in results and records are seconds after this

    @staticmethod
    def _max_model_len(model: TinyDecoder, config: EngineConfig) -> int:
        limit = model.cfg.max_position_embeddings
        if config.max_model_len is None:
            if limit is None:
                raise ValueError("the model gives no max_position_embeddings: set max_model_len")
            return limit
        require_int(config.max_model_len, "max_model_len", 1)
        if limit is not None and config.max_model_len > limit:
            raise ValueError(f"max_model_len ({config.max_model_len}) exceeds the model's "
                             f"max_position_embeddings ({limit}): lower it")
        if (config.max_num_batched_tokens is not None and not config.enable_chunked_prefill
                and config.max_num_batched_tokens < config.max_model_len):
            raise ValueError(
                f"max_num_batched_tokens ({config.max_num_batched_tokens}) is below "
                f"max_model_len ({config.max_model_len}) without chunked prefill: a long "
                "prompt could never be scheduled; raise the budget or enable chunked prefill")
        return config.max_model_len

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
        if any(not is_int(t) or not 0 <= t < vocab for t in prompt):
            return f"prompt token ids must be integers in [0, {vocab})"
        if request.max_new_tokens is not None and not is_int(request.max_new_tokens):
            return "max_new_tokens must be an integer or None"
        if len(prompt) >= self.max_model_len:
            return (f"prompt ({len(prompt)} tokens) leaves no room under max_model_len "
                    f"({self.max_model_len})")
        max_new = self._max_new_tokens(request)
        if max_new < 1:
            return "max_new_tokens must be at least 1"
        total = len(prompt) + max_new
        if total > self.max_model_len:
            return (f"prompt ({len(prompt)}) + max_new_tokens ({max_new}) exceeds "
                    f"max_model_len ({self.max_model_len}): lower max_new_tokens")
        if any(not is_int(t) for t in request.stop_token_ids):
            return "stop_token_ids must be integers"
        needed = blocks_for_tokens(total, self.config.block_size)
        if needed > self.config.num_blocks:
            return (
                f"needs {needed} blocks of {self.config.block_size} tokens but the pool has "
                f"{self.config.num_blocks}: it could never run"
            )
        return None

    def _max_new_tokens(self, request: Request) -> int:
        """The request's own limit, or what ``max_model_len`` leaves after its prompt."""
        if request.max_new_tokens is None:
            return self.max_model_len - len(request.prompt)
        return request.max_new_tokens

    def run(self, requests: Sequence[Request] = ()) -> list[RequestResult]:
        """Submit ``requests`` and step until every request is finished or failed."""
        self._start = self.clock()
        self.modelled_now_s = 0.0
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
            state = SeqState(request.request_id, list(request.prompt),
                             self._max_new_tokens(request), request.arrival_s,
                             stop_token_ids=tuple(request.stop_token_ids))
            self._states[request.request_id] = (request, state)
            if self.gpu_clock is not None:
                self.results[request.request_id].modelled_arrival_s = self.modelled_now_s
            self.scheduler.add(state)

    def step(self, now_s: float) -> bool:
        """Queue the requests arrived by ``now_s``, then one scheduling decision and one
        forward pass; False when nothing could run."""
        self._release_arrivals(now_s)
        self.before_schedule()
        plan = self.scheduler.schedule(now_s, more_coming=bool(self._pending))
        for seq in plan.preempted:
            self.results[seq.request_id].preemptions = seq.preemptions
        if not plan:
            return False
        logits = self.model.forward_batch([self._input(c) for c in plan.chunks], self.kv)
        done_at = self.now_s()
        cost = None if self.gpu_clock is None else self.gpu_clock.cost(plan)
        if cost is not None:
            self.modelled_now_s += cost.step_s
        for chunk, row in zip(plan.chunks, logits, strict=True):
            self.results[chunk.seq.request_id].cached_prompt_tokens = chunk.seq.cached_tokens
            if chunk.samples:  # a chunk in the middle of a prompt yields no token
                self._emit(chunk.seq, int(torch.argmax(row)), done_at)
        record = self._record(plan, now_s)
        if cost is not None:
            record = dataclasses.replace(record, modelled_s=cost.step_s,
                                         recompute_s=cost.recompute_s,
                                         recompute_tokens=cost.recompute_tokens)
        self.steps.append(record)
        return True

    def before_schedule(self) -> None:
        """Runs each step once the arrivals are queued, before the scheduler plans; a
        subclass brings blocks back into the pool here (:mod:`kvlib.engine.host_tier`)."""

    def adopt(self, request: Request, generated: Sequence[int]) -> SeqState | None:
        """Take over ``request`` whose prompt another engine prefilled (it sampled
        ``generated``): blocks for the prompt and a running slot, or None while either is
        short. The caller fills the blocks (:mod:`kvlib.engine.disagg`)."""
        if len(self.scheduler.running) >= self.config.max_num_seqs:
            return None
        prompt = list(request.prompt)
        # the prompt's blocks now, and one more for the next token's key and value
        need = blocks_for_tokens(len(prompt) + 1, self.config.block_size)
        if need > self.cache.pool.num_free_blocks:
            return None
        state = SeqState(request.request_id, prompt, self._max_new_tokens(request),
                         request.arrival_s, generated=list(generated),
                         stop_token_ids=tuple(request.stop_token_ids),
                         num_computed_tokens=len(prompt))
        self.cache.add_sequence(request.request_id, prompt)
        result = self.results.setdefault(
            request.request_id, RequestResult(request.request_id, arrival_s=request.arrival_s))
        result.output_tokens = list(generated)
        # the tokens came from the other engine: this engine's clock sees them now
        result.token_times_s = [self.now_s()] * len(result.output_tokens)
        result.first_token_s = result.token_times_s[0] if generated else None
        self._states[request.request_id] = (request, state)
        self.scheduler.running.append(state)
        return state

    def _input(self, chunk: Chunk) -> SeqInput:
        end, size = chunk.start + chunk.num_tokens, self.config.block_size
        table = self.cache.block_table(chunk.seq.request_id)
        slots = [table[p // size] * size + p % size for p in range(end)]
        return SeqInput(chunk.seq.tokens[chunk.start : end], chunk.start, slots)

    def _emit(self, seq: SeqState, token: int, now: float) -> None:
        request, result = self._states[seq.request_id][0], self.results[seq.request_id]
        seq.generated.append(token)
        result.output_tokens.append(token)
        result.token_times_s.append(now)
        if self.gpu_clock is not None:
            result.modelled_token_times_s.append(self.modelled_now_s)
        if result.first_token_s is None:
            result.first_token_s = now
        if request.on_token is not None:
            request.on_token(seq.request_id, token)
        if seq.done:
            self.scheduler.finish(seq)
            result.finish_s, result.finish_reason = now, seq.finish_reason

    def _record(self, plan: Plan, now_s: float) -> StepRecord:
        pool = self.cache.pool
        return StepRecord(
            step=len(self.steps),
            time_s=now_s,
            used_blocks=pool.num_blocks - pool.num_free_blocks,
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            prefill_tokens=plan.num_tokens - len(plan.decode),
            decode_tokens=len(plan.decode),
            preempted=len(plan.preempted),
        )


class StepClock:
    """Engine time counted in forward passes: :func:`serve_in_steps` advances it by one
    after every step, so a run's times do not depend on how busy the machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve_in_steps(
    model: TinyDecoder,
    config: EngineConfig,
    requests: Sequence[Request],
    *,
    before: Callable[[Engine], None] | None = None,
    after_step: Callable[[Engine], None] | None = None,
    gpu_clock: GpuClock | None = None,
) -> Engine:
    """Serve ``requests`` on a :class:`StepClock` (``arrival_s`` in steps) until every one
    has finished or failed; ``before(engine)`` runs once before the first step (to
    instrument it), ``after_step(engine)`` after each; ``gpu_clock`` adds the modelled GPU
    times. Returns the engine, whose ``results`` and ``steps`` hold the run."""
    clock = StepClock()
    engine = Engine(model, config, clock=clock, gpu_clock=gpu_clock)
    if before is not None:
        before(engine)
    for request in requests:
        engine.submit(request)
    while any(r.finish_s is None and r.error is None for r in engine.results.values()):
        engine.step(clock.now)
        if after_step is not None:
            after_step(engine)
        clock.now += 1.0
    return engine
