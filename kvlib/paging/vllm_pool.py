"""vLLM's KV-pool arithmetic: pages, blocks in a memory budget, and its two start-up lines.

Followed from vLLM's v1 engine, read at commit ``001cabc1be16a59a70d720ed61a13b678c060a18``
of ``vllm-project/vllm``:

- ``vllm/v1/kv_cache_interface.py``: a layer's page is ``block_size x`` its bytes
  per token (``AttentionSpec.real_page_size_bytes``: ``2 x B x H_kv x d x b``;
  ``MLAAttentionSpec``: ``B x (kv_lora_rank + rope) x b``, no factor 2). A
  request budgets ``cdiv(max_model_len, B)`` pages of a full-attention layer
  (``FullAttentionSpec.max_memory_usage_bytes``),
  ``cdiv(min(W - 1 + max_num_batched_tokens, max_model_len), B) + 1`` of a
  sliding one (``SlidingWindowSpec``: +1 because the window may straddle a
  block boundary) and ``cdiv(min(chunk + max_num_batched_tokens, max_model_len), B)``
  of a chunked-local one (``ChunkedLocalAttentionSpec``).
- ``vllm/v1/core/kv_cache_utils.py``: ``get_kv_cache_groups`` puts every layer
  in one group when all specs are equal or all of one type (full attention
  and MLA count as one type); otherwise (hybrid models) it unifies page sizes
  by growing the block size of the smaller pages
  (``unify_kv_cache_spec_page_size``) and splits the layers into groups of
  equal size (``_get_kv_cache_groups_uniform_page_size``). A block id then
  spans ``group_size`` layer tensors, so ``num_blocks = memory // (page x
  group_size)`` (``get_num_blocks``); with one group of differing pages it is
  ``memory // sum of pages`` (``get_kv_cache_config_from_groups``).
- ``_report_kv_cache_config`` logs ``Maximum concurrency for {max_model_len:,}
  tokens per request: {num_blocks / blocks per request:.2f}x``
  (``get_max_concurrency_for_kv_cache_config``) and, before it, ``GPU KV cache
  size: {N:,} tokens``, where N changed in 2026 (vLLM PRs #38364 and #40694, after
  issue #40691 showed the old line on 0.19.0 for a hybrid model): it was
  ``num_blocks // num_groups x min block size`` at ``001cabc1be16`` and is
  ``int(max_concurrency x max_model_len)`` since (:func:`logged_pool_tokens`).
  The two agree for full attention with ``max_model_len`` a multiple of the
  block size; for a hybrid model the new figure is derived, and moves with
  ``max_model_len`` while the blocks stay the same.
- ``_check_enough_kv_cache_memory`` refuses to start, before any of this is
  logged, with a message that quotes ``estimate_max_model_len``: the longest
  ``max_model_len`` in ``[1, max_model_len]`` whose budget fits (a binary search
  over the same per-request memory), the figure a user reads to fix the launch
  (:attr:`KVPool.refusal_message`, :attr:`KVPool.estimated_max_model_len`).

Modelled: full, MLA, sliding-window and chunked-local layers, tensor
parallelism (each GPU's share of the KV heads), layers that reuse another
layer's cache (no pages of their own, as in vLLM). Not modelled: linear
attention / Mamba state pages (an error says so), ``num_gpu_blocks_override``,
context parallelism, and ``--disable-hybrid-kv-cache-manager`` (which pages
sliding layers like full ones). vLLM's block pool also keeps block 0 back as
a null block: the logged size counts it, its scheduler cannot use it.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import dataclass

from kvlib._validate import cdiv, require_int
from kvlib.config import ModelConfig
from kvlib.hardware import VLLM_GPU_MEMORY_UTILIZATION, GPUSpec, vllm_budget_bytes
from kvlib.specs import CacheSpec, vllm_group_spec

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "DEFAULT_VLLM_VERSION",
    "KVCacheGroup",
    "KVPool",
    "LayerPage",
    "blocks_per_request",
    "kv_cache_groups",
    "kv_memory_on_gpu",
    "kv_memory_range",
    "kv_pool",
    "layer_page_bytes",
    "layer_pages",
    "logged_pool_tokens",
    "parse_vllm_version",
    "unified_page_bytes",
    "uses_derived_pool_line",
]

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size on CUDA
# Chunked-prefill budget; vLLM's default depends on version, GPU and entry point
# (2,048 to 16,384 tokens). It only changes the budget of sliding/chunked layers.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192

# The release whose start-up lines kvlib prints unless asked for another; it logs
# "GPU KV cache size" as int(max_concurrency x max_model_len).
DEFAULT_VLLM_VERSION = "0.25.1"
# The first release taken to log that derived figure: 0.19.0 logs num_blocks // groups x
# block size (vLLM issue #40691, 2026-04-23), a 0.24.0 log the derived one (567,978
# tokens at 131,072 and 4.33x, not a whole number of blocks); the change landed after
# 0.19 was cut.
_DERIVED_LINE_SINCE = (0, 20, 0)
# V1 became vLLM's default engine in 0.8.0; before it, v0's worker refused a short
# cache with its own wording (raise_if_cache_size_invalid in vllm/worker/worker.py).
_V1_DEFAULT_SINCE = (0, 8, 0)
_CONSERVING_MEMORY = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"
_GIB = 1 << 30


@dataclass(frozen=True)
class LayerPage:
    """What vLLM's cache manager needs of one layer: its type and its page."""

    kind: str  # "full" (full attention or MLA), "sliding" or "chunked"
    span_tokens: int | None  # tokens a local layer attends over: W (sliding) or C (chunked)
    page_bytes: int  # one block of this layer, on one GPU
    block_size: int


