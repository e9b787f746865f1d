"""One GPU's pool with prefill charged: service time, time to first token, time per output
token, and goodput, all from the step model (:mod:`kvlib.step`).

A continuous-batching engine with chunked prefill (vLLM v1) runs one kind of step: the
running requests' decodes and the prompt chunks of the requests it admits, under one
token budget. With ``n`` requests decoding, a step finishes ``n / O`` of them on
average (``O`` output tokens each) and, to keep the batch, prefills as many new prompts:
:func:`kvlib.step.steady_state_step` is that mean step (exact whenever requests wait,
since each one that finishes lets one in; the mean otherwise). So

- service with ``n`` running: ``S(n) = O x t_step(n)`` (:func:`service_by_batch_s`), the
  load-dependent M/M/c of :mod:`kvlib.serving.slots` on it;
- the largest rate the GPU takes: ``c / S(c)``, reachable by construction (the step's
  FLOP/s stay at most MFU x peak and its bytes/s at most the bandwidth);
- time per output token (TPOT) at a load: the mean step at the mean batch;
- time to first token (TTFT): the queue wait, then ``ceil(prompt / chunk)`` steps that
  carry the prompt's chunks, ``chunk = budget - batch`` (vLLM schedules the running
  decodes first and gives a new prompt what is left of ``max_num_batched_tokens``);
- goodput (DistServe: Zhong et al., "DistServe: Disaggregating Prefill and Decoding for
  Goodput-optimized Large Language Model Serving", OSDI 2024): the largest arrival rate
  at which the requests meet both a TTFT and a TPOT target, at an attainment quantile
  ``q`` (DistServe's evaluation uses 90%). Here the TTFT quantile is the wait's
  ``q``-quantile plus the prefill steps, and TPOT the mean step at the mean batch.

MFU is the step model's stated assumption (:data:`kvlib.step.ASSUMED_MFU`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlib._validate import require_int
from kvlib.config import ModelConfig
from kvlib.hardware import GPUSpec
from kvlib.serving.erlang import require_quantile, require_rate, require_seconds
from kvlib.serving.slots import load_dependent_mmc
from kvlib.step import (
    ASSUMED_MFU,
    VLLM_MAX_NUM_BATCHED_TOKENS_API,
    PrefillChunk,
    steady_state_step,
    step_time,
)

__all__ = [
    "PoolLatency",
    "goodput_per_s",
    "max_arrivals_per_s",
    "pool_latency",
    "prefill_s",
    "service_by_batch_s",
]


def service_by_batch_s(
    cfg: ModelConfig, gpu: GPUSpec, slots: int, prompt_tokens: int, output_tokens: int,
    *, mfu: float = ASSUMED_MFU, prefill: bool = True,
) -> list[float]:
    """``S(n) = O x t_step(n)`` for ``n = 1 .. slots``: ``t_step`` the steady-state step with
    ``n`` decodes at the mean context ``P + O/2`` and the prompts that replace the
    finishing requests (``prefill=False``: the decodes alone, the step without prefill)."""
    require_int(slots, "slots", 1)
    require_int(output_tokens, "output_tokens", 1)
    context = prompt_tokens + output_tokens // 2
    services = []
    for n in range(1, slots + 1):
        if prefill:
            step = steady_state_step(cfg, gpu, n, prompt_tokens, output_tokens, mfu=mfu)
        else:
            step = step_time(cfg, gpu, [context] * n, mfu=mfu)
        services.append(output_tokens * step.total_s)
    return services


def max_arrivals_per_s(services_s: list[float]) -> float:
    """``c / S(c)``: the rate at which every slot is busy; the queue is unstable beyond."""
    return len(services_s) / services_s[-1]


def prefill_s(
    cfg: ModelConfig, gpu: GPUSpec, prompt_tokens: int, batch: int, context_tokens: int,
    *, token_budget: int = VLLM_MAX_NUM_BATCHED_TOKENS_API, mfu: float = ASSUMED_MFU,
) -> tuple[int, float]:
    """``(steps, seconds)`` to prefill a prompt beside ``batch`` decodes at
    ``context_tokens``: chunks of ``budget - batch`` tokens, each step's time from the step
    model (its chunk after the ones already cached)."""
    require_int(prompt_tokens, "prompt_tokens", 1)
    require_int(batch, "batch")
    chunk = require_int(token_budget, "token_budget", 1) - batch
    if chunk < 1:
        raise ValueError(f"token_budget ({token_budget:,}) leaves no room for a prompt beside "
                         f"{batch:,} decodes: raise max_num_batched_tokens")
    steps = math.ceil(prompt_tokens / chunk)
    seconds = 0.0
    for i in range(steps):
        done = i * chunk
        piece = PrefillChunk(min(chunk, prompt_tokens - done), done, last=i == steps - 1)
        seconds += step_time(cfg, gpu, [context_tokens] * batch, [piece], mfu=mfu).total_s
    return steps, seconds


@dataclass(frozen=True)
class PoolLatency:
    """What a request sees at one arrival rate (seconds)."""

    arrivals_per_s: float
    utilization: float  # lambda S(c) / c
    p_wait: float  # share of arrivals that wait for a slot
    mean_batch: float  # requests decoding at once, on average
    wait_q_s: float  # the q-quantile of the queue wait
    prefill_steps: int
    prefill_s: float
    ttft_q_s: float  # wait_q_s + prefill_s
    tpot_s: float  # the mean step at the mean batch
    decode_s: float  # O x tpot_s
    e2e_mean_s: float  # mean wait + prefill + decode


def pool_latency(
    cfg: ModelConfig, gpu: GPUSpec, slots: int, prompt_tokens: int, output_tokens: int,
    arrivals_per_s: float, *, q: float = 0.9,
    token_budget: int = VLLM_MAX_NUM_BATCHED_TOKENS_API, mfu: float = ASSUMED_MFU,
    services_s: list[float] | None = None,
) -> PoolLatency:
    """Waits, TTFT, TPOT and decode time of ``slots`` on one GPU at ``arrivals_per_s``
    (``services_s``: :func:`service_by_batch_s`'s list, to reuse it across rates)."""
    rate = require_rate("arrivals_per_s", arrivals_per_s)
    q = require_quantile(q)
    services = services_s or service_by_batch_s(cfg, gpu, slots, prompt_tokens, output_tokens,
                                                 mfu=mfu)
    queue = load_dependent_mmc(rate, services)
    batch = max(1, round(queue.mean_running))
    tpot = steady_state_step(cfg, gpu, batch, prompt_tokens, output_tokens, mfu=mfu).total_s
    steps, first = prefill_s(cfg, gpu, prompt_tokens, batch, prompt_tokens + output_tokens // 2,
                             token_budget=token_budget, mfu=mfu)
    wait_q = queue.wait_percentile_s(q)
    decode = output_tokens * tpot
    return PoolLatency(rate, queue.utilization, queue.p_wait, queue.mean_running, wait_q,
                       steps, first, wait_q + first, tpot, decode,
                       queue.mean_wait_s + first + decode)


def goodput_per_s(
    cfg: ModelConfig, gpu: GPUSpec, slots: int, prompt_tokens: int, output_tokens: int,
    ttft_target_s: float, tpot_target_s: float, *, q: float = 0.9,
    token_budget: int = VLLM_MAX_NUM_BATCHED_TOKENS_API, mfu: float = ASSUMED_MFU,
) -> float:
    """The largest arrival rate whose ``q``-quantile TTFT and whose TPOT meet the targets
    (0.0 when even a trickle misses them). Both rise with the rate, so a bisection between
    0 and ``c / S(c)`` finds it."""
    ttft_goal = require_seconds("ttft_target_s", ttft_target_s)
    tpot_goal = require_seconds("tpot_target_s", tpot_target_s)
    services = service_by_batch_s(cfg, gpu, slots, prompt_tokens, output_tokens, mfu=mfu)

    def meets(rate: float) -> bool:
        at = pool_latency(cfg, gpu, slots, prompt_tokens, output_tokens, rate, q=q,
                          token_budget=token_budget, mfu=mfu, services_s=services)
        return at.ttft_q_s <= ttft_goal and at.tpot_s <= tpot_goal

    lo, hi = 0.0, max_arrivals_per_s(services)
    if not meets(hi * 1e-6):
        return 0.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo
