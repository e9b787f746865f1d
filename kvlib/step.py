"""One engine step's time: the only place kvlib computes it.

A step of a continuous-batching engine with chunked prefill (vLLM v1) holds ``B``
decoding sequences, one new token each, and ``C`` prompt tokens of prefill chunks,
under one token budget ``B + C <= max_num_batched_tokens``: vLLM's scheduler starts each
step with ``token_budget = max_num_scheduled_tokens``, gives the running requests their
tokens first and the waiting ones what is left, cutting a prompt to the budget
(``Scheduler.schedule``, ``vllm/v1/core/sched/scheduler.py``, read at commit
``00024d314514``). Its operations run one after the other, so their times add
(chapter 6's rule); within one operation FLOPs and bytes overlap, so each operation
takes the larger of its two roofline times:

    t_step = max(W_read / BW, 2 (P x (B + C) + P_head x S) / F_eff)    weight GEMMs
           + max(sum_i KV(T_i) / BW, F_dec / F_eff)                    decode attention
           + max((KV(P) + KV(C)) / BW, F_pre / F_eff)                  prefill attention

- ``W_read``: the weights the step multiplies by, once (:func:`kvlib.bounds.decode_bytes_per_gpu`
  at ``B + C`` tokens and no cache): for a mixture of experts only the experts its
  ``B + C`` tokens are routed to (:func:`kvlib.bounds.expected_experts_touched`);
- ``P``: active matmul parameters a token passes through, ``P_head`` the LM head, run
  for the ``S`` tokens that are sampled (the ``B`` decodes, plus one per prompt whose last
  chunk is in the step) (:func:`kvlib.bounds.matmul_params`);
- ``KV(T)``: one sequence's cache at ``T`` tokens on one GPU
  (:func:`kvlib.bounds.kv_bytes_per_gpu`); a decode query scores the keys its layer keeps
  (:meth:`kvlib.specs.CacheSpec.decode_flops_per_key`);
- ``F_pre``: the chunk's queries against the ``P`` cached tokens and their own
  (:func:`kvlib.bounds.prefill_attention_flops` at ``P + C`` less at ``P``);
- ``F_eff = MFU x F_peak`` (dense, bf16 or fp8 for the weight GEMMs); ``BW`` the datasheet's
  HBM bandwidth. With tensor parallelism every term is one GPU's share: ``W / tp``, the
  KV heads it holds, ``H / tp`` query heads; the all-reduces between layers are not counted.

Data-parallel attention with expert parallelism (vLLM ``-dp N --enable-expert-parallel``,
``dp = N``) gives each GPU sequences of its own: the contexts and chunks passed are that
GPU's, and the step is its step, every GPU running one like it at once ("forward passes
must be aligned, and expert layers across all ranks are required to synchronize during
every forward pass", vLLM docs, "Data Parallel Deployment"). It reads its own
sequences' whole caches, multiplies its own tokens through attention and the dense weights
it holds whole, and, of its ``E / N`` routed experts, reads those the node's ``N (B + C)``
tokens are routed to (:meth:`kvlib.view.ModelView.dp_step_weight_bytes_per_gpu`); with
routing balanced its experts do as many FLOPs for the node's tokens as its own tokens'
experts need, so ``P`` counts its own tokens. The all-to-all exchanges are not counted.
The node's rate is ``N`` times one GPU's.

Each term is a lower bound (minimum traffic, no kernel launch or scheduler gap), so the
step time is a lower bound and any rate built on it is reachable by construction: the
step's FLOP/s stay at most ``MFU x F_peak`` and its bytes/s at most ``BW``
(:meth:`StepTime.reachable`). A ``min()`` of separate decode and compute bounds is not a
step time: it hides prefill under decode.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from kvlib._validate import (
    are_non_negative_ints,
    require_fraction,
    require_int,
    require_positive,
)
from kvlib.bounds import (
    attention_pairs,
    decode_bytes_per_gpu,
    kv_bytes_per_gpu,
    matmul_params,
    prefill_attention_flops,
)
from kvlib.config import ModelConfig
from kvlib.hardware import GPUSpec
from kvlib.view import model_view

__all__ = [
    "ASSUMED_MFU",
    "VLLM_MAX_NUM_BATCHED_TOKENS_API",
    "VLLM_MAX_NUM_BATCHED_TOKENS_LLM",
    "PrefillChunk",
    "StepTime",
    "decode_attention_flops",
    "mixed_step",
    "steady_state_step",
    "step_time",
    "step_time_from_counts",
]

# Model FLOPs utilization assumed for a serving step's arithmetic: the model's FLOPs per
# second over the dense peak (PaLM's definition, Chowdhery et al., 2022, appendix B,
# arXiv:2204.02311). An assumption, not a measurement: Pope et al. report 76% MFU for
# large-batch prefill of PaLM 540B on TPU v4 ("Efficiently Scaling Transformer
# Inference", MLSys 2023, arXiv:2211.05102), a different chip and a much larger model; no
# GPU run of a whole serving step is recorded in this repository. A whole step (attention,
# norms, small GEMMs, the scheduler between steps) stays below one large matmul's share.
ASSUMED_MFU = 0.6

# vLLM's default token budget on GPUs of 70 GiB or more other than A100s (H100, H200,
# MI300X): 8,192 for the OpenAI API server, 16,384 for the offline LLM class; 2,048 and
# 8,192 on smaller cards (EngineArgs defaults, vllm/engine/arg_utils.py at commit
# 99d7eb5d6a51; EngineArgs.get_batch_defaults in later versions).
VLLM_MAX_NUM_BATCHED_TOKENS_API = 8192
VLLM_MAX_NUM_BATCHED_TOKENS_LLM = 16384


@dataclass(frozen=True)
class PrefillChunk:
    """``tokens`` prompt tokens computed this step after ``cached_tokens`` already in the
    cache (earlier chunks or a prefix-cache hit). ``last`` when the chunk ends its prompt:
    the step then samples the request's first output token (one more LM-head row)."""

    tokens: int
    cached_tokens: int = 0
    last: bool = True

    def __post_init__(self) -> None:
        require_int(self.tokens, "prefill chunk tokens", 1)
        require_int(self.cached_tokens, "prefill chunk cached_tokens")