def layer_page_bytes(spec: CacheSpec, block_size: int, kv_dtype: str, tp: int = 1) -> int:
    """One GPU's page of one layer: ``spec.page_bytes(B, dtype)`` times its TP share."""
    share = spec.page_bytes(block_size, kv_dtype) * spec.tp_share(tp)
    if share.denominator != 1:
        raise ValueError(f"tp={tp} does not split this layer's page into whole bytes")
    return int(share)


def layer_pages(
    cfg: ModelConfig, block_size: int = DEFAULT_BLOCK_SIZE, kv_dtype: str = "bf16", tp: int = 1
) -> list[LayerPage]:
    """Each paged layer of ``cfg``; layers reading another layer's cache have none."""
    require_int(block_size, "block_size", 1)
    require_int(tp, "tp", 1)
    pages = []
    for i, spec in enumerate(cfg.layers):
        try:
            page_type = spec.vllm_page_type()
        except ValueError as exc:  # a state vLLM pages in a way kvlib does not model
            raise ValueError(f"layer {i} of {cfg.name}: {exc}") from None
        if page_type is None:
            continue  # a layer reading another layer's cache
        page = layer_page_bytes(spec, block_size, kv_dtype, tp)
        pages.append(LayerPage(*page_type, page, block_size))
    if not pages:
        raise ValueError(f"{cfg.name} has no layer with a KV cache to page")
    return pages


@dataclass(frozen=True)
class KVCacheGroup:
    """Layers sharing one block table: ``num_layers`` real layers (padding not counted)."""

    kind: str
    span_tokens: int | None
    block_size: int
    page_bytes: int  # per layer
    num_layers: int

    @property
    def spec(self) -> CacheSpec:
        """A one-head layer of this group's kind: its block formulas are the group's."""
        return vllm_group_spec(self.kind, self.span_tokens)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """Blocks vLLM budgets one request of ``max_model_len`` tokens in this group
        (the kind's :meth:`~kvlib.specs.CacheSpec.vllm_blocks_per_request`)."""
        return self.spec.vllm_blocks_per_request(
            max_model_len, self.block_size, max_num_batched_tokens
        )


def kv_cache_groups(
    cfg: ModelConfig, block_size: int = DEFAULT_BLOCK_SIZE, kv_dtype: str = "bf16", tp: int = 1
) -> list[KVCacheGroup]:
    """The KV cache groups vLLM forms for ``cfg`` (``get_kv_cache_groups``)."""
    if isinstance(cfg, ModelConfig):  # frozen, so its groups can be kept
        return list(_cached_groups(cfg, block_size, kv_dtype, tp))
    return list(_kv_cache_groups(cfg, block_size, kv_dtype, tp))


