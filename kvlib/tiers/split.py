"""Prefill and decode on the same GPUs or apart: whether a layer-by-layer hand-off hides
under prefill, and the goodput each layout reaches at TTFT and TPOT targets.

**Layer by layer.** A prefill of ``L`` identical layers takes ``p = t_prefill / L`` a
layer and the hand-off ``x = t_transfer / L`` a layer. Sending layer ``i``'s K and V as
soon as the layer is computed, over one link, layer ``i``'s send ends at
``e_i = max(i p, e_(i-1)) + x``; so the last one ends at
``max(L p + x, p + L x)`` and the transfer shows past the prefill by

    exposed = max(x, t_transfer - (L - 1) p)

It hides (only the last layer's ``x`` shows, which nothing can hide) iff ``x <= p``;
sent after the prefill, all of ``t_transfer`` shows.

**Goodput** (DistServe, Zhong et al., OSDI 2024): the highest request rate a GPU serves
with the mean TTFT and the mean TPOT within their targets. Deterministic mean-value
models on the step model (:mod:`kvlib.step`), one instance of ``tp`` GPUs each:

- *aggregated* (continuous batching with chunked prefill under a token budget ``K``,
  vLLM's scheduler: the ``B`` running decodes first, a waiting prompt gets the rest):
  ``B`` requests decode and, to keep the batch full, a prompt joins every ``O / B``
  steps on average (``m = B / O`` a step). Each step's operations add (one step model), so
  every decode waits for the prefill in its step. Two regimes:

  * whole prompts, ``P <= K - B``: ``j = floor(m)`` prompts in a share ``1 - (m - j)`` of
    the steps and ``j + 1`` in the rest, ``t(j)`` the step of the ``B`` decodes and ``j``
    prompts: ``TPOT = (1 - (m - j)) t(j) + (m - j) t(j + 1)`` and the prompt's own step
    ``t(j + 1)`` (it keeps up while ``(j + 1) P <= K - B``);
  * chunks, ``P > K - B``: a prompt fills ``n = ceil(P / (K - B))`` steps, chunk ``i``
    after ``i (K - B)`` cached tokens, ``t_i`` each, and ``O / B - n`` steps between
    prompts hold decodes only (``t_0``): ``TPOT = (sum t_i + (O / B - n) t_0) / (O / B)``
    and the prompt's own steps ``sum t_i`` (it keeps up while ``n <= O / B``).

  The rate is ``B / (O x TPOT)`` (Little's law) and ``TTFT = TPOT / 2`` (the step under
  way when the prompt arrives) plus the prompt's own steps. Smaller chunks spread a
  prompt over more steps: a lower TPOT for a later first token;
- *disaggregated*: a prefill instance serves prompts one at a time, an M/D/1 queue
  (Poisson arrivals, deterministic service ``D`` = one prompt alone): mean
  ``TTFT = D + lambda D^2 / (2 (1 - lambda D))`` (the Pollaczek-Khinchine mean wait for
  a deterministic service; Kleinrock, *Queueing Systems* vol. 1, 1975, chapter 5), plus
  the hand-off's exposed time; a decode instance runs ``B`` decodes a step with no
  prefill beside them: ``TPOT = t(B decodes)`` and rate ``B / (O x TPOT)``. The layout's
  rate is ``min(n_p r_p, n_d r_d)``, per GPU over ``n_p tp_p + n_d tp_d`` GPUs (the
  DistServe authors' arithmetic: ``min(5.6 x 2, 10) / 3 = 3.3`` requests a second a GPU
  for two prefill and one decode instance; hao-ai-lab.github.io/blogs/distserve, 2024).

Chapter 5's :func:`kvlib.serving.latency.goodput_per_s` prices one pool's TPOT with
:func:`kvlib.step.steady_state_step`, every prompt spread evenly over every step: the
limit of ever smaller chunks, where prefill tokens ride under the decode steps' weight
reads. Here the chunk is what the token budget leaves, as vLLM cuts it, so a long prompt
in a step shows in its neighbours' TPOT. The transfer is counted in TTFT: the decode
instance cannot stream a token before it holds the cache. Means, not DistServe's P90
targets; the pool must hold ``max_batch`` sequences (the caller bounds it); scheduler gaps
and all-reduces are not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from kvlib._validate import require_int, require_positive
from kvlib.config import ModelConfig
from kvlib.hardware import GPUSpec
from kvlib.step import (
    ASSUMED_MFU,
    VLLM_MAX_NUM_BATCHED_TOKENS_API,
    PrefillChunk,
    mixed_step,
    step_time,
)
from kvlib.tiers.handoff import handoff, transfer_s

__all__ = [
    "AggregatedPoint",
    "DisaggregatedGoodput",
    "LayerwiseOverlap",
    "Workload",
    "aggregated_goodput",
    "aggregated_point",
    "best_split",
    "decode_rate_for_tpot",
    "disaggregated_goodput",
    "handoff_overlap",
    "layerwise_overlap",
    "md1_ttft_s",
    "prefill_rate_for_ttft",
    "split_goodput_per_gpu",
]


def _require_seconds(value: object, name: str) -> float:
    """A time that may be 0 but not negative or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LayerwiseOverlap:
    """A prefill of ``layers`` equal layers and a hand-off sent layer by layer."""

    prefill_s: float
    transfer_s: float
    layers: int

    @property
    def per_layer_prefill_s(self) -> float:
        """``p = t_prefill / L``."""
        return self.prefill_s / self.layers

    @property
    def per_layer_transfer_s(self) -> float:
        """``x = t_transfer / L``."""
        return self.transfer_s / self.layers

    @property
    def hidden(self) -> bool:
        """Whether the sends keep pace with the layers: ``x <= p``."""
        return self.per_layer_transfer_s <= self.per_layer_prefill_s

    @property
    def exposed_s(self) -> float:
        """Time the hand-off adds after the prefill: ``max(x, t_transfer - (L - 1) p)``."""
        return max(self.per_layer_transfer_s,
                   self.transfer_s - (self.layers - 1) * self.per_layer_prefill_s)

    @property
    def finish_s(self) -> float:
        """When the decode side holds the whole cache: ``t_prefill + exposed``."""
        return self.prefill_s + self.exposed_s


