"""Parameter counts and weight bytes, from a config, before any byte is downloaded.

Counts are sums over the weight tensors of :func:`kvlib.weights.layouts.weight_groups`
(checked against the models transformers builds on the meta device), worked out
once per config by its view (:func:`kvlib.view.model_view`). A family
whose layout kvlib does not know gets no count: :func:`count_params` reports
``None`` with the reason, and :func:`param_count` raises it.

Weight bytes come at a precision you choose (``P x bits / 8``, plus one scale
per ``group_size`` weights when a group size is given), or as the checkpoint
ships (``weight_dtype=None``): ``quantization_config`` first (the formats of
:mod:`kvlib.weights.quantized`), then ``torch_dtype``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvlib._validate import cdiv, require_int
from kvlib.config import ModelConfig
from kvlib.dtypes import bytes_for
from kvlib.view import group_bytes, model_view
from kvlib.weights.layouts import UnknownLayout, WeightGroup
from kvlib.weights.quantized import ShippedWeights

__all__ = [
    "ParamCount",
    "active_param_count",
    "count_params",
    "expert_weight_bytes",
    "group_weight_bytes",
    "param_count",
    "unread_weight_bytes",
    "shipped_weights",
    "weight_bytes",
]


@dataclass(frozen=True)
class ParamCount:
    """Total and active parameters, or None for both with ``note`` saying why."""

    total: int | None
    active: int | None
    note: str = ""


def count_params(cfg: ModelConfig) -> ParamCount:
    """:func:`param_count` and :func:`active_param_count`, or None with the reason."""
    try:
        return ParamCount(param_count(cfg), active_param_count(cfg))
    except UnknownLayout as err:
        return ParamCount(None, None, str(err))


def param_count(cfg: ModelConfig) -> int:
    """Every parameter a checkpoint holds: embeddings, layers, norms, LM head, towers."""
    return model_view(cfg).param_count


def active_param_count(cfg: ModelConfig) -> int:
    """Parameters one text token is multiplied through: the FLOP-bearing weights.

    A MoE layer counts only its ``num_experts_per_tok`` routed experts (plus
    shared ones), and the input embedding is left out: it is a table lookup,
    not a matrix product (the LM head is counted, tied or not); a vision tower
    runs per image, not per token. Prefill costs about ``2 x active_param_count``
    FLOPs per prompt token. This is the convention of OpenAI's gpt-oss model
    card (gpt-oss-20b: 3.6B active of 21B); Mistral's "12.9B active" for
    Mixtral also counts the embedding table. The matrices alone (norms and
    biases left out) are :func:`kvlib.bounds.matmul_params`.
    """
    return model_view(cfg).active_param_count


def weight_bytes(
    cfg: ModelConfig,
    weight_dtype: str | None = "bf16",
    *,
    group_size: int | None = None,
    scale_dtype: str = "fp16",
) -> int:
    """Bytes of the weights: ``P x bits / 8`` (+ ``ceil(P / group_size)`` scales).

    ``weight_dtype=None`` sizes the checkpoint as it ships (:func:`shipped_weights`).
    """
    if weight_dtype is None and group_size is not None:
        raise ValueError("group_size applies to a chosen weight_dtype, not to as-shipped")
    total = model_view(cfg).weights(weight_dtype).all
    if group_size is not None:
        require_int(group_size, "group_size", 1)
        total += bytes_for(cdiv(param_count(cfg), group_size), scale_dtype)
    return total


def shipped_weights(cfg: ModelConfig) -> ShippedWeights:
    """Bytes of the weights as shipped: ``quantization_config`` first, then ``torch_dtype``
    (bf16 when the file gives none) for the tensors the format leaves alone."""
    return model_view(cfg).shipped()


def group_weight_bytes(
    cfg: ModelConfig, groups: Sequence[WeightGroup], weight_dtype: str | None
) -> int:
    """Bytes of some of a model's tensors, at ``weight_dtype`` or as shipped (None)."""
    return group_bytes(cfg, groups, weight_dtype)


def expert_weight_bytes(cfg: ModelConfig, weight_dtype: str | None = "bf16") -> int:
    """Bytes of the routed experts alone (0 for a dense model), at ``weight_dtype`` or as
    shipped (None): the part of the weights a decode step reads only for the experts
    its tokens are routed to."""
    return model_view(cfg).weights(weight_dtype).experts


def unread_weight_bytes(cfg: ModelConfig, weight_dtype: str | None = "bf16") -> int:
    """Bytes a text decode step does not read: the input (and position) embedding
    tables, of which it looks up one row a token, unless the token table is also the LM
    head (tied); and any vision tower, which runs once per image."""
    return model_view(cfg).weights(weight_dtype).unread
