"""SGLang's KV pool: the bytes one token takes, the tokens that fit, and its start-up lines.

Followed from ``sgl-project/sglang``:

- ``python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py`` at commit
  ``226149ac457bd1a1b5d450f55c01f72f604320d6``: ``get_cell_size_per_token`` is one
  token's bytes on one GPU over every layer, keys and values together:
  ``H_kv/tp x (head_dim + v_head_dim) x L x b`` for MHA/GQA (``get_num_kv_heads`` of
  the attention TP size, at least one head), ``(kv_lora_rank + qk_rope_head_dim) x L x b``
  for MLA (the latent is not split by TP; no factor 2). ``profile_max_num_token``:
  ``rest = available - total x (1 - mem_fraction_static)`` in GiB, ``available`` the
  free memory after the weights and ``total`` the free memory before them, so
  ``rest = mem_fraction_static x total - weights``; tokens ``int(rest x 2**30) //
  cell_size``. ``init_memory_pool`` then rounds ``max_total_num_tokens`` down to a whole
  number of pages (``// page_size * page_size``; ``page_size`` is 1 unless set).
- ``python/sglang/srt/mem_cache/memory_pool.py``: ``GB = 1024 * 1024 * 1024``, so the
  "GB" SGLang prints is a GiB. ``MHATokenToKVPool`` allocates per layer a K and a V
  buffer of ``(size + page_size, head_num, head_dim)`` (slot 0 takes padded tokens) and
  logs ``KV Cache is allocated. #tokens: {size}, K size: {k / GB:.2f} GB, V size:
  {v / GB:.2f} GB``; ``MLATokenToKVPool`` one buffer of ``(size + page_size, 1,
  kv_lora_rank + qk_rope_head_dim)`` and ``KV size: {kv / GB:.2f} GB``. fp8 caches
  (``fp8_e4m3``, ``fp8_e5m2``) are stored as one byte (``torch.uint8``).
- ``python/sglang/srt/server_args.py`` ``_handle_gpu_memory_settings`` (the heuristic of
  sglang PR #10975): without ``--mem-fraction-static``, ``reserved = 512 + max(chunked
  prefill, 2048) x 1.5 + cuda_graph_max_bs x 2 + tp x pp / 8 x 1024`` MiB (at least
  10 GiB on GPUs over 60 GiB), and ``mem_fraction_static = round((gpu_mem - reserved) /
  gpu_mem, 3)``, the chunked-prefill size and graph batch chosen by buckets of
  ``gpu_mem`` (:func:`default_mem_fraction_static`).

Not modelled (refused with the reason, :func:`cell_size_bytes`): windowed layers
(SGLang either splits them into a second pool by ``--swa-full-tokens-ratio``,
``set_num_tokens_hybrid_swa``, or pages them as full layers where it disables that pool
for the model), linear-attention/Mamba state (``handle_max_mamba_cache`` carves its
share out first), DeepSeek V3.2's indexer cache and fp4 caches.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import require_int
from kvlib.config import ModelConfig

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "GB",
    "SGLANG_COMMIT",
    "SGLangPool",
    "cell_size_bytes",
    "default_mem_fraction_static",
    "max_total_num_tokens",
    "rest_memory_bytes",
    "sglang_pool",
]

SGLANG_COMMIT = "226149ac457bd1a1b5d450f55c01f72f604320d6"
GB = 1 << 30  # SGLang's "GB" (memory_pool.py): a GiB
DEFAULT_PAGE_SIZE = 1  # --page-size: SGLang's radix cache matches token by token
_MIB = 1 << 20
# Bytes of one cached element for the kv dtypes SGLang takes (--kv-cache-dtype auto gives
# the model's bf16/fp16; fp8_e4m3 and fp8_e5m2 are stored as uint8).
_KV_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


def cell_size_bytes(cfg: ModelConfig, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """One token's cache on one GPU, every layer, K and V (``get_cell_size_per_token``).

    Raises ValueError, with the reason, for a model SGLang sizes another way.
    """
    require_int(tp, "tp", 1)
    if kv_dtype not in _KV_BYTES:
        raise ValueError(
            f"SGLang caches in the model's dtype or fp8 (--kv-cache-dtype auto, fp8_e4m3, "
            f"fp8_e5m2); kvlib does not size its {kv_dtype} cache"
        )
    b = _KV_BYTES[kv_dtype]
    kinds = set(cfg.layer_kinds)
    _refuse_other_pools(cfg, kinds)
    layers = cfg.num_hidden_layers
    if cfg.mla is not None:
        return (cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim) * layers * b
    heads = max(1, cfg.num_key_value_heads // tp)  # ModelConfig.get_num_kv_heads
    return heads * (cfg.head_dim + cfg.head_dim) * layers * b


def _refuse_other_pools(cfg: ModelConfig, kinds: set[str]) -> None:
    if kinds & {"sliding", "chunked"}:
        raise ValueError(
            f"{cfg.name} has windowed layers: SGLang either gives them a second pool split "
            "by --swa-full-tokens-ratio (set_num_tokens_hybrid_swa) or, for models where it "
            "turns that pool off, pages them as full layers; kvlib does not guess which"
        )
    if "linear" in kinds:
        raise ValueError(
            f"{cfg.name} keeps linear-attention (Mamba-like) state: SGLang carves the state "
            "pool out of the memory first (handle_max_mamba_cache, --mamba-full-memory-ratio)"
            "; kvlib does not size that split"
        )
    if "shared" in kinds:
        raise ValueError(
            f"{cfg.name} has layers reading another layer's cache: SGLang's cell counts "
            "every layer, which kvlib does not check for this model"
        )
    if cfg.indexer is not None:
        raise ValueError(
            f"{cfg.name} has a sparse-attention indexer whose keys SGLang adds to the cell "
            "(NSATokenToKVPool); kvlib does not size it"
        )
    if kinds - {"full", "mla"}:
        raise ValueError(f"{cfg.name} has {sorted(kinds)} layers, which SGLang pages otherwise")


def max_total_num_tokens(rest_memory: int, cell_size: int, page_size: int = 1) -> int:
    """Tokens in the pool: ``rest // cell_size`` rounded down to a whole page."""
    require_int(cell_size, "cell_size", 1)
    require_int(page_size, "page_size", 1)
    return max(rest_memory, 0) // cell_size // page_size * page_size


