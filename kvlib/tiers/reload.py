"""Reload a cached prefix over a link, or compute it again: the two times and where they cross.

Reloading ``T`` tokens moves each GPU's share of their cache over that GPU's own link
(every GPU of a tensor-parallel group has one)::

    reload_s(T) = setup_s + KV_gpu(T) / link_bytes_per_s

``KV_gpu(T)`` is :func:`kvlib.bounds.kv_bytes_per_gpu` (every layer, K and V, the KV
heads one GPU holds; a sliding layer only its window). Recomputing them is a prefill of
``T`` tokens, timed by the step model (:func:`kvlib.step.step_time` with one prefill
chunk): the weight GEMMs at ``max(W / BW, 2 P T / F_eff)`` plus attention, whose FLOPs
grow as ``T^2`` (every query scores every earlier key), at ``F_eff = MFU x peak``.

The prefill step reads the weights once however short the prefix, so recomputing a short
prefix alone costs ``W / BW`` and reloading it wins; past the point where the weight
GEMMs turn compute-bound recomputing costs ``~2 P / F_eff`` a token, and attention's
quadratic term makes every longer prefix dearer still, so reloading wins again for long
prefixes on any link. Recomputing can only win in between, on a slow link: the
break-even prefix (:func:`break_even_tokens`) is where that range ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvlib._validate import require_int, require_positive
from kvlib.bounds import kv_bytes_per_gpu
from kvlib.config import ModelConfig
from kvlib.hardware import GPUSpec
from kvlib.step import ASSUMED_MFU, PrefillChunk, step_time

__all__ = [
    "BreakEven",
    "break_even_bytes_per_s",
    "break_even_tokens",
    "recompute_s",
    "reload_s",
]

# Prefix lengths tried when looking for the range where recomputing wins: 2% steps.
_GRID_RATIO = 1.02


def reload_s(
    cfg: ModelConfig,
    prefix_tokens: int,
    bytes_per_s: float,
    *,
    tp: int = 1,
    kv_dtype: str = "bf16",
    setup_s: float = 0.0,
) -> float:
    """``setup_s + KV_gpu(T) / bytes_per_s``: one GPU's share of ``T`` tokens' cache over
    its own link (:func:`kvlib.bounds.kv_bytes_per_gpu`)."""
    require_int(prefix_tokens, "prefix_tokens", 1)
    require_positive(bytes_per_s, "bytes_per_s")
    if setup_s < 0:
        raise ValueError(f"setup_s must be at least 0, got {setup_s!r}")
    return setup_s + kv_bytes_per_gpu(cfg, prefix_tokens, kv_dtype, tp) / bytes_per_s


def recompute_s(
    cfg: ModelConfig,
    gpu: GPUSpec,
    prefix_tokens: int,
    *,
    mfu: float = ASSUMED_MFU,
    tp: int = 1,
    kv_dtype: str = "bf16",
) -> float:
    """The step model's time to prefill ``T`` tokens from nothing on each of ``tp`` GPUs
    (one chunk, attention's ``T^2`` FLOPs included): :func:`kvlib.step.step_time`."""
    require_int(prefix_tokens, "prefix_tokens", 1)
    chunk = PrefillChunk(prefix_tokens)
    return step_time(cfg, gpu, (), [chunk], mfu=mfu, tp=tp, kv_dtype=kv_dtype).total_s


def break_even_bytes_per_s(
    cfg: ModelConfig,
    gpu: GPUSpec,
    prefix_tokens: int,
    *,
    mfu: float = ASSUMED_MFU,
    tp: int = 1,
    kv_dtype: str = "bf16",
    setup_s: float = 0.0,
) -> float | None:
    """The link speed at which reloading ``T`` tokens takes as long as recomputing them:
    ``KV_gpu(T) / (recompute_s(T) - setup_s)``; any faster link reloads sooner. None when
    the setup alone outlasts the recompute (no link is fast enough)."""
    spare = recompute_s(cfg, gpu, prefix_tokens, mfu=mfu, tp=tp, kv_dtype=kv_dtype) - setup_s
    if spare <= 0:
        return None
    return kv_bytes_per_gpu(cfg, prefix_tokens, kv_dtype, tp) / spare


@dataclass(frozen=True)
class BreakEven:
    """Where recomputing beats reloading, over prefixes of 1 to ``max_tokens`` tokens.

    ``recompute_wins_from`` to ``tokens - 1``: the range where recomputing is faster
    (both None when reloading wins at every length). ``tokens``: the shortest prefix past
    that range, from which reloading wins again; None also when the range runs to
    ``max_tokens`` (``recompute_wins_to_max`` is then True).
    """

    tokens: int | None
    recompute_wins_from: int | None
    recompute_wins_to_max: bool
    max_tokens: int


def _grid(max_tokens: int) -> list[int]:
    points, t = [1], 1.0
    while points[-1] < max_tokens:
        t *= _GRID_RATIO
        points.append(min(max_tokens, max(points[-1] + 1, int(t))))
    return points


def break_even_tokens(
    cfg: ModelConfig,
    gpu: GPUSpec,
    bytes_per_s: float,
    *,
    max_tokens: int | None = None,
    mfu: float = ASSUMED_MFU,
    tp: int = 1,
    kv_dtype: str = "bf16",
    setup_s: float = 0.0,
) -> BreakEven:
    """The prefix length from which reloading over ``bytes_per_s`` beats recomputing.

    Prefixes are tried in 2% steps up to ``max_tokens`` (the model's position limit by
    default); the range's edges are then found to the token by bisection.
    """
    limit = max_tokens if max_tokens is not None else cfg.max_position_embeddings
    if limit is None:
        raise ValueError(f"{cfg.name} states no position limit: pass max_tokens")
    require_int(limit, "max_tokens", 1)

    def recompute_wins(t: int) -> bool:
        return (recompute_s(cfg, gpu, t, mfu=mfu, tp=tp, kv_dtype=kv_dtype)
                < reload_s(cfg, t, bytes_per_s, tp=tp, kv_dtype=kv_dtype, setup_s=setup_s))

    grid = _grid(limit)
    wins = [t for t in grid if recompute_wins(t)]
    if not wins:
        return BreakEven(None, None, False, limit)
    first, last = wins[0], wins[-1]
    if last == limit:
        return BreakEven(None, _edge(grid, first, recompute_wins, True), True, limit)
    return BreakEven(_edge(grid, last, recompute_wins, False) + 1,
                     _edge(grid, first, recompute_wins, True), False, limit)


def _edge(grid: list[int], point: int, wins: Callable[[int], bool], leading: bool) -> int:
    """The first token of the range (``leading``) or its last, bisected between ``point``
    and its neighbour on the grid."""
    i = grid.index(point)
    if leading:
        if i == 0:
            return point
        lo, hi = grid[i - 1], point  # lo loses, hi wins: first winner in (lo, hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if wins(mid) else (mid, hi)
        return hi
    lo, hi = point, grid[i + 1]  # lo wins, hi loses: last winner in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if wins(mid) else (lo, mid)
    return lo