def layerwise_overlap(prefill_s: float, transfer_s: float, layers: int) -> LayerwiseOverlap:
    """A prefill of ``prefill_s`` over ``layers`` equal layers, each layer's K and V sent
    as soon as it is computed (module docstring for the arithmetic)."""
    require_positive(prefill_s, "prefill_s")
    _require_seconds(transfer_s, "transfer_s")
    require_int(layers, "layers", 1)
    return LayerwiseOverlap(float(prefill_s), float(transfer_s), layers)


def handoff_overlap(
    cfg: ModelConfig, gpu: GPUSpec, prompt_tokens: int, bytes_per_s: float, *,
    prefill_tp: int = 1, decode_tp: int = 1, mfu: float = ASSUMED_MFU, kv_dtype: str = "bf16",
) -> LayerwiseOverlap:
    """One prompt's prefill alone on ``prefill_tp`` GPUs (the step model) against its
    hand-off to ``decode_tp`` GPUs over links of ``bytes_per_s`` each
    (:func:`kvlib.tiers.handoff.transfer_s`), sent layer by layer."""
    plan = handoff(cfg, prompt_tokens, prefill_tp=prefill_tp, decode_tp=decode_tp,
                   kv_dtype=kv_dtype)
    prefill = step_time(cfg, gpu, (), [PrefillChunk(prompt_tokens)], mfu=mfu, tp=prefill_tp,
                        kv_dtype=kv_dtype).total_s
    return layerwise_overlap(prefill, transfer_s(plan, bytes_per_s), len(cfg.layers))


