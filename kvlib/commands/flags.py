"""What the commands share: the model, a dtype, the TP degree and a link read from their
flags, each bad value one line naming the flag and the fix."""

from __future__ import annotations

from kvlib import bounds
from kvlib.commands import UsageError, hub
from kvlib.config import ModelConfig
from kvlib.dtypes import DTYPE_BITS, require_dtype
from kvlib.tiers.links import Link, get_link

__all__ = ["dtype", "link", "model", "tp"]


def model(source: str) -> ModelConfig:
    """MODEL as ``kvlib size`` reads it (:func:`kvlib.commands.hub.load_model`)."""
    return hub.load_model(source)


def link(name: str) -> Link:
    """The ``--link`` row; an unknown name lists the known ones in one line."""
    try:
        return get_link(name)
    except KeyError as err:
        raise UsageError(f"--link: {err.args[0]}") from None


def dtype(flag: str, value: str) -> str:
    """The dtype ``flag`` names, checked."""
    try:
        return require_dtype(value)
    except ValueError:
        raise UsageError(f"{flag} {value!r} is not a dtype: use one of "
                         f"{', '.join(DTYPE_BITS)}") from None


def tp(cfg: ModelConfig, flag: str, degree: int) -> int:
    """``degree`` when it splits ``cfg``'s heads as vLLM requires, else a UsageError naming
    the flag and the valid degrees (:func:`kvlib.bounds.tp_error`)."""
    if degree < 1:
        raise UsageError(f"{flag} must be at least 1, got {degree}")
    error = bounds.tp_error(cfg, degree)
    if error:
        raise UsageError(f"{flag} {degree}: {error}")
    return degree
