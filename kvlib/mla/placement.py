"""Where an MLA model's cache lives: tensor-parallel versus data-parallel attention.

Tensor parallelism splits KV heads across GPUs, but an MLA latent has no heads:
every rank holds every sequence's whole latent (vLLM's MLA backends;
:func:`kvlib.deploy.kv_bytes_per_gpu`). With ``-tp 8`` a DeepSeek-V3 node
therefore holds only as many sequences as one GPU. Data-parallel attention
(``-dp 8 --enable-expert-parallel``) gives each GPU its own sequences instead, at
the price of a whole copy of the attention and other non-expert weights per GPU
(vLLM docs, "Data Parallel Deployment": for MLA models "it can be advantageous to
use data parallel for the attention layers").
"""

from __future__ import annotations

from typing import Literal

from kvlib.checks import require_fraction, require_int
from kvlib.config import ModelConfig
from kvlib.deploy import kv_bytes_per_gpu
from kvlib.dtypes import bytes_for
from kvlib.hardware import GPUSpec
from kvlib.mla.cost import MLAShape
from kvlib.params import param_count
from kvlib.sizing import kv_bytes, seats

__all__ = ["AttentionParallel", "node_seats", "weight_bytes_per_gpu"]

AttentionParallel = Literal["tp", "dp"]


def _routed_expert_params(cfg: ModelConfig) -> int:
    """Routed experts (gate, up and down of ``moe_intermediate_size``) in every MoE layer."""
    if cfg.moe is None:
        return 0
    per_expert = 3 * cfg.hidden_size * cfg.moe.expert_width
    return sum(cfg.moe.moe_layers) * cfg.moe.num_experts * per_expert


def _replicated_under_tp(cfg: ModelConfig) -> int:
    """Weights vLLM keeps whole on every TP rank of a DeepSeek model.

    ``fused_qkv_a_proj`` (``q_a_proj`` + ``kv_a_proj_with_mqa``, ``disable_tp=True``)
    and the MoE router (replicated), vllm/model_executor/models/deepseek_v2.py.
    """
    replicated = 0
    if cfg.mla is not None:
        shape = MLAShape.from_config(cfg)
        replicated += (
            cfg.num_hidden_layers * cfg.hidden_size * ((shape.q_lora_rank or 0) + shape.latent_dim)
        )
    if cfg.moe is not None:
        replicated += sum(cfg.moe.moe_layers) * cfg.moe.num_experts * cfg.hidden_size
    return replicated


def weight_bytes_per_gpu(
    cfg: ModelConfig, gpus: int, weight_dtype: str = "bf16", attention: AttentionParallel = "tp"
) -> int:
    """Weight bytes on each of ``gpus`` GPUs serving one copy of the model.

    ``"tp"`` (vLLM ``-tp N``): every matrix split N ways except the replicated
    ones above. ``"dp"`` (``-dp N --enable-expert-parallel``): routed experts split
    N ways, everything else (attention, shared experts, dense MLPs, embeddings) whole
    on every GPU. Norms are counted as split (a few MB). Quantization scales are left out.
    """
    require_int(gpus, "gpus", 1)
    if attention not in ("tp", "dp"):
        raise ValueError(f"attention must be 'tp' or 'dp', got {attention!r}")
    total = param_count(cfg)
    if attention == "dp":
        routed = _routed_expert_params(cfg)
        return bytes_for(total - routed + -(-routed // gpus), weight_dtype)
    replicated = _replicated_under_tp(cfg)
    return bytes_for(-(-(total - replicated) // gpus) + replicated, weight_dtype)


def node_seats(
    cfg: ModelConfig,
    gpu: GPUSpec,
    gpus: int,
    context_tokens: int,
    *,
    kv_dtype: str = "bf16",
    weight_dtype: str = "bf16",
    attention: AttentionParallel = "tp",
    gpu_memory_utilization: float = 0.9,
) -> int:
    """Sequences of ``context_tokens`` that ``gpus`` GPUs hold at once.

    Each GPU gives ``memory x utilization - weights`` to the cache. Under TP every
    sequence has a share on every GPU (:func:`kvlib.deploy.kv_bytes_per_gpu`: KV
    heads split, an MLA latent whole on each), so the node holds what one GPU holds;
    under DP attention a sequence lives on one GPU, so the node holds ``gpus`` times
    one GPU's seats. 0 when the weights leave no room.
    """
    require_fraction(gpu_memory_utilization, "gpu_memory_utilization")
    require_int(context_tokens, "context_tokens", 1)
    weights = weight_bytes_per_gpu(cfg, gpus, weight_dtype, attention)
    free = int(gpu.memory_bytes * gpu_memory_utilization) - weights
    if free <= 0:
        return 0
    if attention == "tp":
        return seats(free, kv_bytes_per_gpu(cfg, context_tokens, kv_dtype, gpus))
    return gpus * seats(free, kv_bytes(cfg, context_tokens, kv_dtype))
