"""The seats and decode speed a deployment scenario's KV pool allows.

:func:`assess` turns a :class:`~kvlib.capacity.scenario.Scenario` into a :class:`Capacity`:

- the KV pool on each GPU: ``ceil(u x M_CUDA) - W_GPU - runtime`` (the weights on a GPU as
  vLLM places them, :func:`kvlib.bounds.weight_bytes_per_gpu`), with CUDA's
  total where recorded (:func:`kvlib.hardware.vllm_budget_bytes`), cut into vLLM's
  blocks (:func:`kvlib.paging.vllm_pool.kv_pool`);
- ``guaranteed_seats``: sequences the pool holds when every one reaches
  ``max_model_len`` (vLLM's "Maximum concurrency" line, rounded down; what a
  scheduler that reserves each request's maximum admits, such as
  TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` policy);
- ``block_seats``: sequences a paged engine holds at the traffic's full length
  (prompt + output), each holding only the blocks its tokens fill (a sliding
  layer keeps the blocks of its window, vLLM's ``SlidingWindowManager``);
  with prefix caching the shared prompt's full blocks are held once;
- the batch ``min(concurrency, seats, max_num_seqs, token-budget cap)`` and the time of
  the engine's mean step at that batch from the step model
  (:func:`kvlib.step.steady_state_step`): the ``B`` decodes at the traffic's mean context
  (prompt + output / 2) and, in the same step, the prompt tokens of the ``B / O``
  requests that replace those finishing (``C = B x uncached prompt / O``, chunked
  prefill under ``max_num_batched_tokens``). The step's operations add: weight GEMMs
  ``max(W / BW, 2 P (B + C) / F_eff)``, decode attention's cache reads, prefill
  attention's FLOPs, with ``F_eff = mfu x F_peak``
  (:data:`kvlib.capacity.scenario.SERVING_MFU`, an assumption);
- with a host tier (``host_tier``, prefix caching on), a returning conversation's own
  ``returning_tokens`` are copied back over PCIe 5.0 in whole blocks instead of prefilled:
  they leave the step's prompt tokens, and the ``B / O`` copies a step starts run beside
  its kernels (the step waits on them only where they take longer: ``bound_by`` "PCIe");
- tokens/s = ``replicas x B / t_step``: every row is reachable, its FLOP/s at most
  ``mfu x F_peak`` and its bytes/s at most the bandwidth (:meth:`kvlib.step.StepTime.reachable`);
- the same at full use (``full_use_tokens_per_s``): the batch the deployment reaches
  when demand fills it, ``min(seats, max_num_seqs, token-budget cap)``, the rate a cost
  comparison divides by.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvlib._validate import cdiv, require_int
from kvlib.bounds import matmul_params, prefill_flops, weight_bytes_per_gpu
from kvlib.capacity.scenario import Scenario, ScenarioError, check_scenario
from kvlib.config import ModelConfig
from kvlib.hardware import vllm_budget_bytes
from kvlib.paging.prefix import cacheable_blocks
from kvlib.paging.vllm_pool import KVCacheGroup, KVPool, kv_pool
from kvlib.step import StepTime, decode_attention_flops, steady_state_step
from kvlib.tiers.links import get_link
from kvlib.tiers.reload import reload_s
from kvlib.units import GiB

__all__ = [
    "Capacity",
    "assess",
    "budget_batch",
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
    held_blocks_per_sequence: int  # held at the traffic's full length (shared blocks excluded)
    shared_blocks: int  # the system prompt's full blocks, held once (prefix caching)
    block_seats: int  # sequences whose held blocks fit the pool, at the traffic's full length
    batch: int  # sequences decoding together
    limited_by: str  # "KV cache", "max_num_seqs", "token budget" or "traffic"
    step: StepTime  # the mean step at ``batch`` (one GPU)
    full_use_batch: int  # the batch when demand fills the deployment
    full_use_step: StepTime
    request_flops: int | None = None  # prefill (uncached part) + decode of one request
    reloaded_tokens: int = 0  # a request's prompt tokens copied back from the host tier
    reload_s_per_request: float = 0.0  # those copies' time over one GPU's PCIe link
    notes: tuple[str, ...] = field(default=())

    @property
    def starts(self) -> bool:
        """Whether vLLM starts: one request of ``max_model_len`` must fit in the pool."""
        return self.guaranteed_seats >= 1

    @property
    def cached_tokens(self) -> int:
        """A request's prompt tokens it does not prefill: the shared prefix's full blocks
        (prefix caching) and what the host tier copies back."""
        return self.shared_blocks * self.scenario.block_size + self.reloaded_tokens

    @property
    def step_s(self) -> float:
        """The mean step's time: its operations' times added, or, where longer, the host
        tier's copies for the requests it starts (a DMA copy runs beside the kernels)."""
        return max(self.step.total_s, self.reload_s_per_step)

    @property
    def reload_s_per_step(self) -> float:
        """The host tier's copies a mean step waits on at most: ``B / O`` requests start
        each step, each copying its reloaded tokens (``reload_s_per_request``)."""
        return self.batch / self.scenario.output_tokens * self.reload_s_per_request

    @property
    def step_bytes_per_gpu(self) -> int:
        """Bytes the mean step moves on one GPU: weights, the batch's caches, the prefill's."""
        return self.step.hbm_bytes

    @property
    def prefill_tokens_per_step(self) -> int:
        """Prompt tokens each step carries beside its decodes: ``B x uncached prompt / O``."""
        return self.step.prefill_tokens

    @property
    def tokens_per_s(self) -> float:
        """Output tokens a second, every replica: ``replicas x batch / step_s``."""
        return self.scenario.replicas * self.batch / self.step_s

    @property
    def full_use_tokens_per_s(self) -> float:
        """Output tokens a second when demand fills every seat the engine admits:
        ``replicas x full_use_batch / full-use step``."""
        copies_s = self.full_use_batch / self.scenario.output_tokens * self.reload_s_per_request
        return self.scenario.replicas * self.full_use_batch / max(self.full_use_step.total_s,
                                                                   copies_s)

    @property
    def full_use_limited_by(self) -> str:
        """What caps the full-use batch: ``"KV cache"``, ``"max_num_seqs"`` or
        ``"token budget"``."""
        return _binding(_caps(self.scenario, self.block_seats, self.cached_tokens))

    @property
    def bound_by(self) -> str:
        """``"memory"`` when the mean step's bytes at the bandwidth take longer than its
        FLOPs at ``mfu x F_peak`` (the KV-bound regime), else ``"compute"``; ``"PCIe"``
        where the host tier's copies take longer than the step."""
        return "PCIe" if self.reload_s_per_step > self.step.total_s else self.step.bound

    @property
    def compute_utilization(self) -> float:
        """FLOP/s of the mean step over the card's dense bf16 peak."""
        return self.step.flops_per_s / self.scenario.gpu.bf16_dense_flops_per_s

    @property
    def tokens_per_s_per_sequence(self) -> float:
        """One sequence's decode speed: ``1 / step_s``."""
        return 1 / self.step_s

    @property
    def total_block_seats(self) -> int:
        """Seats over every replica."""
        return self.scenario.replicas * self.block_seats