@dataclass(frozen=True)
class StepTime:
    """One step on one GPU: each operation's bytes, FLOPs and seconds, and their sum.

    ``*_s`` terms are each ``max(bytes / BW, FLOPs / F_eff)`` of that operation;
    :attr:`total_s` adds them.
    """

    decode_tokens: int  # B: sequences decoding one token each
    prefill_tokens: int  # C: prompt tokens of the step's chunks
    mfu: float
    matmul_flops_ceiling_per_s: float  # MFU x dense peak of the weight GEMMs' dtype
    attention_flops_ceiling_per_s: float  # MFU x dense bf16 peak
    bandwidth_bytes_per_s: float
    weight_bytes: int  # weights read once
    weight_flops: int  # 2 x (P x (B + C) + P_head x sampled)
    weights_s: float
    decode_kv_bytes: int  # sum over the B sequences of KV(T_i)
    decode_attention_flops: int
    decode_attention_s: float
    prefill_kv_bytes: int  # the chunks' cached prefixes read and their own KV written
    prefill_attention_flops: int
    prefill_attention_s: float

    @property
    def total_s(self) -> float:
        """The step's time: the three operations' times added."""
        return self.weights_s + self.decode_attention_s + self.prefill_attention_s

    @property
    def tokens(self) -> int:
        """Tokens the step computes: ``B + C``."""
        return self.decode_tokens + self.prefill_tokens

    @property
    def flops(self) -> int:
        """FLOPs of the whole step on one GPU."""
        return self.weight_flops + self.decode_attention_flops + self.prefill_attention_flops

    @property
    def hbm_bytes(self) -> int:
        """Bytes the step moves to or from HBM on one GPU."""
        return self.weight_bytes + self.decode_kv_bytes + self.prefill_kv_bytes

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s over the step: ``flops / total_s``."""
        return self.flops / self.total_s

    @property
    def hbm_bytes_per_s(self) -> float:
        """Achieved HBM bytes/s over the step: ``hbm_bytes / total_s``."""
        return self.hbm_bytes / self.total_s

    @property
    def decode_tokens_per_s(self) -> float:
        """Output tokens a second if steps like this one follow each other: ``B / total_s``."""
        return self.decode_tokens / self.total_s

    @property
    def weights_bound(self) -> str:
        """``"compute"`` when the weight GEMMs' FLOPs take longer than their bytes, else
        ``"memory"``."""
        compute = self.weight_flops / self.matmul_flops_ceiling_per_s
        return "compute" if compute > self.weight_bytes / self.bandwidth_bytes_per_s else "memory"

    @property
    def compute_s(self) -> float:
        """The step's FLOPs at their ceilings: ``weight FLOPs / F_eff(matmul) + attention
        FLOPs / F_eff(bf16)``; at most :attr:`total_s`."""
        attention = self.decode_attention_flops + self.prefill_attention_flops
        return (self.weight_flops / self.matmul_flops_ceiling_per_s
                + attention / self.attention_flops_ceiling_per_s)

    @property
    def memory_s(self) -> float:
        """The step's bytes at the bandwidth: ``hbm_bytes / BW``; at most :attr:`total_s`."""
        return self.hbm_bytes / self.bandwidth_bytes_per_s

    @property
    def bound(self) -> str:
        """``"compute"`` when the step's FLOPs at ``MFU x peak`` take longer than its bytes
        at ``BW`` (:attr:`compute_s` > :attr:`memory_s`), else ``"memory"``."""
        return "compute" if self.compute_s > self.memory_s else "memory"

    def reachable(self, rel_tol: float = 1e-9) -> bool:
        """Whether the GPU can keep this step's pace: its FLOPs fit in ``total_s`` at
        ``MFU x peak`` and its bytes at ``BW`` (true by construction; tests check it)."""
        limit = self.total_s * (1 + rel_tol)
        return self.compute_s <= limit and self.memory_s <= limit


