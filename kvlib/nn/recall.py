"""Needle in a haystack over an fp8 KV cache: retrieval recall against context length.

A synthetic reproduction of a failure reported for real deployments: static KV
scales calibrated on unrepresentative data pass short tests and break
retrieval at long context. One attention head (:class:`Head`), no model: keys
with a few massive outlier channels (the reason KIVI and KVQuant quantize keys
per channel), a needle key at ``needle_sigmas`` standard deviations on them, a
query that reads them, ``softmax(q K^T / sqrt(d)) V``. Recall: the attention
output is closer (by dot product) to the needle's value than to any other value.

Static scales come from calibration keys and values: ``max|x| / divisor``,
``divisor`` 448 as llm-compressor stores them (the largest calibrated value
lands on e4m3's top code), or vLLM's own ``calc_kv_scales`` constants, 200 for
keys and 100 for values (``K_SCALE_CONSTANT``, ``V_SCALE_CONSTANT`` in
``vllm/envs.py``; ``Attention.calc_kv_scales`` in ``vllm/attention/layer.py``),
which leave 2.24x and 4.48x of headroom above the calibration maximum.

Why a bad scale fails more as the context grows: a static scale too small for
the keys (vLLM's default 1.0, or one calibrated on unrepresentative data)
saturates the largest keys. The needle's massive channels
saturate to ``448 * s`` and so does every distractor whose massive channels
all pass ``432 * s`` (the midpoint below 448, where rounding already lands on
448). Those distractors score exactly as the needle does; their number grows
with the context, ``N ~ Binomial(T - 1, p)`` with ``p = P(z > 432 s / sigma)^m``,
and a fair tie-break finds the needle with probability ``E[1 / (1 + N)] =
(1 - (1 - p)^T) / (T p)`` (:func:`tie_recall_bound`), an upper bound on recall.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvlib._validate import is_int, require_int
from kvlib.nn.quant_fp8 import FP8_MAX, quantize_fp8
from kvlib.nn.quant_int import quantize_q4_0

__all__ = [
    "VLLM_K_SCALE_CONSTANT",
    "VLLM_V_SCALE_CONSTANT",
    "Calibration",
    "Head",
    "RecallCurve",
    "calibrate",
    "recall_curves",
    "tie_recall_bound",
]

# The largest e4m3 value below 448 is 416; from their midpoint up, rounding gives 448.
_SATURATES_FROM = 432.0
# vLLM's calc_kv_scales: k_scale = max|K| / 200, v_scale = max|V| / 100 (vllm/envs.py).
VLLM_K_SCALE_CONSTANT = 200.0
VLLM_V_SCALE_CONSTANT = 100.0


@dataclass(frozen=True)
class Head:
    """The synthetic attention head: key statistics, the needle and the query's strength.

    Keys are in the units the cache stores (a static scale of 1.0 means no
    scaling): ordinary channels N(0, 1), the ``massive_channels`` first ones
    N(0, massive_std^2). The query is ``query_norm / massive_std`` long, so
    the logits ``q k / sqrt(d)`` do not depend on the key units: a haystack
    token's logit has standard deviation ``query_norm / sqrt(head_dim)``, the
    needle's is ``query_norm * needle_sigmas * sqrt(m) / sqrt(head_dim)``.
    """

    head_dim: int = 128
    massive_channels: int = 2
    massive_std: float = 200.0
    needle_sigmas: float = 5.0
    query_norm: float = 32.0
    ordinary_read: int = 8  # ordinary channels a query reads when massive_share < 1

    def __post_init__(self) -> None:
        if not 1 <= self.massive_channels < self.head_dim:
            raise ValueError(
                f"massive_channels must be in [1, head_dim={self.head_dim}), "
                f"got {self.massive_channels}"
            )
        for name in ("massive_std", "needle_sigmas", "query_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.ordinary_read < 1:
            raise ValueError(f"ordinary_read must be >= 1, got {self.ordinary_read!r}")

    def keys(self, tokens: int, generator: torch.Generator) -> torch.Tensor:  # (tokens, d)
        k = torch.randn(tokens, self.head_dim, generator=generator)
        k[:, : self.massive_channels] *= self.massive_std
        return k

    def values(self, tokens: int, generator: torch.Generator) -> torch.Tensor:  # N(0, 1)
        return torch.randn(tokens, self.head_dim, generator=generator)

    def needle_keys(self, signs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One needle key per row of ``signs`` (n, m): a haystack key moved onto the query."""
        k = self.keys(signs.shape[0], generator)
        k[:, : self.massive_channels] = self.needle_sigmas * self.massive_std * signs
        return k

    def queries(
        self,
        signs: torch.Tensor,
        massive_share: float = 1.0,
        ordinary_signs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Queries with the needle's signs, (n, head_dim): a share ``massive_share`` of the
        logit's variance from the massive channels, the rest from ``ordinary_read``
        ordinary ones (``ordinary_signs``, (n, ordinary_read)). A haystack logit's
        standard deviation is ``query_norm / sqrt(head_dim)`` whatever the share."""
        m, r = self.massive_channels, self.ordinary_read
        q = torch.zeros(signs.shape[0], self.head_dim)
        length = self.query_norm / self.massive_std * math.sqrt(massive_share)
        q[:, :m] = length * signs / math.sqrt(m)
        if massive_share < 1:
            if ordinary_signs is None:
                raise ValueError("a query with massive_share < 1 needs ordinary_signs")
            if m + r > self.head_dim:
                raise ValueError(
                    f"ordinary_read = {r} does not fit beside {m} massive channels in "
                    f"head_dim = {self.head_dim}: lower ordinary_read"
                )
            rest = self.query_norm * math.sqrt(1 - massive_share)
            q[:, m : m + r] = rest * ordinary_signs / math.sqrt(r)
        return q


@dataclass(frozen=True)
class Calibration:
    """How K and V are stored: fp8 with static per-tensor scales (vLLM's ``k_scale`` /
    ``v_scale``), fp8 with per-token scales, llama.cpp's ``q4_0``, or float32 (neither)."""

    name: str
    k_scale: float | None = None
    v_scale: float | None = None
    per_token: bool = False
    q4_0: bool = False  # llama.cpp's 4-bit blocks of 32 channels per token

    def __post_init__(self) -> None:
        static = (self.k_scale is not None, self.v_scale is not None)
        if static[0] != static[1]:
            raise ValueError(f"{self.name}: give both k_scale and v_scale, or neither")
        if (self.per_token or self.q4_0) and static[0]:
            raise ValueError(f"{self.name}: per_token and q4_0 scales are computed, not given")
        if self.per_token and self.q4_0:
            raise ValueError(f"{self.name}: choose per_token (fp8) or q4_0, not both")

    def store(self, x: torch.Tensor, scale: float | None) -> torch.Tensor:
        """``x`` as the cache holds it, read back to float32."""
        if self.q4_0:
            return quantize_q4_0(x).dequantize()
        if self.per_token:
            return quantize_fp8(x, granularity="token").dequantize()
        if scale is None:
            return x
        return quantize_fp8(x, scale=scale).dequantize()


def calibrate(
    name: str,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    k_divisor: float = FP8_MAX,
    v_divisor: float = FP8_MAX,
) -> Calibration:
    """Static per-tensor scales from calibration data: ``max|x| / divisor`` (see the module doc)."""
    for label, divisor in (("k_divisor", k_divisor), ("v_divisor", v_divisor)):
        if not divisor > 0:
            raise ValueError(f"{label} must be positive, got {divisor!r}")
    return Calibration(
        name,
        k_scale=float(keys.abs().max()) / k_divisor,
        v_scale=float(values.abs().max()) / v_divisor,
    )


@dataclass(frozen=True)
class RecallCurve:
    """Fraction of needles retrieved at each context length, over ``trials`` needles each."""

    name: str
    contexts: tuple[int, ...]
    recall: tuple[float, ...]
    trials: int


def recall_curves(
    contexts: Sequence[int],
    calibrations: Sequence[Calibration],
    *,
    head: Head | None = None,
    haystacks: int = 8,
    needles: int = 32,
    seed: int = 0,
    massive_share: float = 1.0,
) -> dict[str, RecallCurve]:
    """Recall of each calibration at each context, on the same seeded haystacks and needles.

    Each of ``haystacks`` haystacks is drawn once at the longest context; a
    shorter context is its prefix. Each haystack hides ``needles`` needles, one
    at a time, at a uniform position within each context. ``massive_share``:
    the share of the query on the massive channels (:meth:`Head.queries`).
    """
    if not isinstance(massive_share, int | float) or not 0 < massive_share <= 1:
        raise ValueError(f"massive_share must be in (0, 1], got {massive_share!r}")
    head = head or Head()
    contexts = _require_contexts(contexts)
    for name, value in (("haystacks", haystacks), ("needles", needles)):
        require_int(value, name, 1)
    names = [c.name for c in calibrations]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"calibrations need distinct names, got {names}")
    g = torch.Generator().manual_seed(seed)
    hits = {name: [0] * len(contexts) for name in names}
    for _ in range(haystacks):
        keys, values = head.keys(contexts[-1], g), head.values(contexts[-1], g)
        signs = torch.randint(0, 2, (needles, head.massive_channels), generator=g) * 2.0 - 1
        needle_k, needle_v = head.needle_keys(signs, g), head.values(needles, g)
        where = torch.rand(needles, generator=g)
        ordinary = None
        if massive_share < 1:  # drawn last, so a massive-only run keeps its draws
            ordinary = torch.randint(0, 2, (needles, head.ordinary_read), generator=g) * 2.0 - 1
            read = slice(head.massive_channels, head.massive_channels + head.ordinary_read)
            needle_k[:, read] = head.needle_sigmas * ordinary
        queries = head.queries(signs, massive_share, ordinary)
        for cal in calibrations:
            stored = _Stored(cal, keys, values, needle_k, needle_v)
            for i, tokens in enumerate(contexts):
                found = stored.retrieve(queries, (where * tokens).long(), tokens)
                hits[cal.name][i] += int(found.sum())
    trials = haystacks * needles
    return {
        name: RecallCurve(name, tuple(contexts), tuple(h / trials for h in hits[name]), trials)
        for name in names
    }