def held_blocks(groups: tuple[KVCacheGroup, ...], tokens: int) -> int:
    """Blocks a paged engine holds for one sequence of ``tokens``, summed over its groups
    (each kind's :meth:`~kvlib.specs.CacheSpec.held_blocks`: ``cdiv(T, B)`` for full
    attention, at most ``cdiv(W - 1, B) + 1`` in a window, ``cdiv(C, B)`` in a chunk)."""
    require_int(tokens, "tokens", 1)
    return sum(group.spec.held_blocks(tokens, group.block_size) for group in groups)


def seats_with_shared_prefix(
    pool_blocks: int, held_blocks_per_sequence: int, shared_blocks: int
) -> int:
    """Sequences of ``held_blocks_per_sequence`` blocks whose first ``shared_blocks`` are one copy.

    ``(pool - shared) // (per_sequence - shared)``; without sharing, ``pool // per_sequence``.
    """
    require_int(pool_blocks, "pool_blocks")
    require_int(held_blocks_per_sequence, "held_blocks_per_sequence", 1)
    require_int(shared_blocks, "shared_blocks")
    if shared_blocks >= held_blocks_per_sequence:
        raise ValueError("shared_blocks must leave each sequence at least one block of its own")
    if pool_blocks < shared_blocks:
        return 0
    return (pool_blocks - shared_blocks) // (held_blocks_per_sequence - shared_blocks)


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
    try:
        attention = decode_attention_flops(cfg, context_tokens)
    except ValueError:
        return None
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
    flops = (prefill_flops(s.model, s.prompt_tokens).total
             - _cached_prefill(s.model, cap.cached_tokens))
    requests_per_s = cap.tokens_per_s / s.output_tokens
    return requests_per_s * flops / (s.gpus * s.gpu.bf16_dense_flops_per_s)


def compute_share(cap: Capacity) -> float:
    """Share of the mean step the GPU spends on arithmetic at the scenario's ``mfu``: the
    step's FLOPs at ``mfu x F_peak`` over its time (:attr:`kvlib.step.StepTime.compute_s`).
    1 where every operation is compute-bound; well below 1 in the KV-bound regime, where
    the cache reads hold the step."""
    return cap.step.compute_s / cap.step.total_s


