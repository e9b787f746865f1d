"""The seats and decode speed a deployment scenario's KV pool allows.

:func:`assess` turns a :class:`~kvlib.capacity.scenario.Scenario` into a :class:`Capacity`:

- the KV pool on each GPU: ``ceil(u x M_CUDA) - W / tp - runtime``, with CUDA's
  total where recorded (:func:`kvlib.hardware.vllm_budget_bytes`), cut into vLLM's
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
  :func:`kvlib.bounds.decode_bytes_per_gpu` at the traffic's mean decode context
  (prompt + output / 2), FLOPs ``2 x active matmul params + attention`` a token;
- the joint bound: the decode rate caps throughput only if the GPUs can also
  prefill the prompts of the requests it finishes. Every request costs
  ``F_req = F_prefill(uncached prompt) + O x F_tok(T_bar)`` FLOPs, so ``g`` GPUs at
  a model FLOPs utilization ``mfu`` (:data:`kvlib.capacity.scenario.SERVING_MFU`)
  sustain at most ``O x mfu x g x F_peak / F_req`` output tokens a second, and

      tokens/s = min(decode bound, O x mfu x g x F_peak / F_req).

  The first term is the memory (KV-bound) regime, the second the compute regime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlib._validate import cdiv, require_int
from kvlib.bounds import attention_pairs, decode_bytes_per_gpu, matmul_params, prefill_flops
from kvlib.capacity.scenario import Scenario, ScenarioError, check_scenario
from kvlib.config import ModelConfig
from kvlib.hardware import vllm_budget_bytes
from kvlib.paging.prefix import cacheable_blocks
from kvlib.paging.vllm_pool import KVCacheGroup, KVPool, kv_pool
from kvlib.units import GiB
from kvlib.weights.params import weight_bytes

__all__ = [
    "Capacity",
    "assess",
    "cascade_attention_applies",
    "compute_share",
    "decode_flops_per_token",
    "held_blocks",
    "prefill_compute_share",
    "request_flops",
    "seats_with_shared_prefix",
]


@dataclass(frozen=True)
class Capacity:
    """What a scenario's pool holds and how fast it serves (per replica unless said)."""

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
    request_flops: int | None = None  # prefill (uncached part) + decode of one request
    notes: tuple[str, ...] = field(default=())

    @property
    def starts(self) -> bool:
        """Whether vLLM starts: one request of ``max_model_len`` must fit in the pool."""
        return self.guaranteed_seats >= 1

    @property
    def decode_tokens_per_s(self) -> float:
        """The decode steps' bound, every replica: ``replicas x batch / step_s``."""
        return self.scenario.replicas * self.batch / self.step_s

    @property
    def compute_tokens_per_s(self) -> float | None:
        """Output tokens/s the GPUs' arithmetic sustains, prefill included:
        ``O x mfu x gpus x F_peak / F_req`` (None where kvlib cannot count the FLOPs)."""
        if self.request_flops is None:
            return None
        s = self.scenario
        flops_per_s = s.mfu * s.gpus * s.gpu.bf16_dense_flops_per_s
        return s.output_tokens * flops_per_s / self.request_flops

    @property
    def tokens_per_s(self) -> float:
        """The joint bound: ``min(decode bound, compute bound)``, every replica."""
        compute, decode = self.compute_tokens_per_s, self.decode_tokens_per_s
        return decode if compute is None else min(decode, compute)

    @property
    def bound_by(self) -> str:
        """``"memory"`` when the decode steps' bound binds (the KV-bound regime),
        ``"compute"`` when prefill and decode FLOPs at ``mfu`` do."""
        compute = self.compute_tokens_per_s
        return "compute" if compute is not None and compute < self.decode_tokens_per_s else "memory"

    @property
    def tokens_per_s_per_sequence(self) -> float:
        """One sequence's decode speed at the joint bound (``1 / step_s`` in the memory regime)."""
        return self.tokens_per_s / (self.scenario.replicas * self.batch)

    @property
    def total_seats(self) -> int:
        """Seats over every replica."""
        return self.scenario.replicas * self.seats


def held_blocks(groups: tuple[KVCacheGroup, ...], tokens: int) -> int:
    """Blocks a paged engine holds for one sequence of ``tokens``, summed over its groups
    (each kind's :meth:`~kvlib.specs.CacheSpec.held_blocks`: ``cdiv(T, B)`` for full
    attention, at most ``cdiv(W - 1, B) + 1`` in a window, ``cdiv(C, B)`` in a chunk)."""
    require_int(tokens, "tokens", 1)
    return sum(group.spec.held_blocks(tokens, group.block_size) for group in groups)


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
        attention += keys * spec.decode_flops_per_key(cfg.num_attention_heads, cfg.head_dim)
    return 2 * (body + head) + attention


def _cached_prefill(cfg: ModelConfig, cached_tokens: int) -> int:
    """FLOPs a prefix-cache hit skips: the cached tokens' weights and their own attention
    (the rest of the prompt still attends to them)."""
    if cached_tokens == 0:
        return 0
    done = prefill_flops(cfg, cached_tokens)
    return done.weights + done.attention


def request_flops(s: Scenario, cached_tokens: int = 0) -> int | None:
    """FLOPs one request costs: its prompt's prefill less ``cached_tokens`` read from the
    prefix cache (:func:`kvlib.bounds.prefill_flops`), plus ``O`` decode tokens at the mean
    context (:func:`decode_flops_per_token`). None where kvlib cannot count a layer's
    attention."""
    per_token = decode_flops_per_token(s.model, s.decode_context_tokens)
    if per_token is None:
        return None
    try:
        prefill = prefill_flops(s.model, s.prompt_tokens).total
    except ValueError:
        return None
    return prefill - _cached_prefill(s.model, cached_tokens) + s.output_tokens * per_token


