"""Model architecture from a Hugging Face ``config.json``: the fields that size a model.

``load_config(path | folder | dict | bundled name)`` returns a frozen
:class:`ModelConfig` whose ``layers`` are cache specs (:mod:`kvlib.specs`),
with typed sub-configs for MLA, experts, the module layout, vision towers and
quantization. Submodules: ``fields`` (typed reads and the family table),
``layer_types`` (which attention each layer uses), ``layers`` (head counts and
cache specs), ``parts`` (the sub-configs), ``model`` (:class:`ModelConfig`).
"""

from kvlib.config.fields import ConfigError
from kvlib.config.model import (
    ModelConfig,
    bundled_config_path,
    bundled_models,
    from_dict,
    load_config,
)
from kvlib.config.parts import (
    IndexerShape,
    Layout,
    MLAShape,
    MoEConfig,
    QuantizationConfig,
    VisionTower,
)

__all__ = [
    "ConfigError",
    "IndexerShape",
    "Layout",
    "MLAShape",
    "MoEConfig",
    "ModelConfig",
    "QuantizationConfig",
    "VisionTower",
    "bundled_config_path",
    "bundled_models",
    "from_dict",
    "load_config",
]