def rest_memory_bytes(total_bytes: int, weight_bytes: int, mem_fraction_static: float) -> int:
    """What ``profile_max_num_token`` leaves the cache: ``f x total - weights``.

    ``total`` is the free memory SGLang measures before loading (a little under the
    card's total on an idle GPU); the measured run also loses what the runtime holds
    besides the weights, so this is an upper bound.
    """
    if not 0 < mem_fraction_static < 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
    return int(total_bytes * mem_fraction_static) - weight_bytes


def default_mem_fraction_static(gpu_memory_bytes: int, tp: int = 1, pp: int = 1) -> float:
    """SGLang's ``mem_fraction_static`` when none is given (``_handle_gpu_memory_settings``).

    ``gpu_mem`` in MiB picks the chunked-prefill size and the largest CUDA-graph batch,
    which set the MiB reserved for activations and graphs; the rest is the fraction.
    """
    require_int(tp, "tp", 1)
    gpu_mem = gpu_memory_bytes / _MIB
    chunked, graph_bs = _gpu_defaults(gpu_mem, tp)
    reserved = 512 + max(chunked, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    if gpu_mem > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem - reserved) / gpu_mem, 3)


def _gpu_defaults(gpu_mem: float, tp: int) -> tuple[int, int]:
    """``(chunked_prefill_size, cuda_graph_max_bs)`` of a CUDA GPU of ``gpu_mem`` MiB."""
    small = tp < 4
    if gpu_mem < 20 * 1024:  # T4, 4080
        return 2048, 8
    if gpu_mem < 35 * 1024:  # A10, 4090, 5090
        return 2048, 24 if small else 80
    if gpu_mem < 60 * 1024:  # A100 40GB, L40
        return 4096, 32 if small else 160
    if gpu_mem < 160 * 1024:  # H100, A100 80GB, H20, H200
        return 8192, 256 if small else 512
    return 16384, 512  # B200, MI300


@dataclass(frozen=True)
class SGLangPool:
    """SGLang's token pool on one GPU and the lines it logs."""

    cell_size_bytes: int
    max_total_num_tokens: int
    page_size: int
    latent: bool  # an MLA pool: one buffer, "KV size"
    k_size_bytes: int | None
    v_size_bytes: int | None
    kv_size_bytes: int | None

    @property
    def startup_lines(self) -> tuple[str, str]:
        """``KV Cache is allocated. ...`` (memory_pool.py) and the scheduler's
        ``max_total_num_tokens=N`` (which goes on with other settings)."""
        n = self.max_total_num_tokens
        if self.latent:
            sizes = f"KV size: {(self.kv_size_bytes or 0) / GB:.2f} GB"
        else:
            sizes = (f"K size: {(self.k_size_bytes or 0) / GB:.2f} GB, "
                     f"V size: {(self.v_size_bytes or 0) / GB:.2f} GB")
        return f"KV Cache is allocated. #tokens: {n}, {sizes}", f"max_total_num_tokens={n}"


def sglang_pool(
    cfg: ModelConfig,
    rest_memory: int,
    *,
    kv_dtype: str = "bf16",
    tp: int = 1,
    page_size: int = DEFAULT_PAGE_SIZE,
) -> SGLangPool:
    """SGLang's pool for ``cfg`` in ``rest_memory`` bytes left for the cache on each GPU.

    The buffers hold ``tokens + page_size`` slots (slot 0 takes padded tokens), so the
    sizes logged are a page more than the tokens times the cell.
    """
    require_int(rest_memory, "rest_memory")
    cell = cell_size_bytes(cfg, kv_dtype, tp)
    tokens = max_total_num_tokens(rest_memory, cell, page_size)
    slots = tokens + page_size
    if cfg.mla is not None:
        return SGLangPool(cell, tokens, page_size, True, None, None, slots * cell)
    half = cell // 2  # K and V are the same width here (kvlib refuses v_head_dim != head_dim)
    return SGLangPool(cell, tokens, page_size, False, slots * half, slots * half, None)