def cascade_attention_applies(
    common_prefix_tokens: int,
    num_requests: int,
    num_query_heads: int,
    num_kv_heads: int,
    num_sms: int,
    *,
    windowed: bool = False,
    all_decode: bool = True,
) -> bool:
    """Whether vLLM v1's FlashAttention backend reads a shared prefix once per step.

    Transcribes ``use_cascade_attention`` in ``vllm/v1/attention/backends/flash_attn.py``:
    no for a common prefix under 256 tokens, fewer than 8 requests, or sliding-window
    (or ALiBi, chunked-local) attention; otherwise yes unless FlashDecoding would be used
    (grouped queries, every request decoding one token), in which case a wave count
    decides: cascade runs ``H x cdiv(n, 128)`` CTAs over ``cdiv(prefix, 128)`` tiles,
    FlashDecoding ``n x H_kv x cdiv(H / H_kv, 128) x tiles`` CTAs, each over ``num_sms``;
    the fewer waves wins. The heuristic runs only where ``disable_cascade_attn`` is False:
    True by default since vLLM PR #36318 (March 2026), so a deployment opts in.
    """
    require_int(common_prefix_tokens, "common_prefix_tokens")
    require_int(num_requests, "num_requests")
    require_int(num_query_heads, "num_query_heads", 1)
    require_int(num_kv_heads, "num_kv_heads", 1)
    require_int(num_sms, "num_sms", 1)
    if common_prefix_tokens < 256 or windowed or num_requests < 8:
        return False
    queries_per_kv = num_query_heads // num_kv_heads
    if not (queries_per_kv > 1 and all_decode):
        return True
    tiles = cdiv(common_prefix_tokens, 128)
    cascade_time = cdiv(num_query_heads * cdiv(num_requests, 128), num_sms) * tiles
    flash_ctas = num_requests * num_kv_heads * cdiv(queries_per_kv, 128) * tiles
    return cascade_time < cdiv(flash_ctas, num_sms)


def prefill_compute_share(cap: Capacity) -> float:
    """Share of the GPUs' dense bf16 peak the prompts' prefill takes at ``cap.tokens_per_s``.

    Requests finish at ``R / output_tokens`` a second; each prefills its prompt tokens
    not read from the prefix cache, ``F_pre`` FLOPs (:func:`kvlib.bounds.prefill_flops`),
    on ``tp x replicas`` GPUs: ``(R / out) x F_pre / (gpus x F_peak)``. At the joint
    bound it never exceeds the scenario's ``mfu``.
    """
    s = cap.scenario
    cached = cap.shared_blocks * s.block_size
    flops = prefill_flops(s.model, s.prompt_tokens).total - _cached_prefill(s.model, cached)
    requests_per_s = cap.tokens_per_s / s.output_tokens
    return requests_per_s * flops / (s.gpus * s.gpu.bf16_dense_flops_per_s)


def compute_share(cap: Capacity) -> float | None:
    """Share of the arithmetic the scenario's ``mfu`` allows that its traffic uses:
    ``(R / O) x F_req / (mfu x gpus x F_peak)``, 1 in the compute regime, below 1 in the
    memory (KV-bound) regime. None where kvlib cannot count the FLOPs."""
    if cap.request_flops is None:
        return None
    s = cap.scenario
    requests_per_s = cap.tokens_per_s / s.output_tokens
    return requests_per_s * cap.request_flops / (s.mfu * s.gpus * s.gpu.bf16_dense_flops_per_s)


def assess(s: Scenario) -> Capacity:
    """The pool, seats, batch and decode speed of scenario ``s`` (see the module docstring)."""
    check_scenario(s)
    cfg, notes = s.model, []
    weights = cdiv(weight_bytes(cfg, s.weight_dtype), s.tp)
    budget = vllm_budget_bytes(s.gpu, s.gpu_memory_utilization)
    kv_memory = budget - weights - s.runtime_bytes_per_gpu
    if kv_memory <= 0:
        raise ScenarioError(
            f"{cfg.name}'s weights ({weights / GiB:.1f} GiB per GPU at tp={s.tp}) and the "
            f"runtime ({s.runtime_bytes_per_gpu / GiB:.1f} GiB) do not fit in "
            f"{s.gpu_memory_utilization} x {s.gpu.name}: raise tp or quantize the weights"
        )
    pool = kv_pool(cfg, kv_memory, max_model_len=s.engine_max_len, block_size=s.block_size,
                   kv_dtype=s.kv_dtype, tp=s.tp)
    per_sequence = held_blocks(pool.groups, s.sequence_tokens)
    shared = 0
    if s.prefix_caching and s.shared_prefix_tokens:
        if len(pool.groups) > 1 or pool.groups[0].spec.cap_tokens is not None:
            notes.append("prefix sharing is modelled for full-attention models only: not applied")
        else:
            shared = cacheable_blocks(s.shared_prefix_tokens, s.prompt_tokens, s.block_size)
    seats = seats_with_shared_prefix(pool.num_blocks, per_sequence, shared)
    guaranteed = pool.num_blocks // pool.blocks_per_request
    wanted = cdiv(s.concurrency, s.replicas)
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
    step_bytes = decode_bytes_per_gpu(cfg, batch, t, s.kv_dtype, s.weight_dtype, s.tp)
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
        request_flops=request_flops(s, shared * s.block_size),
        notes=tuple(notes),
    )
