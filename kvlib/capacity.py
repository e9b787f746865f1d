"""A deployment scenario, and the seats and decode speed its KV pool allows.

A :class:`Scenario` states everything the arithmetic needs: the model, the GPU,
the tensor-parallel degree and replicas, the weight and cache precisions, the
engine's maximum context (``max_model_len``; vLLM defaults it to the model's
``max_position_embeddings``) against the context the product needs, the traffic
(prompt and output tokens, a shared system prompt, the concurrency it keeps in
flight) and the engine's limits. :func:`assess` turns it into a :class:`Capacity`:

- the KV pool on each GPU: ``u x M_GPU - W / tp - runtime``, cut into vLLM's
  blocks (:func:`kvlib.kvpool.kv_pool`);
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
  :func:`kvlib.deploy.decode_step_bytes` at the traffic's mean decode context
  (prompt + output / 2), FLOPs ``2 x active matmul params + attention`` a token.

The remedies (each a changed scenario, ranked by what it costs) are in
:mod:`kvlib.remedies`; the price of the tokens/s, in :mod:`kvlib.costs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlib.checks import require_fraction, require_int
from kvlib.config import ModelConfig
from kvlib.deploy import (
    attention_pairs,
    decode_step_bytes,
    matmul_params,
    valid_tp_degrees,
)
from kvlib.dtypes import check_dtype
from kvlib.hardware import GPUSpec
from kvlib.kvpool import KVCacheGroup, KVPool, kv_pool
from kvlib.params import weight_bytes
from kvlib.prefix import cacheable_blocks
from kvlib.specs import MLALatent
from kvlib.units import GiB

__all__ = [
    "Capacity",
    "Scenario",
    "ScenarioError",
    "assess",
    "decode_flops_per_token",
    "held_blocks",
    "seats_with_shared_prefix",
]

# vLLM's --max-num-seqs default for years; recent API servers pick 1,024 on 70 GiB+ cards.
VLLM_MAX_NUM_SEQS = 256


class ScenarioError(ValueError):
    """A scenario that cannot be served as stated; the message names the field and the fix."""


@dataclass(frozen=True)
class Scenario:
    """One deployment and its traffic. ``weight_dtype=None`` sizes the checkpoint as shipped;
    ``max_model_len=None`` is the engine's default, the model's ``max_position_embeddings``."""

    model: ModelConfig
    gpu: GPUSpec
    prompt_tokens: int
    output_tokens: int
    concurrency: int  # sequences the traffic keeps in flight (arrival rate x latency)
    needed_context_tokens: int  # the longest prompt + output the product accepts
    max_model_len: int | None = None
    tp: int = 1
    replicas: int = 1
    weight_dtype: str | None = None
    kv_dtype: str = "bf16"
    shared_prefix_tokens: int = 0  # a system prompt every request starts with
    prefix_caching: bool = False
    gpu_memory_utilization: float = 0.9
    runtime_bytes_per_gpu: int = 2 * GiB  # activations, CUDA graphs, context: assumed
    block_size: int = 16
    max_num_seqs: int = VLLM_MAX_NUM_SEQS

    @property
    def engine_max_len(self) -> int:
        """``max_model_len`` as the engine runs it (the model's maximum when not set)."""
        if self.max_model_len is not None:
            return self.max_model_len
        if self.model.max_position_embeddings is None:
            raise ScenarioError(
                f"{self.model.name}'s config gives no max_position_embeddings: "
                "set max_model_len explicitly"
            )
        return self.model.max_position_embeddings

    @property
    def gpus(self) -> int:
        """GPUs the deployment rents: ``tp x replicas``."""
        return self.tp * self.replicas

    @property
    def sequence_tokens(self) -> int:
        """A request's full length: prompt + output."""
        return self.prompt_tokens + self.output_tokens

    @property
    def decode_context_tokens(self) -> int:
        """Mean context over a request's decode steps: prompt + output / 2."""
        return self.prompt_tokens + self.output_tokens // 2


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


def _check(s: Scenario) -> None:
    """Refuse a scenario that no engine would run as stated, naming the field."""
    for name in ("prompt_tokens", "output_tokens", "concurrency", "needed_context_tokens",
                 "tp", "replicas", "block_size", "max_num_seqs"):  # fmt: skip
        require_int(getattr(s, name), name, 1)
    require_int(s.shared_prefix_tokens, "shared_prefix_tokens")
    require_int(s.runtime_bytes_per_gpu, "runtime_bytes_per_gpu")
    require_fraction(s.gpu_memory_utilization, "gpu_memory_utilization")
    check_dtype(s.kv_dtype)
    limit = s.model.max_position_embeddings
    if s.max_model_len is not None:
        require_int(s.max_model_len, "max_model_len", 1)
        if limit is not None and s.max_model_len > limit:
            raise ScenarioError(
                f"max_model_len ({s.max_model_len:,}) exceeds {s.model.name}'s "
                f"max_position_embeddings ({limit:,}): the model was not trained that long"
            )
    if limit is not None and s.needed_context_tokens > limit:
        raise ScenarioError(
            f"needed_context_tokens ({s.needed_context_tokens:,}) exceeds {s.model.name}'s "
            f"max_position_embeddings ({limit:,}): choose a model with a longer context"
        )
    if s.needed_context_tokens > s.engine_max_len:
        raise ScenarioError(
            f"needed_context_tokens ({s.needed_context_tokens:,}) exceeds max_model_len "
            f"({s.engine_max_len:,}): the engine would refuse the product's longest requests"
        )
    if s.sequence_tokens > s.needed_context_tokens:
        raise ScenarioError(
            f"prompt_tokens + output_tokens ({s.sequence_tokens:,}) exceeds "
            f"needed_context_tokens ({s.needed_context_tokens:,}): raise the need"
        )
    if s.shared_prefix_tokens > s.prompt_tokens:
        raise ScenarioError(
            f"shared_prefix_tokens ({s.shared_prefix_tokens:,}) exceeds prompt_tokens "
            f"({s.prompt_tokens:,}): the shared prefix is part of the prompt"
        )
    if s.tp not in valid_tp_degrees(s.model, max_tp=s.tp):
        raise ScenarioError(
            f"tp={s.tp} does not split {s.model.name}'s {s.model.num_attention_heads} "
            f"attention heads: use one of {valid_tp_degrees(s.model, max_tp=max(s.tp, 8))}"
        )


def held_blocks(groups: tuple[KVCacheGroup, ...], tokens: int) -> int:
    """Blocks a paged engine holds for one sequence of ``tokens``, summed over its groups.

    Full attention (and MLA): ``cdiv(T, B)``. A sliding layer keeps ``W - 1`` tokens,
    which straddle at most ``cdiv(W - 1, B) + 1`` blocks (vLLM frees the rest,
    ``SlidingWindowManager.remove_skipped_blocks``); a chunked-local layer only the
    current chunk's, at most ``cdiv(C, B)``.
    """
    require_int(tokens, "tokens", 1)
    total = 0
    for group in groups:
        blocks = -(-tokens // group.block_size)
        window = group.window_tokens
        if group.kind == "sliding" and window is not None:
            blocks = min(blocks, -(-(window - 1) // group.block_size) + 1)
        elif group.kind == "chunked" and window is not None:
            blocks = min(blocks, -(-window // group.block_size))
        total += blocks
    return total


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

    ``2 x (active matmul params + LM head)`` for the weights (:func:`kvlib.deploy.matmul_params`)
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


def assess(s: Scenario) -> Capacity:
    """The pool, seats, batch and decode speed of scenario ``s`` (see the module docstring)."""
    _check(s)
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
