"""What each tier of a named node holds, counted in tokens of a model's cache.

A node's GPUs share its host DRAM and its NVMe drives; each GPU of a tensor-parallel
group keeps its own share of every token (:func:`kvlib.bounds.kv_bytes_per_gpu`), so a
tier's tokens are its bytes a GPU over the bytes a token puts on one GPU:

    tokens(tier) = floor(tier_bytes / gpus / KV_gpu(1 token))

HBM holds what vLLM's budget leaves after the weights
(:func:`kvlib.hardware.vllm_budget_bytes` less :func:`kvlib.bounds.weight_bytes_per_gpu`;
activations not counted, so an upper bound); host DRAM and NVMe are counted whole (the
operating system and the engine's own pages not subtracted), an upper bound too.
``KV_gpu(1 token)`` is a token's bytes while under every sliding window.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import require_int
from kvlib.bounds import kv_bytes_per_gpu, weight_bytes_per_gpu
from kvlib.config import ModelConfig
from kvlib.hardware import VLLM_GPU_MEMORY_UTILIZATION, get_gpu, vllm_budget_bytes
from kvlib.units import TB

__all__ = ["NODES", "Node", "TierTokens", "get_node", "tier_tokens"]


@dataclass(frozen=True)
class Node:
    """A server: its GPUs (a :mod:`kvlib.hardware` row), host DRAM and NVMe data drives."""

    name: str
    gpu: str
    gpus: int
    host_dram_bytes: int
    nvme_bytes: int
    source: str


NODES: dict[str, Node] = {
    "DGX-H100": Node(
        "DGX-H100", "H100-SXM", 8, 2 * TB, 8 * 3_840 * 10**9,
        "NVIDIA DGX BasePOD reference architecture, Core Components (DGX H100): 8 H100 "
        "GPUs, 2 TB of DDR5 system memory, eight 3.84 TB U.2 NVMe drives for storage/cache "
        "(the two 1.92 TB OS drives not counted)"),
}


def get_node(name: str) -> Node:
    """The node called ``name``; KeyError with one line listing the known names."""
    try:
        return NODES[name]
    except KeyError:
        raise KeyError(f"unknown node {name!r}: use one of {', '.join(NODES)}") from None


@dataclass(frozen=True)
class TierTokens:
    """Tokens of one model's cache each tier holds, for one GPU's share (``tp`` GPUs)."""

    model: str
    node: str
    tp: int
    kv_bytes_per_token_per_gpu: int
    hbm_tokens: int
    host_dram_tokens: int
    nvme_tokens: int


def tier_tokens(
    cfg: ModelConfig,
    node: Node,
    *,
    tp: int = 1,
    kv_dtype: str = "bf16",
    weight_dtype: str | None = "bf16",
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> TierTokens:
    """Each tier's tokens: its bytes a GPU over one token's bytes on a GPU (module doc)."""
    require_int(tp, "tp", 1)
    if tp > node.gpus:
        raise ValueError(f"tp ({tp}) exceeds the {node.gpus} GPUs of {node.name}")
    per_token = kv_bytes_per_gpu(cfg, 1, kv_dtype, tp)
    hbm = (vllm_budget_bytes(get_gpu(node.gpu), gpu_memory_utilization)
           - weight_bytes_per_gpu(cfg, tp, weight_dtype))
    return TierTokens(
        model=cfg.name, node=node.name, tp=tp, kv_bytes_per_token_per_gpu=per_token,
        hbm_tokens=max(0, hbm) // per_token,
        host_dram_tokens=node.host_dram_bytes // node.gpus // per_token,
        nvme_tokens=node.nvme_bytes // node.gpus // per_token,
    )