def _peak(gpu: GPUSpec, dtype: str) -> float:
    """Dense peak FLOP/s of ``gpu`` at ``dtype`` (``"bf16"`` or ``"fp8"``)."""
    if dtype == "bf16":
        return gpu.bf16_dense_flops_per_s
    if dtype == "fp8" and gpu.fp8_dense_flops_per_s is not None:
        return gpu.fp8_dense_flops_per_s
    raise ValueError(f"matmul_dtype: {gpu.name} has no dense {dtype} figure; use 'bf16' or 'fp8'")


def decode_attention_flops(cfg: ModelConfig, context_tokens: int) -> int:
    """FLOPs of one decode query at ``T`` cached tokens, every layer, every head:
    ``sum over layers of keys x`` :meth:`~kvlib.specs.CacheSpec.decode_flops_per_key`,
    the keys a layer keeps for query ``T + 1`` (``min(T + 1, W)`` in a window)."""
    require_int(context_tokens, "context_tokens")
    flops = 0
    for spec, count in model_view(cfg).layer_groups:  # layers with one spec: the same FLOPs
        keys = attention_pairs(spec, context_tokens + 1) - attention_pairs(spec, context_tokens)
        flops += count * keys * spec.decode_flops_per_key(cfg.num_attention_heads, cfg.head_dim)
    return flops


def _chunk_counts(
    cfg: ModelConfig, tokens: int, cached_tokens: int, kv_dtype: str, tp: int
) -> tuple[int, int]:
    """``(bytes, FLOPs)`` of a chunk's attention: the cached prefix read and the chunk's own
    cache written once (one GPU's share); its queries' pairs over every layer and head
    (:func:`kvlib.bounds.prefill_attention_flops` at ``P + C`` less at ``P``)."""
    moved = kv_bytes_per_gpu(cfg, cached_tokens, kv_dtype, tp)
    moved += kv_bytes_per_gpu(cfg, tokens, kv_dtype, tp)
    flops = (prefill_attention_flops(cfg, cached_tokens + tokens)
             - prefill_attention_flops(cfg, cached_tokens))
    return moved, flops