def budget_batch(s: Scenario, cached_tokens: int = 0) -> int:
    """The largest batch whose mean step fits the token budget: ``B + B x (P - cached) / O
    <= max_num_batched_tokens``, so ``B = floor(budget x O / (O + P - cached))`` (at least 1).
    vLLM's scheduler gives the running requests' decodes their tokens first and cuts the
    waiting prompts to what is left of ``max_num_batched_tokens``."""
    uncached = s.prompt_tokens - cached_tokens
    return max(1, s.max_num_batched_tokens * s.output_tokens // (s.output_tokens + uncached))


def _caps(s: Scenario, seats: int, cached_tokens: int) -> dict[str, int]:
    """The batch each limit allows: the pool's seats, ``max_num_seqs``, the token budget."""
    return {"KV cache": seats, "max_num_seqs": s.max_num_seqs,
            "token budget": budget_batch(s, cached_tokens)}


def _binding(caps: dict[str, int]) -> str:
    """The limit that binds (the pool's on a tie: vLLM preempts before it queues)."""
    return min(caps, key=lambda k: (caps[k], k != "KV cache"))


def _mean_step(s: Scenario, batch: int, cached_tokens: int) -> StepTime:
    """The scenario's mean step at ``batch`` (:func:`kvlib.step.steady_state_step`)."""
    return steady_state_step(
        s.model, s.gpu, batch, s.prompt_tokens, s.output_tokens, cached_tokens=cached_tokens,
        decode_context_tokens=s.decode_context_tokens, mfu=s.mfu, tp=s.tp,
        kv_dtype=s.kv_dtype, weight_dtype=s.weight_dtype, matmul_dtype=s.matmul_dtype,
    )


def _reloaded_tokens(s: Scenario, shared_blocks: int) -> int:
    """Prompt tokens a host tier copies back: the full blocks of the shared prefix and the
    conversation's returning tokens together, less the shared blocks the GPU pool keeps
    (``cacheable_blocks``: full blocks only, the prompt's last token always computed)."""
    if not (s.host_tier and s.prefix_caching and s.returning_tokens):
        return 0
    blocks = cacheable_blocks(s.shared_prefix_tokens + s.returning_tokens, s.prompt_tokens,
                              s.block_size)
    return (blocks - shared_blocks) * s.block_size


def _reload_s_per_request(s: Scenario, reloaded_tokens: int) -> float:
    """One request's host-tier copy: ``reloaded x KV bytes per token per GPU`` over PCIe 5.0
    x16 (:mod:`kvlib.tiers.links`; one link per GPU)."""
    if not reloaded_tokens:
        return 0.0
    return reload_s(s.model, reloaded_tokens, get_link("pcie5").bytes_per_s, tp=s.tp,
                    kv_dtype=s.kv_dtype)


def _reload_note(s: Scenario, batch: int, per_request_s: float,
                 step: StepTime) -> tuple[str, ...]:
    copy_s = batch / s.output_tokens * per_request_s
    if copy_s <= step.total_s:
        return ()
    return (f"the host tier's copies ({copy_s * 1e3:.2f} ms a step over PCIe) take longer "
            f"than the step's kernels ({step.total_s * 1e3:.2f} ms): PCIe bounds this row",)


def assess(s: Scenario) -> Capacity:
    """The pool, seats, batch and decode speed of scenario ``s`` (see the module docstring)."""
    check_scenario(s)
    cfg, notes = s.model, []
    weights = weight_bytes_per_gpu(cfg, s.tp, s.weight_dtype)
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
    shared, reloaded = 0, 0
    if s.prefix_caching and (s.shared_prefix_tokens or s.host_tier):
        if len(pool.groups) > 1 or pool.groups[0].spec.cap_tokens is not None:
            notes.append("prefix sharing is modelled for full-attention models only: not applied")
        else:
            shared = cacheable_blocks(s.shared_prefix_tokens, s.prompt_tokens, s.block_size)
            reloaded = _reloaded_tokens(s, shared)
    seats = seats_with_shared_prefix(pool.num_blocks, per_sequence, shared)
    guaranteed = pool.num_blocks // pool.blocks_per_request
    if seats == 0:
        raise ScenarioError(
            f"not one sequence of {s.sequence_tokens:,} tokens fits the pool of "
            f"{pool.pool_tokens:,} tokens: raise tp, quantize, or shorten the traffic"
        )
    cached = shared * s.block_size + reloaded
    copy_s = _reload_s_per_request(s, reloaded)
    caps = _caps(s, seats, cached)
    full_use = min(caps.values())
    wanted = cdiv(s.concurrency, s.replicas)
    batch = min(wanted, full_use)
    limited_by = "traffic" if batch == wanted else _binding(caps)
    try:
        step = _mean_step(s, batch, cached)
        full_step = step if full_use == batch else _mean_step(s, full_use, cached)
    except ValueError as err:
        raise ScenarioError(f"the step model cannot time {cfg.name}: {err}") from None
    return Capacity(
        scenario=s,
        pool=pool,
        weight_bytes_per_gpu=weights,
        guaranteed_seats=guaranteed,
        held_blocks_per_sequence=per_sequence - shared,
        shared_blocks=shared,
        block_seats=seats,
        batch=batch,
        limited_by=limited_by,
        step=step,
        full_use_batch=full_use,
        full_use_step=full_step,
        request_flops=request_flops(s, cached),
        reloaded_tokens=reloaded,
        reload_s_per_request=copy_s,
        notes=tuple(notes) + _reload_note(s, batch, copy_s, step),
    )
