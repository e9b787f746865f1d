"""The remedies for a KV-bound deployment, each priced and ranked, the free ones first.

A deployment is KV-bound when its cache pool, not its compute, caps the batch: the
pool is full, requests wait or are preempted, and the batch that runs is too small
to keep the GPU's arithmetic busy. Each remedy below is a changed
:class:`kvlib.capacity.scenario.Scenario`; :func:`rank_remedies` assesses every one that
applies, each row's tokens/s from the step model at the scenario's MFU
(:attr:`kvlib.capacity.assessment.Capacity.tokens_per_s`), and orders them by what they
cost: a tier, and within a tier the order below (the cheaper and safer first), whatever
tokens/s they reach:

0. **free**: ``max_model_len`` set from the product's need, not the model's maximum,
   and a server-side default ``max_tokens``. Neither adds a seat at the traffic's length
   nor a token/s: they guard against runaway requests. Lowering ``max_model_len`` has a
   risk: vLLM answers HTTP 400 to a request whose prompt plus ``max_tokens`` exceeds it
   (``_validate_input``, ``vllm/entrypoints/openai/serving_engine.py`` at commit
   ``7ded96b3c73f``), so audit what clients send first;
1. **a flag and a check**: prefix caching (lossless, on by default in vLLM v1, for
   prompts that share their first tokens), a host tier (blocks the full GPU pool evicts
   kept in host memory and copied back when their conversation returns: where the
   traffic's prompts repeat a conversation's earlier turns), scheduler settings (a
   latency trade),
   a higher ``gpu_memory_utilization`` (an out-of-memory check), an fp8 KV cache (an
   accuracy check), fp8 (W8A8) weights (an accuracy check on the whole model);
2. **more GPUs**: a larger tensor-parallel degree, or another replica;
3. **a model change**: a model that caches fewer bytes per token (GQA, MLA,
   sliding windows), which needs a quality evaluation and, for an architecture of
   one's own, retraining.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from kvlib.bounds import valid_tp_degrees
from kvlib.capacity.assessment import Capacity, assess
from kvlib.capacity.scenario import Scenario, ScenarioError
from kvlib.config import ModelConfig
from kvlib.dtypes import DTYPE_BITS, require_dtype
from kvlib.sizing import kv_bytes

__all__ = ["COST_TIERS", "RAISED_GPU_MEMORY_UTILIZATION", "Ranking", "RemedyEffect",
           "rank_remedies"]

COST_TIERS = ("free", "a flag and a check", "more GPUs", "a model change")

# The gpu_memory_utilization the remedy raises vLLM's default 0.92 to: an example value,
# leaving about 5% of CUDA's total to other processes and activation peaks.
RAISED_GPU_MEMORY_UTILIZATION = 0.95


@dataclass(frozen=True)
class RemedyEffect:
    """One remedy: what it costs, what it changes and leaves, and the capacity after it."""

    name: str
    tier: int  # index into COST_TIERS
    cost: str
    changes: str
    leaves: str
    after: Capacity
    before: Capacity

    @property
    def cost_label(self) -> str:
        return COST_TIERS[self.tier]

    @property
    def block_seats_gained(self) -> int:
        """Sequences at the traffic's length the deployment holds in addition."""
        return self.after.total_block_seats - self.before.total_block_seats

    @property
    def guaranteed_seats_gained(self) -> int:
        """Sequences at ``max_model_len`` the pool holds in addition (per replica)."""
        return self.after.guaranteed_seats - self.before.guaranteed_seats

    @property
    def tokens_per_s_ratio(self) -> float:
        """Aggregate decode tokens/s after over before."""
        return self.after.tokens_per_s / self.before.tokens_per_s


@dataclass(frozen=True)
class Ranking:
    """The baseline, the remedies that apply (cheapest first), and those that do not, why."""

    baseline: Capacity
    remedies: tuple[RemedyEffect, ...]
    skipped: tuple[tuple[str, str], ...]


_Change = Callable[[Scenario], Scenario]


def _context_from_need(s: Scenario) -> Scenario:
    if s.engine_max_len <= s.needed_context_tokens:
        raise _NotApplicable("max_model_len is already the product's need")
    return dataclasses.replace(s, max_model_len=s.needed_context_tokens)