def _kv_cache_groups(
    cfg: ModelConfig, block_size: int, kv_dtype: str, tp: int
) -> tuple[KVCacheGroup, ...]:
    pages = layer_pages(cfg, block_size, kv_dtype, tp)
    first = pages[0]
    if all(p == first for p in pages):
        return (KVCacheGroup(first.kind, first.span_tokens, block_size, first.page_bytes,
                             len(pages)),)
    if len({(p.kind, p.span_tokens) for p in pages}) == 1:
        # UniformTypeKVCacheSpecs: one group whose page is the sum of the layers' pages.
        total = sum(p.page_bytes for p in pages)
        return (KVCacheGroup(first.kind, first.span_tokens, block_size, total, 1),)
    # Mixed attention types: one page size for all, the smaller pages' block size grown.
    largest = max(p.page_bytes for p in pages)
    for p in pages:
        if largest % p.page_bytes:
            raise ValueError(
                f"page sizes {p.page_bytes} and {largest} B do not divide: vLLM cannot "
                "unify them by growing the block size"
            )
    by_type = Counter(
        (p.kind, p.span_tokens, p.block_size * (largest // p.page_bytes)) for p in pages
    )
    counts = by_type.values()
    # Pad the smaller type rather than split the larger when the counts are close.
    group_size = max(counts) if max(counts) < 1.5 * min(counts) else min(counts)
    return tuple(  # layers[i::num_groups] of each type, as vLLM assigns them
        KVCacheGroup(kind, window, block, largest, len(range(i, count, cdiv(count, group_size))))
        for (kind, window, block), count in by_type.items()
        for i in range(cdiv(count, group_size))
    )



# A report asks for the same groups several times (the pool, the page, the budget per
# request): worked out once per config, block size, dtype and tp.
_cached_groups = functools.lru_cache(maxsize=256)(_kv_cache_groups)

def parse_vllm_version(version: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a vLLM version string: ``0.19.0``, ``v0.19``,
    ``0.20.1rc1`` or ``0.11.0+cu129`` (a suffix after the numbers is ignored)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?([.+-]?[0-9A-Za-z.+-]*)", version.strip())
    if match is None:
        raise ValueError(
            f"vLLM version {version!r} is not MAJOR.MINOR[.PATCH]: give one such as "
            f"0.19.0 or {DEFAULT_VLLM_VERSION}"
        )
    major, minor, patch = match.group(1, 2, 3)
    return int(major), int(minor), int(patch or 0)


def uses_derived_pool_line(version: str) -> bool:
    """Whether vLLM ``version`` logs "GPU KV cache size" as ``int(concurrency x max_model_len)``."""
    return parse_vllm_version(version) >= _DERIVED_LINE_SINCE


def logged_pool_tokens(
    num_blocks: int,
    groups: tuple[KVCacheGroup, ...] | list[KVCacheGroup],
    max_concurrency: float,
    max_model_len: int,
    vllm_version: str = DEFAULT_VLLM_VERSION,
) -> int:
    """The N of "GPU KV cache size: N tokens" as ``vllm_version`` logs it.

    Since PRs #38364/#40694: ``int(max_concurrency x max_model_len)``, a figure derived
    from the concurrency; before: ``num_blocks // len(groups) x min block size``,
    whole blocks shared out among the groups. Equal for one full-attention group when
    ``max_model_len`` is a multiple of the block size.
    """
    if uses_derived_pool_line(vllm_version):
        return int(max_concurrency * max_model_len)
    return num_blocks // len(groups) * min(g.block_size for g in groups)


def _format_gib(n: int) -> str:
    """vLLM's ``format_gib``: ``round(bytes / GiB, 2)`` printed as a Python float."""
    return str(round(n / _GIB, 2))


@dataclass(frozen=True)
class KVPool:
    """The KV pool vLLM builds in ``kv_memory_bytes`` on each GPU, and what it logs."""

    kv_memory_bytes: int
    block_size: int
    max_model_len: int
    groups: tuple[KVCacheGroup, ...]
    block_bytes: int  # one block id across every layer on this GPU (a layer's page x layers)
    num_blocks: int  # vLLM's num_gpu_blocks
    pool_tokens: int  # "GPU KV cache size: N tokens", as vllm_version logs it
    blocks_per_request: int  # budget of one request of max_model_len tokens
    max_concurrency: float  # "Maximum concurrency for ... tokens per request: Yx"
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    vllm_version: str = DEFAULT_VLLM_VERSION

    @property
    def min_kv_memory_bytes(self) -> int:
        """Least memory vLLM accepts: one request of ``max_model_len`` must fit."""
        return self.blocks_per_request * self.block_bytes

    def budget_bytes(self, max_model_len: int) -> int:
        """KV memory one request of ``max_model_len`` tokens is budgeted (vLLM's
        ``max_memory_usage_bytes``): the blocks of every group, times the page."""
        blocks = sum(g.blocks_per_request(max_model_len, self.max_num_batched_tokens)
                     for g in self.groups)
        return blocks * self.block_bytes

    @property
    def estimated_max_model_len(self) -> int:
        """vLLM's ``estimate_max_model_len``: the largest length in ``[1, max_model_len]``
        whose budget fits this memory, by binary search; 0 when not even one token fits."""
        if self.budget_bytes(1) > self.kv_memory_bytes:
            return 0
        low, high, best = 1, self.max_model_len, 1
        while low <= high:
            mid = (low + high) // 2
            if self.budget_bytes(mid) <= self.kv_memory_bytes:
                best, low = mid, mid + 1
            else:
                high = mid - 1
        return best

    @property
    def refusal(self) -> str | None:
        """vLLM's whole message when it would refuse to start on this memory, else None.

        V1 (``_check_enough_kv_cache_memory`` in ``vllm/v1/core/kv_cache_utils.py``)
        requires memory left after the profile and room for one request of
        ``max_model_len`` (:attr:`min_kv_memory_bytes`), and names the length that
        would fit; v0 (releases before 0.8) compared ``max_model_len`` with the pool's
        whole blocks. Worded as :attr:`vllm_version` words it.
        """
        if parse_vllm_version(self.vllm_version) < _V1_DEFAULT_SINCE:
            return self._v0_refusal()
        if self.kv_memory_bytes <= 0:
            return (
                "No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine. See "
                f"{_CONSERVING_MEMORY} for more details."
            )
        needed = self.min_kv_memory_bytes
        if needed <= self.kv_memory_bytes:
            return None
        estimated = self.estimated_max_model_len
        estimate = (
            "Based on the available memory, the estimated maximum model length is "
            f"{estimated}. " if estimated > 0 else ""
        )
        return (  # "models's" is vLLM's spelling
            "To serve at least one request with the models's max seq len "
            f"({self.max_model_len}), ({_format_gib(needed)} GiB KV cache is needed, which "
            "is larger than the available KV cache memory "
            f"({_format_gib(self.kv_memory_bytes)} GiB). {estimate}Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            f"engine. See {_CONSERVING_MEMORY} for more details."
        )

    def _v0_refusal(self) -> str | None:
        if self.num_blocks <= 0:
            return (
                "No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            )
        stored = self.num_blocks * self.block_size
        if self.max_model_len <= stored:
            return None
        return (
            f"The model's max seq len ({self.max_model_len}) is larger than the maximum "
            f"number of tokens that can be stored in KV cache ({stored}). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine."
        )

    @property
    def startup_lines(self) -> tuple[str, str]:
        """The two lines vLLM logs, formatted as ``_report_kv_cache_config`` does."""
        return (
            f"GPU KV cache size: {self.pool_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
            f"{self.max_concurrency:.2f}x",
        )


def kv_pool(
    cfg: ModelConfig,
    kv_memory_bytes: int,
    *,
    max_model_len: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_dtype: str = "bf16",
    tp: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    vllm_version: str = DEFAULT_VLLM_VERSION,
) -> KVPool:
    """vLLM's pool for ``cfg`` in ``kv_memory_bytes`` of KV memory per GPU, with the
    start-up line ``vllm_version`` logs (:func:`logged_pool_tokens`)."""
    require_int(kv_memory_bytes, "kv_memory_bytes")
    require_int(max_model_len, "max_model_len", 1)
    require_int(max_num_batched_tokens, "max_num_batched_tokens", 1)
    parse_vllm_version(vllm_version)
    groups = kv_cache_groups(cfg, block_size, kv_dtype, tp)
    page = groups[0].page_bytes * max(g.num_layers for g in groups)
    num_blocks = max(kv_memory_bytes // page, 0)
    per_request = sum(g.blocks_per_request(max_model_len, max_num_batched_tokens) for g in groups)
    concurrency = num_blocks / per_request
    return KVPool(
        kv_memory_bytes=kv_memory_bytes,
        block_size=block_size,
        max_model_len=max_model_len,
        groups=tuple(groups),
        block_bytes=page,
        num_blocks=num_blocks,
        pool_tokens=logged_pool_tokens(num_blocks, groups, concurrency, max_model_len,
                                       vllm_version),
        blocks_per_request=per_request,
        max_concurrency=concurrency,
        max_num_batched_tokens=max_num_batched_tokens,
        vllm_version=vllm_version,
    )


def kv_memory_on_gpu(
    gpu: GPUSpec,
    weight_bytes_per_gpu: int,
    *,
    runtime_bytes: int = 0,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> int:
    """KV memory vLLM gives one GPU: ``ceil(u x total) - weights - runtime``.

    ``total`` is CUDA's (``torch.cuda.mem_get_info``), as vLLM's ``request_memory``
    multiplies it (``vllm/v1/worker/utils.py``), or the driver's where no CUDA
    reading is recorded (:func:`kvlib.hardware.vllm_budget_bytes`).
    ``runtime_bytes`` stands for what vLLM's profile run measures besides the
    weights (peak activations, non-torch memory, CUDA graphs:
    ``Worker.determine_available_memory`` in ``vllm/v1/worker/gpu_worker.py``); 0
    gives an upper bound. Raises when nothing is left.
    """
    require_int(weight_bytes_per_gpu, "weight_bytes_per_gpu")
    require_int(runtime_bytes, "runtime_bytes")
    free = vllm_budget_bytes(gpu, gpu_memory_utilization) - weight_bytes_per_gpu - runtime_bytes
    if free <= 0:
        raise ValueError(
            f"the weights ({weight_bytes_per_gpu:,} B) and runtime ({runtime_bytes:,} B) fill "
            f"{gpu_memory_utilization} x {gpu.name}'s {gpu.vllm_total_label} total: raise "
            "gpu_memory_utilization, the tensor-parallel degree or quantize the weights"
        )
    return free


def unified_page_bytes(
    cfg: ModelConfig, block_size: int = DEFAULT_BLOCK_SIZE, kv_dtype: str = "bf16", tp: int = 1
) -> int:
    """Bytes one block id spans over every layer on one GPU, after vLLM unifies page sizes.

    ``group page x layers per group`` (``KVCacheConfig``'s tensors, one per layer of the
    largest group). Equals :func:`kvlib.sizing.summed_page_bytes` when every layer is of
    one type; on a hybrid model the groups' block sizes grow to a common page first.
    """
    groups = kv_cache_groups(cfg, block_size, kv_dtype, tp)
    return groups[0].page_bytes * max(g.num_layers for g in groups)


def blocks_per_request(
    cfg: ModelConfig,
    context_tokens: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_dtype: str = "bf16",
    *,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> int:
    """Block ids vLLM budgets a request of ``context_tokens``, summed over its groups.

    ``cdiv(T, B)`` for a model of full-attention (or MLA) layers only. A budget, not
    what a sequence holds: a sliding-window group is budgeted its window plus one chunk
    (:func:`kvlib.capacity.assessment.held_blocks` counts the blocks actually held).
    """
    require_int(context_tokens, "context_tokens", 1)
    return sum(
        g.blocks_per_request(context_tokens, max_num_batched_tokens)
        for g in kv_cache_groups(cfg, block_size, kv_dtype)
    )


def kv_memory_range(
    cfg: ModelConfig,
    logged_tokens: int,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kv_dtype: str = "bf16",
    tp: int = 1,
) -> tuple[int, int]:
    """KV memory ``[low, high)`` in bytes for which vLLM logs ``logged_tokens``.

    Inverts the whole-block line (:func:`logged_pool_tokens` before 0.20): the log
    rounds down to whole blocks (and whole rounds of groups), so one logged size covers
    a range of memory. The current line is the same number for one full-attention
    group whose ``max_model_len`` is a multiple of the block size.
    """
    groups = kv_cache_groups(cfg, block_size, kv_dtype, tp)
    per_round = min(g.block_size for g in groups)
    require_int(logged_tokens, "logged_tokens")
    if logged_tokens % per_round:
        raise ValueError(
            f"{logged_tokens:,} tokens is not a whole number of {per_round}-token blocks: "
            "vLLM cannot log it with this block size"
        )
    page = unified_page_bytes(cfg, block_size, kv_dtype, tp)
    first = logged_tokens // per_round * len(groups)
    return first * page, (first + len(groups)) * page
