"""The seats and decode speed a deployment scenario's KV pool allows.

A :class:`~kvlib.capacity.scenario.Scenario` (defined in :mod:`kvlib.capacity.scenario` with
:class:`~kvlib.capacity.scenario.ScenarioError`, both importable from here) states the
model, the GPU, the parallelism, the precisions, the engine's limits and the
traffic. :func:`assess` turns it into a :class:`Capacity`:

- the KV pool on each GPU: ``u x M_GPU - W / tp - runtime``, cut into vLLM's
  blocks (:func:`kvlib.paging.vllm_pool.kv_pool`);
- ``guaranteed_seats``: sequences the pool holds when every one reaches
  ``max_model_len`` (vLLM's "Maximum concurrency" line, rounded down; what a
  scheduler that reserves each request's maximum admits, such as
  TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` policy);
- ``seats``: sequences a paged engine holds at the traffic's full length
  (prompt + output), each holding only the blocks its tokens fill (a sliding
  layer keeps the blocks of its window, vLLM's ``SlidingWindowManager``);
  with prefix caching the shared prompt's full blocks are held once;
- the decode batch ``min(concurrency, seats, max_num_seqs)`` and its speed from
  the roofline of one step: ``max(bytes / BW, FLOPs / F)`` per GPU, bytes from
  :func:`kvlib.bounds.decode_step_bytes` at the traffic's mean decode context
  (prompt + output / 2), FLOPs ``2 x active matmul params + attention`` a token.

The remedies (each a changed scenario, ranked by what it costs) are in
:mod:`kvlib.capacity.remedies`; the price of the tokens/s, in :mod:`kvlib.capacity.crossover`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlib._validate import require_int
from kvlib.bounds import attention_pairs, decode_step_bytes, matmul_params, prefill_flops
from kvlib.capacity.scenario import Scenario, ScenarioError, check_scenario
from kvlib.config import ModelConfig
from kvlib.paging.prefix import cacheable_blocks
from kvlib.paging.vllm_pool import KVCacheGroup, KVPool, kv_pool
from kvlib.specs import MLALatent
from kvlib.units import GiB
from kvlib.weights.params import weight_bytes

__all__ = [
    "Capacity",
    "Scenario",
    "ScenarioError",
    "assess",
    "decode_flops_per_token",
    "held_blocks",
    "prefill_compute_share",
    "seats_with_shared_prefix",
]


@dataclass(frozen=True)
class Capacity:
    """What a scenario's pool holds and how fast its batch decodes (per replica unless said)."""

    scenario: Scenario
    pool: KVPool  # one GPU's pool, as vLLM builds and logs it
    weight_bytes_per_gpu: int
    guaranteed_seats: int  # every sequence at max_model_len
    blocks_per_sequence: int  # held at the traffic's full length (shared blocks excluded)
    shared_blocks: int  # the system prompt's full blocks, held once (prefix caching)
    seats: int  # sequences at the traffic's full length
    batch: int  # sequences decoding together
    limited_by: str  # "KV cache", "max_num_seqs" or "traffic"
    step_bytes_per_gpu: int
    step_s: float
    compute_utilization: float | None  # FLOP/s used / bf16 dense peak, during decode
    notes: tuple[str, ...] = field(default=())

    @property
    def starts(self) -> bool:
        """Whether vLLM starts: one request of ``max_model_len`` must fit in the pool."""
        return self.guaranteed_seats >= 1

    @property
    def tokens_per_s_per_sequence(self) -> float:
        """One sequence's decode speed: one token a step."""
        return 1.0 / self.step_s

    @property
    def tokens_per_s(self) -> float:
        """Every replica's batch together: ``replicas x batch / step_s``."""
        return self.scenario.replicas * self.batch / self.step_s

    @property
    def total_seats(self) -> int:
        """Seats over every replica."""
        return self.scenario.replicas * self.seats


def held_blocks(groups: tuple[KVCacheGroup, ...], tokens: int) -> int:
    """Blocks a paged engine holds for one sequence of ``tokens``, summed over its groups.

    Full attention (and MLA): ``cdiv(T, B)``. A sliding layer keeps ``W - 1`` tokens,
    which straddle at most ``cdiv(W - 1, B) + 1`` blocks (vLLM frees the rest,
    ``SlidingWindowManager.remove_skipped_blocks``); a chunked-local layer only the
    current chunk's, at most ``cdiv(C, B)``.
    """
    require_int(tokens, "tokens", 1)
    return sum(group.held_blocks(tokens) for group in groups)


def seats_with_shared_prefix(pool_blocks: int, blocks_per_sequence: int, shared_blocks: int) -> int:
    """Sequences of ``blocks_per_sequence`` blocks whose first ``shared_blocks`` are one copy.

    ``(pool - shared) // (per_sequence - shared)``; without sharing, ``pool // per_sequence``.
    """
    require_int(pool_blocks, "pool_blocks")
    require_int(blocks_per_sequence, "blocks_per_sequence", 1)
    require_int(shared_blocks, "shared_blocks")
    if shared_blocks >= blocks_per_sequence:
        raise ValueError("shared_blocks must leave each sequence at least one block of its own")
    if pool_blocks < shared_blocks:
        return 0
    return (pool_blocks - shared_blocks) // (blocks_per_sequence - shared_blocks)