def md1_ttft_s(prefill_s: float, rate_per_s: float) -> float:
    """Mean time in an M/D/1 prefill queue: ``D + lambda D^2 / (2 (1 - lambda D))``;
    ValueError when ``lambda D >= 1`` (the queue grows without bound)."""
    d = require_positive(prefill_s, "prefill_s")
    rate = _require_seconds(rate_per_s, "rate_per_s")
    if rate * d >= 1:
        raise ValueError(f"rate_per_s: {rate:g}/s x prefill_s {d:g} s = {rate * d:g} >= 1; "
                         "the prefill queue grows without bound, lower the rate")
    return d + rate * d * d / (2 * (1 - rate * d))


def prefill_rate_for_ttft(prefill_s: float, ttft_target_s: float, extra_s: float = 0.0) -> float:
    """The highest arrival rate at which an M/D/1 prefill instance's mean TTFT, plus
    ``extra_s`` (the hand-off's exposed time), stays within ``ttft_target_s``: with the
    wait budget ``W = target - D - extra``, ``lambda D^2 / (2 (1 - lambda D)) <= W`` gives
    ``lambda = 2 W / (D (D + 2 W))``; 0 when ``W < 0``."""
    d = require_positive(prefill_s, "prefill_s")
    wait = require_positive(ttft_target_s, "ttft_target_s") - d - _require_seconds(extra_s,
                                                                                     "extra_s")
    if wait < 0:
        return 0.0
    return 2 * wait / (d * (d + 2 * wait))


@dataclass(frozen=True)
class Workload:
    """Requests of ``P`` prompt and ``O`` output tokens, and the mean-latency targets."""

    prompt_tokens: int
    output_tokens: int
    ttft_target_s: float
    tpot_target_s: float

    def __post_init__(self) -> None:
        require_int(self.prompt_tokens, "prompt_tokens", 1)
        require_int(self.output_tokens, "output_tokens", 1)
        require_positive(self.ttft_target_s, "ttft_target_s")
        require_positive(self.tpot_target_s, "tpot_target_s")

    @property
    def decode_context_tokens(self) -> int:
        """The mean context a decode reads: ``P + O // 2`` (as :mod:`kvlib.step`)."""
        return self.prompt_tokens + self.output_tokens // 2


@dataclass(frozen=True)
class AggregatedPoint:
    """One aggregated instance of ``tp`` GPUs holding ``batch`` requests (module doc)."""

    batch: int
    tp: int
    max_num_batched_tokens: int
    prompt_steps: int  # steps that carry one prompt's tokens (1 when it fits whole)
    keeps_up: bool  # the budget prefills the prompts as fast as requests finish
    tpot_s: float  # the mean step, prefill and decode together
    ttft_s: float
    requests_per_s: float  # B / (O x TPOT)

    @property
    def requests_per_s_per_gpu(self) -> float:
        """``requests_per_s / tp``."""
        return self.requests_per_s / self.tp

    def meets(self, workload: Workload) -> bool:
        """The budget keeps up, and both means are within their targets."""
        return (self.keeps_up and self.tpot_s <= workload.tpot_target_s
                and self.ttft_s <= workload.ttft_target_s)