def step_time_from_counts(
    *,
    weight_bytes: int,
    weight_flops: int,
    decode_tokens: int,
    decode_kv_bytes: int = 0,
    decode_attention_flops: int = 0,
    prefill_tokens: int = 0,
    prefill_kv_bytes: int = 0,
    prefill_attention_flops: int = 0,
    matmul_flops_per_s: float,
    attention_flops_per_s: float | None = None,
    bandwidth_bytes_per_s: float,
    mfu: float = 1.0,
) -> StepTime:
    """The step from counts already known (one GPU's share), each operation on its own
    roofline and the three times added (see the module docstring). ``matmul_flops_per_s``
    and ``attention_flops_per_s`` (default: the same) are dense peaks; ``mfu`` scales both."""
    require_fraction(mfu, "mfu")
    require_positive(matmul_flops_per_s, "matmul_flops_per_s")
    require_positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
    for name, value in (("weight_bytes", weight_bytes), ("weight_flops", weight_flops),
                        ("decode_tokens", decode_tokens), ("decode_kv_bytes", decode_kv_bytes),
                        ("decode_attention_flops", decode_attention_flops),
                        ("prefill_tokens", prefill_tokens), ("prefill_kv_bytes", prefill_kv_bytes),
                        ("prefill_attention_flops", prefill_attention_flops)):
        require_int(value, name)
    if decode_tokens + prefill_tokens == 0:
        raise ValueError("a step needs decode_tokens or prefill_tokens: both are 0")
    matmul = mfu * matmul_flops_per_s
    attention = mfu * (matmul_flops_per_s if attention_flops_per_s is None
                       else require_positive(attention_flops_per_s, "attention_flops_per_s"))
    bw = bandwidth_bytes_per_s
    return StepTime(
        decode_tokens=decode_tokens,
        prefill_tokens=prefill_tokens,
        mfu=mfu,
        matmul_flops_ceiling_per_s=matmul,
        attention_flops_ceiling_per_s=attention,
        bandwidth_bytes_per_s=bw,
        weight_bytes=weight_bytes,
        weight_flops=weight_flops,
        weights_s=max(weight_bytes / bw, weight_flops / matmul),
        decode_kv_bytes=decode_kv_bytes,
        decode_attention_flops=decode_attention_flops,
        decode_attention_s=max(decode_kv_bytes / bw, decode_attention_flops / attention),
        prefill_kv_bytes=prefill_kv_bytes,
        prefill_attention_flops=prefill_attention_flops,
        prefill_attention_s=max(prefill_kv_bytes / bw, prefill_attention_flops / attention),
    )


def step_time(
    cfg: ModelConfig,
    gpu: GPUSpec,
    decode_contexts: Sequence[int] = (),
    prefill_chunks: Sequence[PrefillChunk] = (),
    *,
    mfu: float = ASSUMED_MFU,
    tp: int = 1,
    dp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    matmul_dtype: str = "bf16",
) -> StepTime:
    """One step of ``cfg`` on each of ``tp`` ``gpu`` s: a decode token for each context in
    ``decode_contexts`` (cached tokens ``T_i``) and the ``prefill_chunks``.

    ``dp > 1``: data-parallel attention with expert parallelism on ``dp`` GPUs (module
    docstring); the contexts and chunks are one GPU's own and the step is that GPU's.
    ``weight_dtype`` sizes the weights read (None: as shipped); ``matmul_dtype`` picks the
    peak the weight GEMMs run at (``"fp8"`` for W8A8 weights on fp8 tensor cores);
    attention runs at the bf16 peak. Raises ValueError for a layer whose attention kvlib
    does not count (linear attention, top-k sparse MLA).
    """
    require_int(tp, "tp", 1)
    require_int(dp, "dp", 1)
    if tp > 1 and dp > 1:
        raise ValueError(f"tp={tp} with dp={dp}: kvlib models one of the two layouts; "
                         "pass tp or dp, not both")
    batch = len(decode_contexts)
    prefill = sum(chunk.tokens for chunk in prefill_chunks)
    tokens = batch + prefill
    if tokens == 0:
        raise ValueError("a step needs decode_contexts or prefill_chunks: both are empty")
    body, head = matmul_params(cfg)
    sampled = batch + sum(1 for chunk in prefill_chunks if chunk.last)
    weight_flops = 2 * (body * tokens + head * sampled)
    if not are_non_negative_ints(decode_contexts):
        for t in decode_contexts:
            require_int(t, "decode context", 0)  # the error, naming the first bad one
    contexts = Counter(decode_contexts)
    decode_kv = sum(n * kv_bytes_per_gpu(cfg, t, kv_dtype, tp) for t, n in contexts.items())
    decode_flops = sum(n * decode_attention_flops(cfg, t) for t, n in contexts.items())
    counts = [_chunk_counts(cfg, c.tokens, c.cached_tokens, kv_dtype, tp) for c in prefill_chunks]
    prefill_kv = sum(kv for kv, _ in counts)
    prefill_flops = sum(flops for _, flops in counts)
    if dp > 1:
        weight_bytes = model_view(cfg).dp_step_weight_bytes_per_gpu(tokens, dp, weight_dtype)
    else:
        weight_bytes = decode_bytes_per_gpu(cfg, tokens, 0, kv_dtype, weight_dtype, tp)
    return step_time_from_counts(
        weight_bytes=weight_bytes,
        weight_flops=weight_flops // tp,
        decode_tokens=batch,
        decode_kv_bytes=decode_kv,
        decode_attention_flops=decode_flops // tp,
        prefill_tokens=prefill,
        prefill_kv_bytes=prefill_kv,
        prefill_attention_flops=prefill_flops // tp,
        matmul_flops_per_s=_peak(gpu, matmul_dtype),
        attention_flops_per_s=gpu.bf16_dense_flops_per_s,
        bandwidth_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        mfu=mfu,
    )


