"""The weight tensors of a model, family by family, as transformers lays them out.

``weight_groups(cfg)`` lists every parameter tensor of the model a checkpoint
holds (language model, and a vision tower when it ships one): its module name,
shape and how many copies (layers, experts). Parameter counts and the bytes a
quantized checkpoint occupies are both read off this list, so they cannot
disagree. Each family's list is checked against ``sum(p.numel())`` of the model
transformers 5.23 builds on the meta device (``tests/reference/test_weights_layouts.py``).

A family kvlib has no layout for raises :class:`UnknownLayout`: a parameter
count kvlib cannot make exactly is reported as unknown, never guessed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Literal

from kvlib.config import ConfigError, ModelConfig
from kvlib.weights.families import FAMILY_LAYERS, LayerTensors, vision_groups
from kvlib.weights.tensors import RoleName

__all__ = ["UnknownLayout", "WeightGroup", "known_families", "weight_groups"]


class UnknownLayout(ConfigError):
    """kvlib does not know this model's module layout, so it cannot count its weights."""


@dataclass(frozen=True)
class WeightGroup:
    """``copies`` tensors of ``shape`` under the module name ``module``.

    ``module`` contains ``{layer}`` for per-layer tensors, formatted with each
    index of ``layers``; ``copies_per_layer`` counts experts stored per layer.
    ``active_per_layer`` is how many of those copies one token multiplies
    through (``experts_per_token`` for routed experts). For a ``linear`` or
    ``expert`` weight the shape is ``(out_features, in_features)``.
    """

    module: str
    shape: tuple[int, ...]
    role: RoleName
    layers: tuple[int, ...] = ()
    copies_per_layer: int = 1
    active_per_layer: int | None = None
    part: Literal["text", "vision"] = "text"

    @property
    def elements(self) -> int:
        """Elements of one tensor: the product of ``shape``."""
        return math.prod(self.shape)

    @property
    def copies(self) -> int:
        """Tensors in the group: per-layer copies times layers (1 outside the layers)."""
        return self.copies_per_layer * max(1, len(self.layers))

    @property
    def count(self) -> int:
        """Parameters in the whole group."""
        return self.elements * self.copies

    @property
    def active_count(self) -> int:
        """Parameters of the group one token multiplies through."""
        per_layer = (
            self.copies_per_layer if self.active_per_layer is None else self.active_per_layer
        )
        return self.elements * per_layer * max(1, len(self.layers))

    def module_names(self) -> list[str]:
        """The module name of each layer's copy (one name outside the layers)."""
        if not self.layers:
            return [self.module]
        return [self.module.format(layer=i) for i in self.layers]


def known_families() -> list[str]:
    """The ``model_type`` values whose weights kvlib can count exactly."""
    return sorted(FAMILY_LAYERS)


@functools.lru_cache(maxsize=64)
def weight_groups(cfg: ModelConfig) -> tuple[WeightGroup, ...]:
    """Every weight tensor of ``cfg``'s checkpoint, language model and towers.

    Cached per config: a size report asks for it several times, and a config is
    frozen (its hash leaves out ``raw``, which the layout never reads).
    """
    builder = FAMILY_LAYERS.get(cfg.model_type)
    if builder is None:
        raise UnknownLayout(
            f"kvlib does not know the module layout of model_type {cfg.model_type!r}, so it "
            f"cannot count its weights exactly (it knows {', '.join(known_families())}); "
            "count them with transformers on the meta device"
        )
    if cfg.vocab_size is None:
        raise ConfigError(f"{cfg.name}: missing field 'vocab_size', needed to count the weights")
    tensors: LayerTensors = builder(cfg)
    groups = [WeightGroup(*t) for t in tensors.outside]
    for index in range(cfg.num_hidden_layers):
        for module, shape, role, copies, active in tensors.per_layer(index):
            groups.append(WeightGroup(module, shape, role, (index,), copies, active))
    if cfg.vision is not None:
        vision = vision_groups(cfg)
        if vision is None:
            raise UnknownLayout(
                f"{cfg.name} ships a {cfg.vision.model_type!r} vision tower whose layout kvlib "
                "does not know: its weights would be left out, so they are not counted"
            )
        groups += [WeightGroup(m, shape, role, part="vision") for m, shape, role in vision]
    return tuple(_merge(groups))


def _merge(groups: list[WeightGroup]) -> list[WeightGroup]:
    """Fold per-layer groups that differ only in their layer into one group."""
    merged: dict[tuple[object, ...], WeightGroup] = {}
    for g in groups:
        key = (g.module, g.shape, g.role, g.copies_per_layer, g.active_per_layer)
        if g.layers and key in merged:
            merged[key] = dataclasses.replace(g, layers=merged[key].layers + g.layers)
        else:
            merged[key if g.layers else (*key, len(merged))] = g
    return list(merged.values())
