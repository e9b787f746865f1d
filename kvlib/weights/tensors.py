"""The weight tensors a family's layout is made of, and the blocks families share.

A tensor is ``(module, shape, role)``; a layer tensor also carries how many
copies a layer stores and how many one token uses (experts). Shapes of linear
weights are ``(out_features, in_features)``.

The shared blocks follow transformers 5.23's modules: ``nn.Linear``, RMSNorm
and LayerNorm, the embeddings and LM head around the layers, the gated MLP and
routed experts stored as fused per-layer tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kvlib.config import ModelConfig

__all__ = [
    "LAYER",
    "LayerTensor",
    "LayerTensors",
    "RoleName",
    "Tensor",
    "fused_experts",
    "gated_mlp",
    "layer_tensor",
    "linear",
    "norm",
    "outside_tensors",
]

RoleName = Literal["linear", "expert", "embedding", "lm_head", "norm", "bias", "router", "other"]
Tensor = tuple[str, tuple[int, ...], RoleName]
LayerTensor = tuple[str, tuple[int, ...], RoleName, int, int | None]

# The decoder layers' module prefix in most families, formatted with each layer index.
LAYER = "model.layers.{layer}"


@dataclass(frozen=True)
class LayerTensors:
    """What a family's builder returns: the tensors outside the decoder layers
    (embeddings, final norm, LM head), and a function giving layer ``i``'s."""

    outside: list[Tensor]
    per_layer: Callable[[int], list[LayerTensor]]


def layer_tensor(module: str, shape: tuple[int, ...], role: RoleName) -> LayerTensor:
    """One tensor a layer stores once, whatever the token."""
    return (module, shape, role, 1, None)


def linear(module: str, out: int, inp: int, bias: bool) -> list[LayerTensor]:
    """An ``nn.Linear``: weight ``(out, in)`` and, with ``bias``, a bias of ``out``."""
    tensors = [layer_tensor(f"{module}.weight", (out, inp), "linear")]
    if bias:
        tensors.append(layer_tensor(f"{module}.bias", (out,), "bias"))
    return tensors


def norm(module: str, size: int, layernorm: bool) -> list[LayerTensor]:
    """RMSNorm (a weight) or LayerNorm (weight and bias)."""
    tensors = [layer_tensor(f"{module}.weight", (size,), "norm")]
    if layernorm:
        tensors.append(layer_tensor(f"{module}.bias", (size,), "norm"))
    return tensors


def outside_tensors(
    cfg: ModelConfig, embed: str, final_norm: str, layernorm: bool, head_bias: bool = False
) -> list[Tensor]:
    """The token embeddings, the final norm and, unless tied to the embeddings, the LM head."""
    vocab, h = cfg.vocab_size or 0, cfg.hidden_size
    tensors: list[Tensor] = [(f"{embed}.weight", (vocab, h), "embedding")]
    tensors += [(m, s, r) for m, s, r, _, _ in norm(final_norm, h, layernorm)]
    if not cfg.tie_word_embeddings:
        tensors.append(("lm_head.weight", (vocab, h), "lm_head"))
    if head_bias:
        tensors.append(("lm_head.bias", (vocab,), "bias"))
    return tensors


def gated_mlp(prefix: str, h: int, width: int, bias: bool) -> list[LayerTensor]:
    """A gated MLP: gate and up projections to ``width``, a down projection back to ``h``."""
    return (
        linear(f"{prefix}.gate_proj", width, h, bias)
        + linear(f"{prefix}.up_proj", width, h, bias)
        + linear(f"{prefix}.down_proj", h, width, bias)
    )


def fused_experts(prefix: str, h: int, width: int, count: int, active: int) -> list[LayerTensor]:
    """Routed experts stored as fused per-layer tensors (gate and up, then down)."""
    return [
        (f"{prefix}.gate_up_proj", (2 * width, h), "expert", count, active),
        (f"{prefix}.down_proj", (h, width), "expert", count, active),
    ]
