"""Recognising a KV-bound engine from its per-step metrics.

The signature, in the metrics a serving engine exports (vLLM's Prometheus names in
brackets):

- the cache pool is nearly full (``vllm:kv_cache_usage_perc`` near 1);
- requests wait (``vllm:num_requests_waiting`` above 0, growing under load);
- yet the running batch (``vllm:num_requests_running``) stays below the batch
  cap (``max_num_seqs``): the pool, not the cap, stops admission;
- sequences are preempted (``vllm:num_preemptions_total`` rising).

Whether the GPUs' arithmetic or their memory traffic holds the steps is a second
question, answered from the token counters (:func:`arithmetic_share`): the prompt tokens
computed a second are ``vllm:prompt_tokens_total`` less ``vllm:prefix_cache_hits_total``
(tokens read from the prefix cache cost no arithmetic), plus the generated tokens
(``vllm:generation_tokens_total``), each at its FLOPs, over the GPUs' peak.

A step shows the signature when the pool is at least ``full_fraction`` used,
someone waits, and the batch is below the cap. :func:`diagnose_steps` reads
the records of :class:`kvlib.engine.core.Engine` (any objects with the same fields).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvlib._validate import require_fraction, require_int, require_positive

__all__ = ["StepMetrics", "Symptoms", "arithmetic_share", "diagnose_steps"]


class StepMetrics(Protocol):
    """The fields of one engine step that the diagnosis reads."""

    @property
    def used_blocks(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def preempted(self) -> int: ...


@dataclass(frozen=True)
class Symptoms:
    """What a run's steps show, against its pool and batch cap."""

    steps: int
    num_blocks: int
    max_num_seqs: int
    full_fraction: float
    peak_usage: float  # largest fraction of the pool in use after a step
    mean_usage: float
    peak_waiting: int
    mean_running: float
    preemptions: int
    kv_bound_steps: int  # pool >= full_fraction used, someone waiting, batch below the cap

    @property
    def kv_bound_share(self) -> float:
        """Fraction of steps that show the signature."""
        return self.kv_bound_steps / self.steps if self.steps else 0.0


def diagnose_steps(
    steps: Sequence[StepMetrics],
    num_blocks: int,
    max_num_seqs: int,
    full_fraction: float = 0.9,
) -> Symptoms:
    """Summarise ``steps`` of an engine with a pool of ``num_blocks`` and a batch cap."""
    require_int(num_blocks, "num_blocks", 1)
    require_int(max_num_seqs, "max_num_seqs", 1)
    require_fraction(full_fraction, "full_fraction")
    for i, step in enumerate(steps):
        if not 0 <= step.used_blocks <= num_blocks:
            raise ValueError(
                f"step {i} uses {step.used_blocks} blocks of a pool of {num_blocks}: "
                "pass the pool the records came from"
            )
    n = len(steps)
    usage = [step.used_blocks / num_blocks for step in steps]
    bound = sum(
        1
        for step, used in zip(steps, usage, strict=True)
        if used >= full_fraction and step.waiting > 0 and step.running < max_num_seqs
    )
    return Symptoms(
        steps=n,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        full_fraction=full_fraction,
        peak_usage=max(usage, default=0.0),
        mean_usage=sum(usage) / n if n else 0.0,
        peak_waiting=max((step.waiting for step in steps), default=0),
        mean_running=sum(step.running for step in steps) / n if n else 0.0,
        preemptions=sum(step.preempted for step in steps),
        kv_bound_steps=bound,
    )


def arithmetic_share(
    prompt_tokens_per_s: float,
    prefix_cache_hits_per_s: float,
    generation_tokens_per_s: float,
    flops_per_token: float,
    peak_flops_per_s: float,
) -> float:
    """Share of the GPUs' dense peak the served tokens' arithmetic takes, from the rates of
    vLLM's counters: ``(prompt - prefix-cache hits + generated) x F_tok / F_peak``.

    ``flops_per_token``: about twice the active parameters, plus attention
    (:func:`kvlib.capacity.assessment.decode_flops_per_token`); ``peak_flops_per_s``: every
    GPU's together. Near the MFU the kernels reach, the steps are compute-bound; well below
    it, their bytes hold them. Without the subtraction the share is overstated by the cached
    tokens' FLOPs, which can make a memory-bound deployment with prefix caching on read as
    compute-bound.
    """
    for name, value in (("prompt_tokens_per_s", prompt_tokens_per_s),
                        ("prefix_cache_hits_per_s", prefix_cache_hits_per_s),
                        ("generation_tokens_per_s", generation_tokens_per_s)):
        if value < 0:
            raise ValueError(f"{name} must be at least 0, got {value}")
    if prefix_cache_hits_per_s > prompt_tokens_per_s:
        raise ValueError(
            f"prefix_cache_hits_per_s ({prefix_cache_hits_per_s:g}) exceeds "
            f"prompt_tokens_per_s ({prompt_tokens_per_s:g}): the hits are prompt tokens"
        )
    require_positive(flops_per_token, "flops_per_token")
    require_positive(peak_flops_per_s, "peak_flops_per_s")
    computed = prompt_tokens_per_s - prefix_cache_hits_per_s + generation_tokens_per_s
    return computed * flops_per_token / peak_flops_per_s