def _fp8_cache(s: Scenario) -> Scenario:
    if DTYPE_BITS[require_dtype(s.kv_dtype)] <= 8:
        raise _NotApplicable(f"the cache is already {s.kv_dtype}")
    return dataclasses.replace(s, kv_dtype="fp8")


def _prefix_caching(s: Scenario) -> Scenario:
    if s.prefix_caching:
        raise _NotApplicable("prefix caching is already on")
    if s.shared_prefix_tokens < s.block_size:
        raise _NotApplicable("the prompts share less than one block: nothing to share")
    if any(layer.cap_tokens is not None for layer in s.model.layers):
        raise _NotApplicable("prefix sharing is modelled for full-attention models only")
    return dataclasses.replace(s, prefix_caching=True)


def _host_tier(s: Scenario) -> Scenario:
    if s.host_tier:
        raise _NotApplicable("the host tier is already on")
    if s.returning_tokens < s.block_size:
        raise _NotApplicable("no conversation returns with a prefix of its own (returning_tokens "
                             "under one block): the GPU keeps the shared prompt")
    if any(layer.cap_tokens is not None for layer in s.model.layers):
        raise _NotApplicable("prefix sharing is modelled for full-attention models only")
    return dataclasses.replace(s, host_tier=True, prefix_caching=True)


def _default_max_tokens(s: Scenario) -> Scenario:
    return s  # the traffic's replies already stop at output_tokens: a guard, no new seat


def _memory_utilization(s: Scenario) -> Scenario:
    if s.gpu_memory_utilization >= RAISED_GPU_MEMORY_UTILIZATION:
        raise _NotApplicable(f"gpu_memory_utilization is already {s.gpu_memory_utilization}")
    return dataclasses.replace(s, gpu_memory_utilization=RAISED_GPU_MEMORY_UTILIZATION)


def _fp8_weights(s: Scenario) -> Scenario:
    if s.weight_dtype is None and s.model.quantization is not None:
        raise _NotApplicable(f"{s.model.name} ships quantized weights")
    if s.weight_dtype is not None and DTYPE_BITS[require_dtype(s.weight_dtype)] <= 8:
        raise _NotApplicable(f"the weights are already {s.weight_dtype}")
    if s.gpu.fp8_dense_flops_per_s is None:
        raise _NotApplicable(f"{s.gpu.name} has no fp8 tensor cores")
    return dataclasses.replace(s, weight_dtype="fp8", matmul_dtype="fp8")


def _scheduler(s: Scenario) -> Scenario:
    return dataclasses.replace(s, max_num_seqs=max(s.max_num_seqs, s.concurrency))


def _more_tp(s: Scenario) -> Scenario:
    larger = [tp for tp in valid_tp_degrees(s.model, max_tp=8 * s.tp) if tp > s.tp]
    if not larger:
        raise _NotApplicable(f"no tensor-parallel degree above {s.tp} splits the heads")
    return dataclasses.replace(s, tp=larger[0])


def _replica(s: Scenario) -> Scenario:
    return dataclasses.replace(s, replicas=2 * s.replicas)


class _NotApplicable(Exception):
    """The remedy does not apply to this scenario (the message says why)."""


def _fewer_bytes(alternative: ModelConfig) -> _Change:
    def change(s: Scenario) -> Scenario:
        t = s.sequence_tokens
        if kv_bytes(alternative, t, s.kv_dtype) >= kv_bytes(s.model, t, s.kv_dtype):
            raise _NotApplicable(f"{alternative.name} caches no fewer bytes at {t:,} tokens")
        return dataclasses.replace(s, model=alternative)

    return change