def aggregated_point(
    cfg: ModelConfig, gpu: GPUSpec, workload: Workload, batch: int, *, tp: int = 1,
    mfu: float = ASSUMED_MFU, kv_dtype: str = "bf16",
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS_API,
) -> AggregatedPoint:
    """TPOT, TTFT and rate of an aggregated instance at ``batch`` (module docstring)."""
    require_int(batch, "batch", 1)
    budget = require_int(max_num_batched_tokens, "max_num_batched_tokens", 1)
    if budget <= batch:
        raise ValueError(f"max_num_batched_tokens ({budget:,}) leaves no room for a prompt "
                         f"beside {batch:,} decodes: raise it or lower the batch")
    p, o, room = workload.prompt_tokens, workload.output_tokens, budget - batch
    contexts = [workload.decode_context_tokens] * batch

    def step_s(chunks: list[PrefillChunk]) -> float:
        return step_time(cfg, gpu, contexts, chunks, mfu=mfu, tp=tp, kv_dtype=kv_dtype).total_s

    joins = Fraction(batch, o)  # m: prompts joining a step on average
    if p <= room:  # whole prompts, j or j + 1 a step
        whole = math.floor(joins)
        share = float(joins - whole)  # steps that carry one prompt more
        own = step_s([PrefillChunk(p)] * (whole + 1))
        tpot = (1 - share) * step_s([PrefillChunk(p)] * whole) + share * own
        steps, keeps_up = 1, (whole + 1) * p <= room
    else:  # chunks of `room` tokens, one prompt at a time
        steps = math.ceil(p / room)
        own = sum(step_s([PrefillChunk(min(room, p - i * room), i * room, last=i == steps - 1)])
                  for i in range(steps))
        cycle = 1 / joins  # O / B steps between prompts
        keeps_up = steps <= cycle
        tpot = (own + float(cycle - steps) * step_s([])) / float(cycle)
    return AggregatedPoint(batch, tp, budget, steps, keeps_up, tpot, tpot / 2 + own,
                           batch / (o * tpot))


def aggregated_goodput(
    cfg: ModelConfig, gpu: GPUSpec, workload: Workload, *, max_batch: int, tp: int = 1,
    mfu: float = ASSUMED_MFU, kv_dtype: str = "bf16",
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS_API,
) -> AggregatedPoint | None:
    """The batch up to ``max_batch`` (and below the token budget) with the highest rate
    meeting both targets (ties: the smaller batch), or None when no batch does."""
    require_int(max_batch, "max_batch", 1)
    budget = require_int(max_num_batched_tokens, "max_num_batched_tokens", 1)
    best: AggregatedPoint | None = None
    for batch in range(1, min(max_batch, budget - 1) + 1):
        point = aggregated_point(cfg, gpu, workload, batch, tp=tp, mfu=mfu, kv_dtype=kv_dtype,
                                 max_num_batched_tokens=budget)
        if point.meets(workload) and (best is None or point.requests_per_s > best.requests_per_s):
            best = point
    return best


def decode_rate_for_tpot(
    cfg: ModelConfig, gpu: GPUSpec, workload: Workload, *, max_batch: int, tp: int = 1,
    mfu: float = ASSUMED_MFU, kv_dtype: str = "bf16",
) -> tuple[int, float, float]:
    """A decode instance's ``(batch, step_s, requests_per_s)`` at the batch up to
    ``max_batch`` with the highest rate ``B / (O t(B))`` whose step ``t(B)`` (decodes only,
    at the mean context) meets the TPOT target; ``(0, 0.0, 0.0)`` when none does."""
    require_int(max_batch, "max_batch", 1)
    best = (0, 0.0, 0.0)
    for batch in range(1, max_batch + 1):
        step = mixed_step(cfg, gpu, batch, workload.decode_context_tokens, mfu=mfu, tp=tp,
                          kv_dtype=kv_dtype).total_s
        rate = batch / (workload.output_tokens * step)
        if step <= workload.tpot_target_s and rate > best[2]:
            best = (batch, step, rate)
    return best


def split_goodput_per_gpu(
    prefill_rate_per_s: float, decode_rate_per_s: float, n_prefill: int, n_decode: int, *,
    prefill_gpus: int = 1, decode_gpus: int = 1,
) -> float:
    """Requests a second a GPU of ``n_prefill`` prefill and ``n_decode`` decode instances:
    ``min(n_p r_p, n_d r_d) / (n_p g_p + n_d g_d)``, ``g`` the GPUs an instance holds."""
    _require_seconds(prefill_rate_per_s, "prefill_rate_per_s")
    _require_seconds(decode_rate_per_s, "decode_rate_per_s")
    require_int(n_prefill, "n_prefill", 1)
    require_int(n_decode, "n_decode", 1)
    require_int(prefill_gpus, "prefill_gpus", 1)
    require_int(decode_gpus, "decode_gpus", 1)
    served = min(n_prefill * prefill_rate_per_s, n_decode * decode_rate_per_s)
    return served / (n_prefill * prefill_gpus + n_decode * decode_gpus)