def mixed_step(
    cfg: ModelConfig,
    gpu: GPUSpec,
    decode_batch: int,
    context_tokens: int,
    prefill_tokens: int = 0,
    prefill_cached_tokens: int = 0,
    *,
    mfu: float = ASSUMED_MFU,
    tp: int = 1,
    dp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    matmul_dtype: str = "bf16",
) -> StepTime:
    """:func:`step_time` for the common case: ``decode_batch`` sequences at ``context_tokens``
    each, and one prefill chunk of ``prefill_tokens`` after ``prefill_cached_tokens``
    (ending its prompt), or none when ``prefill_tokens`` is 0 (one GPU's own when
    ``dp > 1``)."""
    require_int(decode_batch, "decode_batch")
    require_int(context_tokens, "context_tokens")
    require_int(prefill_tokens, "prefill_tokens")
    require_int(prefill_cached_tokens, "prefill_cached_tokens")
    chunks = [PrefillChunk(prefill_tokens, prefill_cached_tokens)] if prefill_tokens else []
    return step_time(cfg, gpu, [context_tokens] * decode_batch, chunks, mfu=mfu, tp=tp, dp=dp,
                     kv_dtype=kv_dtype, weight_dtype=weight_dtype, matmul_dtype=matmul_dtype)


def steady_state_step(
    cfg: ModelConfig,
    gpu: GPUSpec,
    batch: int,
    prompt_tokens: int,
    output_tokens: int,
    *,
    cached_tokens: int = 0,
    decode_context_tokens: int | None = None,
    mfu: float = ASSUMED_MFU,
    tp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    matmul_dtype: str = "bf16",
) -> StepTime:
    """The mean step of an engine that keeps ``batch`` requests of ``P`` prompt and ``O``
    output tokens decoding: each step finishes ``B / O`` of them, so to keep the batch full
    it prefills as many new prompts, ``C = B (P - cached) / O`` tokens (the prompts' tokens
    not read from the prefix cache), beside the ``B`` decodes at the mean context
    ``P + O / 2`` (``decode_context_tokens``, by default ``P + O // 2``).

    The prefill terms are the prompts' own scaled by ``B / O``: their attention FLOPs and
    cache bytes (a whole prompt's, as chunks of it would add up to), one sampled token
    each. ``C`` is rounded to whole tokens for the weights read (a mixture of experts'
    touched experts). ``tokens_per_s`` of such steps is ``B / total_s``.
    """
    require_int(batch, "batch", 1)
    require_int(prompt_tokens, "prompt_tokens", 1)
    require_int(output_tokens, "output_tokens", 1)
    require_int(cached_tokens, "cached_tokens")
    require_int(tp, "tp", 1)
    if cached_tokens >= prompt_tokens:
        raise ValueError(f"cached_tokens ({cached_tokens:,}) must leave part of the prompt "
                         f"({prompt_tokens:,}) to prefill: vLLM recomputes at least its last token")
    context = prompt_tokens + output_tokens // 2
    if decode_context_tokens is not None:
        context = require_int(decode_context_tokens, "decode_context_tokens")
    rate = Fraction(batch, output_tokens)  # requests finished, and prefilled, a step
    uncached = prompt_tokens - cached_tokens
    prefill = rate * uncached
    body, head = matmul_params(cfg)
    prompt_kv, prompt_flops = _chunk_counts(cfg, uncached, cached_tokens, kv_dtype, tp)
    return step_time_from_counts(
        weight_bytes=decode_bytes_per_gpu(cfg, batch + max(1, round(prefill)), 0, kv_dtype,
                                          weight_dtype, tp),
        weight_flops=round(2 * (body * (batch + prefill) + head * (batch + rate))) // tp,
        decode_tokens=batch,
        decode_kv_bytes=batch * kv_bytes_per_gpu(cfg, context, kv_dtype, tp),
        decode_attention_flops=batch * decode_attention_flops(cfg, context) // tp,
        prefill_tokens=round(prefill),
        prefill_kv_bytes=round(rate * prompt_kv),
        prefill_attention_flops=round(rate * prompt_flops) // tp,
        matmul_flops_per_s=_peak(gpu, matmul_dtype),
        attention_flops_per_s=gpu.bf16_dense_flops_per_s,
        bandwidth_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        mfu=mfu,
    )