class _Stored:
    """One haystack and its needles as a calibration stores them."""

    def __init__(
        self,
        cal: Calibration,
        keys: torch.Tensor,
        values: torch.Tensor,
        needle_k: torch.Tensor,
        needle_v: torch.Tensor,
    ) -> None:
        self.keys = cal.store(keys, cal.k_scale)  # (T_max, d)
        self.values = cal.store(values, cal.v_scale)
        self.needle_k = cal.store(needle_k, cal.k_scale)  # (n, d)
        self.needle_v = cal.store(needle_v, cal.v_scale)
        self.clean_values, self.clean_needle_v = values, needle_v

    def retrieve(self, q: torch.Tensor, pos: torch.Tensor, tokens: int) -> torch.Tensor:
        """For each query, whether attention over ``tokens`` tokens returns its needle's value."""
        n, d = q.shape
        rows = torch.arange(n)
        scores = q @ self.keys[:tokens].T / math.sqrt(d)  # (n, T)
        scores[rows, pos] = (q * self.needle_k).sum(dim=1) / math.sqrt(d)
        weights = torch.softmax(scores, dim=1)
        # out = weights @ V with row pos of V replaced by the needle's value
        out = weights @ self.values[:tokens]
        out += weights[rows, pos, None] * (self.needle_v - self.values[pos])  # (n, d)
        match = out @ self.clean_values[:tokens].T  # (n, T): read out against true values
        match[rows, pos] = (out * self.clean_needle_v).sum(dim=1)
        return match.argmax(dim=1) == pos


def tie_recall_bound(head: Head, k_scale: float, contexts: Sequence[int]) -> list[float]:
    """``E[1 / (1 + N)]`` for ``N ~ Binomial(T - 1, p)`` distractors tied with a saturated needle.

    ``p = P(z > 432 k_scale / massive_std)^m``: every massive channel of a
    distractor rounds to the top code, with the query's sign. Valid when the
    needle itself saturates; otherwise no tie exists and the bound is 1.
    """
    contexts = _require_contexts(contexts)
    threshold = _SATURATES_FROM * k_scale
    tail = 0.5 * math.erfc(threshold / head.massive_std / math.sqrt(2))
    p = tail**head.massive_channels
    if head.needle_sigmas * head.massive_std < threshold or p == 0:
        return [1.0 for _ in contexts]
    return [(1 - (1 - p) ** t) / (t * p) for t in contexts]


def _require_contexts(contexts: Sequence[int]) -> list[int]:
    values = list(contexts)
    if not values or any(not is_int(t) or t < 1 for t in values):
        raise ValueError(f"contexts must be positive ints, got {contexts!r}")
    if values != sorted(set(values)):
        raise ValueError(f"contexts must be increasing, got {values}")
    return values