def best_split(
    prefill_rate_per_s: float, decode_rate_per_s: float, gpu_budget: int, *,
    prefill_gpus: int = 1, decode_gpus: int = 1,
) -> tuple[int, int, float]:
    """``(n_prefill, n_decode, requests_per_s_per_gpu)``: the instance counts within
    ``gpu_budget`` GPUs with the most requests a second a GPU (ties: the fewest GPUs);
    ValueError when the budget cannot hold one instance of each."""
    require_int(gpu_budget, "gpu_budget", 1)
    if prefill_gpus + decode_gpus > gpu_budget:
        raise ValueError(f"gpu_budget: {gpu_budget} GPUs cannot hold a prefill instance "
                         f"({prefill_gpus}) and a decode instance ({decode_gpus})")
    best = (0, 0, -1.0)
    for n_p in range(1, (gpu_budget - decode_gpus) // prefill_gpus + 1):
        for n_d in range(1, (gpu_budget - n_p * prefill_gpus) // decode_gpus + 1):
            per_gpu = split_goodput_per_gpu(prefill_rate_per_s, decode_rate_per_s, n_p, n_d,
                                            prefill_gpus=prefill_gpus, decode_gpus=decode_gpus)
            if per_gpu > best[2]:
                best = (n_p, n_d, per_gpu)
    return best


@dataclass(frozen=True)
class DisaggregatedGoodput:
    """Prefill and decode instances apart, sized for one workload (module docstring)."""

    prefill_s: float  # one prompt alone on a prefill instance: D
    exposed_transfer_s: float  # the hand-off past the prefill, sent layer by layer
    prefill_requests_per_s: float  # one prefill instance at the TTFT target
    decode_batch: int
    decode_step_s: float  # the TPOT of a decode instance
    decode_requests_per_s: float  # one decode instance at the TPOT target
    n_prefill: int
    n_decode: int
    requests_per_s_per_gpu: float


def disaggregated_goodput(
    cfg: ModelConfig, gpu: GPUSpec, workload: Workload, *, max_batch: int, gpu_budget: int,
    bytes_per_s: float, prefill_tp: int = 1, decode_tp: int = 1, mfu: float = ASSUMED_MFU,
    kv_dtype: str = "bf16",
) -> DisaggregatedGoodput:
    """Prefill instances (M/D/1 at the TTFT target, the hand-off's exposed time counted)
    and decode instances (the best batch at the TPOT target) in the best split of
    ``gpu_budget`` GPUs; the hand-off over links of ``bytes_per_s`` a GPU."""
    overlap = handoff_overlap(cfg, gpu, workload.prompt_tokens, bytes_per_s,
                              prefill_tp=prefill_tp, decode_tp=decode_tp, mfu=mfu,
                              kv_dtype=kv_dtype)
    prefill_rate = prefill_rate_for_ttft(overlap.prefill_s, workload.ttft_target_s,
                                         overlap.exposed_s)
    batch, step, decode_rate = decode_rate_for_tpot(cfg, gpu, workload, max_batch=max_batch,
                                                    tp=decode_tp, mfu=mfu, kv_dtype=kv_dtype)
    n_p, n_d, per_gpu = best_split(prefill_rate, decode_rate, gpu_budget,
                                   prefill_gpus=prefill_tp, decode_gpus=decode_tp)
    return DisaggregatedGoodput(overlap.prefill_s, overlap.exposed_s, prefill_rate, batch, step,
                                decode_rate, n_p, n_d, per_gpu)
