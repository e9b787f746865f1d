"""Where an MLA model's cache lives: tensor-parallel versus data-parallel attention.

Tensor parallelism splits KV heads across GPUs, but an MLA latent has no heads:
every rank holds every sequence's whole latent (vLLM's MLA backends;
:func:`kvlib.bounds.kv_bytes_per_gpu`). With ``-tp 8`` a DeepSeek-V3 node
therefore holds only as many sequences as one GPU. Data-parallel attention
(``-dp 8 --enable-expert-parallel``) gives each GPU its own sequences instead, at
the price of a whole copy of the attention and other non-expert weights per GPU
(vLLM docs, "Data Parallel Deployment": for MLA models "it can be advantageous to
use data parallel for the attention layers").
"""

from __future__ import annotations

from typing import Literal

from kvlib._validate import cdiv, require_fraction, require_int
from kvlib.bounds import kv_bytes_per_gpu
from kvlib.bounds import weight_bytes_per_gpu as bounds_weight_bytes_per_gpu
from kvlib.config import ModelConfig
from kvlib.dtypes import require_dtype
from kvlib.hardware import VLLM_GPU_MEMORY_UTILIZATION, GPUSpec, vllm_budget_bytes
from kvlib.sizing import kv_bytes, seats
from kvlib.view import model_view

__all__ = [
    "AttentionParallel",
    "dcp_node_seats",
    "dcp_tokens_per_gpu",
    "node_seats",
    "weight_bytes_per_gpu",
]

AttentionParallel = Literal["tp", "dp"]

def weight_bytes_per_gpu(
    cfg: ModelConfig,
    gpus: int,
    weight_dtype: str | None = "bf16",
    attention: AttentionParallel = "tp",
) -> int:
    """Weight bytes on each of ``gpus`` GPUs serving one copy of the model.

    ``weight_dtype`` is a precision for every weight (``"fp8"``: one byte each, no
    scales) or None for the checkpoint as it ships, scales included. ``"tp"``
    (vLLM ``-tp N``): :func:`kvlib.bounds.weight_bytes_per_gpu`, every tensor split N
    ways except those vLLM replicates (``fused_qkv_a_proj``, the router, the norms).
    ``"dp"`` (``-dp N --enable-expert-parallel``): the routed experts split N ways,
    everything else (attention, shared experts, dense MLPs, embeddings, LM head) whole
    on every GPU (:meth:`kvlib.view.ModelView.dp_weight_bytes_per_gpu`).
    """
    require_int(gpus, "gpus", 1)
    if attention not in ("tp", "dp"):
        raise ValueError(f"attention must be 'tp' or 'dp', got {attention!r}")
    if weight_dtype is not None:
        require_dtype(weight_dtype)
    if attention == "tp":
        return bounds_weight_bytes_per_gpu(cfg, gpus, weight_dtype)
    return model_view(cfg).dp_weight_bytes_per_gpu(gpus, weight_dtype)


def node_seats(
    cfg: ModelConfig,
    gpu: GPUSpec,
    gpus: int,
    context_tokens: int,
    *,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    attention: AttentionParallel = "tp",
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> int:
    """Sequences of ``context_tokens`` that ``gpus`` GPUs hold at once.

    Each GPU gives ``ceil(total x utilization) - weights`` to the cache, ``total``
    being CUDA's, as vLLM multiplies it (:func:`kvlib.hardware.vllm_budget_bytes`;
    the driver's where no CUDA reading is recorded). The activation workspace an
    engine also reserves is left out, so this is an upper bound. Under TP every
    sequence has a share on every GPU (:func:`kvlib.bounds.kv_bytes_per_gpu`: KV
    heads split, an MLA latent whole on each), so the node holds what one GPU holds;
    under DP attention a sequence lives on one GPU, so the node holds ``gpus``
    times one GPU's seats.
    0 when the weights leave no room.
    """
    require_fraction(gpu_memory_utilization, "gpu_memory_utilization")
    require_int(context_tokens, "context_tokens", 1)
    weights = weight_bytes_per_gpu(cfg, gpus, weight_dtype, attention)
    free = vllm_budget_bytes(gpu, gpu_memory_utilization) - weights
    if free <= 0:
        return 0
    if attention == "tp":
        return seats(free, kv_bytes_per_gpu(cfg, context_tokens, kv_dtype, gpus))
    return gpus * seats(free, kv_bytes(cfg, context_tokens, kv_dtype))


def dcp_tokens_per_gpu(context_tokens: int, dcp: int, pcp: int = 1) -> int:
    """Tokens of one sequence each GPU caches under decode (and prefill) context
    parallelism: ``cdiv(T, dcp x pcp)``, as ``FullAttentionSpec.max_memory_usage_bytes``
    divides ``max_model_len`` (``vllm/v1/kv_cache_interface.py``). DCP interleaves a
    sequence's tokens over ``dcp`` ranks of the tensor-parallel group, so it needs
    no extra GPUs (vLLM docs, "Context Parallel Deployment")."""
    require_int(context_tokens, "context_tokens", 1)
    require_int(dcp, "dcp", 1)
    require_int(pcp, "pcp", 1)
    return cdiv(context_tokens, dcp * pcp)


def dcp_node_seats(
    cfg: ModelConfig,
    gpu: GPUSpec,
    gpus: int,
    context_tokens: int,
    dcp: int,
    *,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> int:
    """Sequences ``-tp gpus -dcp dcp`` holds: the weights of tensor parallelism, and
    each GPU caching ``cdiv(T, dcp)`` tokens of every sequence
    (:func:`dcp_tokens_per_gpu`) in its TP share (the whole latent for MLA).

    vLLM bounds ``dcp`` by ``tp / H_kv`` (docs, "Context Parallel Deployment"): the
    KV replication left after splitting heads, ``tp`` for an MLA latent. With
    ``dcp = tp`` an MLA node holds ``tp`` times the sequences of ``-tp`` alone, as
    DP attention does, without DP's extra weight copies. ``dcp = 1`` is
    :func:`node_seats` under TP. Upper bound: the activation workspace is left out.
    """
    require_int(gpus, "gpus", 1)
    require_int(dcp, "dcp", 1)
    max_dcp = gpus if cfg.mla else max(1, gpus // cfg.num_key_value_heads)
    if dcp > max_dcp or gpus % dcp:
        raise ValueError(
            f"dcp={dcp} must divide tp={gpus} and be at most tp / H_kv = {max_dcp} "
            f"for {cfg.name}: use a divisor of {gpus} up to {max_dcp}"
        )
    require_fraction(gpu_memory_utilization, "gpu_memory_utilization")
    local_tokens = dcp_tokens_per_gpu(context_tokens, dcp)
    free = vllm_budget_bytes(gpu, gpu_memory_utilization) - weight_bytes_per_gpu(
        cfg, gpus, weight_dtype, "tp"
    )
    if free <= 0:
        return 0
    return seats(free, kv_bytes_per_gpu(cfg, local_tokens, kv_dtype, gpus))