def _catalogue(alternative: ModelConfig | None) -> list[tuple[str, int, str, str, str, _Change]]:
    """(name, tier, what it costs, what it changes, what it leaves, the change)."""
    entries: list[tuple[str, int, str, str, str, _Change]] = [
        ("max context from the product's need", 0,
         "one flag (--max-model-len); vLLM answers HTTP 400 to a request whose prompt plus "
         "max_tokens exceeds it: audit what clients send first",
         "guards against runaway requests: the longest sequence the pool must absorb, "
         "guaranteed seats, whether the engine starts, and the default max_tokens "
         "(max_model_len - prompt) of requests that set none",
         "a paged engine's seats at the traffic's real length, and tokens/s",
         _context_from_need),
        ("server-side default max_tokens", 0,
         "one flag (--override-generation-config '{\"max_new_tokens\": N}'): a cap on every "
         "reply, which clients that need longer replies must know",
         "a reply that never stops ends at N tokens instead of max_model_len - prompt",
         "seats and tokens/s at the traffic's real length", _default_max_tokens),
        ("prefix caching", 1,
         "one flag (on by default in vLLM v1), lossless; prompts that start with the same tokens",
         "the shared prompt's full blocks are held once and prefilled once",
         "decode reads, unless the attention kernel reads the shared prefix once "
         "(vLLM's cascade attention)", _prefix_caching),
        ("a host tier (KV offloading to host memory)", 1,
         "one flag (vLLM's --kv-offloading-size, in GiB of host memory, summed over the TP "
         "ranks) and host memory for the returning conversations' blocks; prefix caching on",
         "a returning conversation's own prefix copied back over PCIe instead of prefilled",
         "the GPU pool's seats, and the decodes' cache reads", _host_tier),
        ("scheduler settings", 1,
         "flags (max_num_seqs, max_num_batched_tokens, chunked prefill); a latency trade",
         "which requests run together, and how prefill chunks share a step with decodes",
         "memory (a smaller token budget only shrinks the profiled activation workspace); "
         "max_num_seqs past the seats only adds preemptions",
         _scheduler),
        (f"gpu_memory_utilization {RAISED_GPU_MEMORY_UTILIZATION}", 1,
         "one flag (--gpu-memory-utilization) and a check that nothing else on the GPU "
         "(another process, activation peaks) needs the memory: else out-of-memory errors",
         "the budget vLLM takes from CUDA's total, all of the increase going to the pool",
         "the weights, the runtime's share", _memory_utilization),
        ("fp8 KV cache", 1,
         "one flag (--kv-cache-dtype fp8) and an accuracy check with calibrated scales",
         "bytes per cached token (half of bf16): twice the pool tokens, half the cache read "
         "each step", "the weights (only the cache is quantized)", _fp8_cache),
        ("fp8 weights (W8A8)", 1,
         "one flag (--quantization fp8) and an accuracy check of the quantized model",
         "the weights' bytes (half of bf16): a larger pool, half the weight reads, the "
         "weight GEMMs on fp8 tensor cores", "the KV cache's bytes per token", _fp8_weights),
        ("more GPUs: tensor parallelism", 2,
         "more GPU-hours, and an all-reduce between GPUs every layer (not in the step time)",
         "weights and KV heads split over more GPUs: each pool grows by the weights it sheds",
         "an MLA latent, replicated on every GPU (it has no heads to split)", _more_tp),
        ("more GPUs: another replica", 2,
         "twice the GPU-hours",
         "seats and aggregate tokens/s double", "each sequence's decode speed", _replica),
    ]
    if alternative is not None:
        entries.append((
            f"a model with fewer KV bytes per token ({alternative.name})", 3,
            "a model change: quality evaluation, new weights, perhaps retraining",
            "bytes per cached token (GQA, MLA, sliding windows), and the weights",
            "the product's context need",
            _fewer_bytes(alternative),
        ))
    return entries


def rank_remedies(scenario: Scenario, alternative: ModelConfig | None = None) -> Ranking:
    """Assess each remedy on ``scenario`` (``alternative``: a model to switch to, if any) and
    rank them by cost: the tier, then the catalogue's order within it (cheaper and safer
    first), never by the tokens/s a remedy reaches."""
    baseline = assess(scenario)
    effects, skipped, orders = [], [], {}
    for order, (name, tier, cost, changes, leaves, change) in enumerate(_catalogue(alternative)):
        try:
            after = assess(change(scenario))
        except _NotApplicable as reason:
            skipped.append((name, str(reason)))
        except ScenarioError as reason:
            skipped.append((name, f"the changed deployment cannot run: {reason}"))
        else:
            effects.append(RemedyEffect(name, tier, cost, changes, leaves, after, baseline))
            orders[name] = order
    effects.sort(key=lambda e: (e.tier, orders[e.name]))
    return Ranking(baseline, tuple(effects), tuple(skipped))