def decode_flops_per_token(cfg: ModelConfig, context_tokens: int) -> int | None:
    """FLOPs one decode token costs at a context of ``T`` cached tokens.

    ``2 x (active matmul params + LM head)`` for the weights (:func:`kvlib.bounds.matmul_params`)
    plus attention over the keys each layer sees (``min(T + 1, W)`` in a window):
    ``2 x H x (d_qk + d_v)`` a key. An MLA layer decodes on the absorbed path, its
    queries meeting the latent itself: ``2 x H x (2 r + d_rope)`` a key (``r`` the
    ``kv_lora_rank``). None for layers whose attention kvlib does not count (linear
    attention, top-k sparse MLA).
    """
    require_int(context_tokens, "context_tokens")
    body, head = matmul_params(cfg)
    attention = 0
    for spec in cfg.layers:
        try:
            keys = attention_pairs(spec, context_tokens + 1) - attention_pairs(spec, context_tokens)
        except ValueError:
            return None
        if isinstance(spec, MLALatent):
            per_key = spec.num_heads * 2 * (2 * spec.kv_lora_rank + spec.qk_rope_head_dim)
        else:
            per_key = cfg.num_attention_heads * 2 * (2 * cfg.head_dim)
        attention += keys * per_key
    return 2 * (body + head) + attention


def prefill_compute_share(cap: Capacity) -> float:
    """Share of the GPUs' dense bf16 peak the prompts' prefill needs at ``cap``'s decode rate.

    Requests finish at ``R / output_tokens`` a second (``R`` = ``cap.tokens_per_s``);
    each prefills its prompt tokens not read from the prefix cache,
    ``F_pre`` FLOPs (:func:`kvlib.bounds.prefill_flops`), on ``tp x replicas`` GPUs:
    ``(R / out) x F_pre / (gpus x F_peak)``. :func:`assess` rates the decode steps
    only; this is the arithmetic they leave out. Near or above 1, the GPUs cannot
    sustain the decode rate and prefill its prompts too.
    """
    s = cap.scenario
    flops = prefill_flops(s.model, s.prompt_tokens).total
    if cap.shared_blocks:  # the cached prefix's own weights and attention are skipped;
        # the rest of the prompt still attends to it
        done = prefill_flops(s.model, s.shared_prefix_tokens)
        flops -= done.weights + done.attention
    requests_per_s = cap.tokens_per_s / s.output_tokens
    return requests_per_s * flops / (s.gpus * s.gpu.bf16_dense_flops_per_s)


def assess(s: Scenario) -> Capacity:
    """The pool, seats, batch and decode speed of scenario ``s`` (see the module docstring)."""
    check_scenario(s)
    cfg, notes = s.model, []
    weights = -(-weight_bytes(cfg, s.weight_dtype) // s.tp)
    budget = int(s.gpu.memory_bytes * s.gpu_memory_utilization)
    kv_memory = budget - weights - s.runtime_bytes_per_gpu
    if kv_memory <= 0:
        raise ScenarioError(
            f"{cfg.name}'s weights ({weights / GiB:.1f} GiB per GPU at tp={s.tp}) and the "
            f"runtime ({s.runtime_bytes_per_gpu / GiB:.1f} GiB) do not fit in "
            f"{s.gpu_memory_utilization} x {s.gpu.name}: raise tp or quantize the weights"
        )
    pool = kv_pool(cfg, kv_memory, max_model_len=s.engine_max_len, block_size=s.block_size,
                   kv_dtype=s.kv_dtype, tp=s.tp)  # fmt: skip
    per_sequence = held_blocks(pool.groups, s.sequence_tokens)
    shared = 0
    if s.prefix_caching and s.shared_prefix_tokens:
        if len(pool.groups) > 1 or pool.groups[0].kind != "full":
            notes.append("prefix sharing is modelled for full-attention models only: not applied")
        else:
            shared = cacheable_blocks(s.shared_prefix_tokens, s.prompt_tokens, s.block_size)
    seats = seats_with_shared_prefix(pool.num_blocks, per_sequence, shared)
    guaranteed = pool.num_blocks // pool.blocks_per_request
    wanted = -(-s.concurrency // s.replicas)
    batch = min(wanted, seats, s.max_num_seqs)
    limited_by = "traffic"
    if batch < wanted:
        limited_by = "KV cache" if seats <= s.max_num_seqs else "max_num_seqs"
    if batch == 0:
        raise ScenarioError(
            f"not one sequence of {s.sequence_tokens:,} tokens fits the pool of "
            f"{pool.pool_tokens:,} tokens: raise tp, quantize, or shorten the traffic"
        )
    t = s.decode_context_tokens
    step_bytes = decode_step_bytes(cfg, batch, t, s.kv_dtype, s.weight_dtype, s.tp)
    flops = decode_flops_per_token(cfg, t)
    memory_s = step_bytes / s.gpu.hbm_bandwidth_bytes_per_s
    step_s, utilization = memory_s, None
    if flops is not None:
        compute_s = batch * flops / s.tp / s.gpu.bf16_dense_flops_per_s
        step_s = max(memory_s, compute_s)
        utilization = compute_s / step_s
    return Capacity(
        scenario=s,
        pool=pool,
        weight_bytes_per_gpu=weights,
        guaranteed_seats=guaranteed,
        blocks_per_sequence=per_sequence - shared,
        shared_blocks=shared,
        seats=seats,
        batch=batch,
        limited_by=limited_by,
        step_bytes_per_gpu=step_bytes,
        step_s=step_s,
        compute_utilization=utilization,
        notes=tuple(notes),
    )
