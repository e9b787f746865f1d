"""One derived, cached view of a model config: what every chapter reads off it.

A :class:`~kvlib.config.ModelConfig` is frozen, so whatever is derived from it can be
worked out once and kept. :func:`model_view` returns the one :class:`ModelView` of a
config (cached on the config); each figure below is computed on first use and kept:

- the weight tensors (:func:`kvlib.weights.layouts.weight_groups`), the parameter
  counts read off them, and per weight dtype (or as shipped) the bytes of all of
  them, of those a decode step does not read, and of the routed experts;
- the bytes of the weights on each GPU under tensor parallelism, as vLLM places
  them (:meth:`ModelView.weight_bytes_per_gpu`) and the weight bytes one decode
  step reads on each GPU (:meth:`ModelView.step_weight_bytes_per_gpu`), and both under
  data-parallel attention with expert parallelism
  (:meth:`ModelView.dp_weight_bytes_per_gpu`, :meth:`ModelView.dp_step_weight_bytes_per_gpu`);
- the valid tensor-parallel degrees (:meth:`ModelView.tp_degrees`).

:mod:`kvlib.weights.params`, :mod:`kvlib.bounds`, :mod:`kvlib.paging.step_bytes`,
:mod:`kvlib.mla.placement`, :mod:`kvlib.capacity` and ``kvlib size`` read these; none
recomputes them.

Where vLLM keeps a tensor whole on every tensor-parallel rank (read in vLLM's source:
``vllm/model_executor/layers/linear.py`` at commit ``0036d38de46c``,
``vllm/model_executor/models/deepseek_v2.py`` at ``002d6073aa03``,
``vllm/model_executor/models/gpt2.py`` at ``017689429418``):

- norms (``RMSNorm``, ``nn.LayerNorm``): built at full size on every rank;
- the MoE router (``GateLinear``, a ``ReplicatedLinear``; gpt-oss's router likewise);
- DeepSeek's MLA down-projections: ``fused_qkv_a_proj`` (``q_a_proj`` and
  ``kv_a_proj_with_mqa`` merged with ``disable_tp=True``), or ``kv_a_proj_with_mqa``
  alone as a ``ReplicatedLinear`` when ``q_lora_rank`` is None;
- the bias of a row-parallel linear (``o_proj``, ``down_proj``, ``c_proj``, ``dense``,
  ``fc2``, ``out_proj``:
  "bias is not parallelized", ``RowParallelLinear``), and of the experts' down
  projection (``w2_bias``, ``(num_experts, hidden_size)`` on every rank:
  ``Mxfp4MoEMethod.create_weights``, ``vllm/model_executor/layers/quantization/mxfp4.py``
  at ``007d50058a06``);
- position-embedding tables (GPT-2's ``wpe`` is an ``nn.Embedding``);
- K and V projections once ``tp`` exceeds the KV heads: each rank holds one head
  (``QKVParallelLinear``'s ``num_kv_head_replicas``).

The token embedding and the LM head are vocab-parallel (``VocabParallelEmbedding``,
``ParallelLMHead``): their rows are padded to a multiple of 64
(``DEFAULT_VOCAB_PADDING_SIZE``, ``pad_vocab_size``) and split ``tp`` ways. Every
other tensor is split ``tp`` ways (column- or row-parallel, experts along their
intermediate size). A fused QKV tensor (Falcon's ``query_key_value``) is split evenly,
which is exact while ``tp`` does not exceed the KV heads. Not modelled: the padding some
MoE kernels give each rank's expert width (``round_up(intermediate / tp, 64)`` or more
in ``Mxfp4MoEMethod``, by kernel backend): for gpt-oss at ``tp > 1`` the figures here
are a lower bound.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TypeVar, cast

from kvlib._validate import cdiv, require_int
from kvlib.config import ConfigError, ModelConfig
from kvlib.dtypes import bytes_for, require_dtype
from kvlib.specs import CacheSpec
from kvlib.weights.layouts import UnknownLayout, WeightGroup, weight_groups
from kvlib.weights.quantized import ShippedWeights, shipped_bytes

__all__ = [
    "VOCAB_PADDING",
    "ModelView",
    "WeightTotals",
    "expected_experts_touched",
    "group_bytes",
    "model_view",
]

_T = TypeVar("_T")

VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE (vocab_parallel_embedding.py)

# Module names of tensors vLLM keeps whole on every tensor-parallel rank.
_REPLICATED_MODULES = (".q_a_proj.", ".kv_a_proj_with_mqa.")
# Row-parallel linears (their input is split, their output and bias are not).
_ROW_PARALLEL = (".o_proj.", ".down_proj.", ".c_proj.", ".dense.", ".dense_4h_to_h.", ".fc2.",
                 ".out_proj.")
_KV_PROJECTIONS = (".k_proj.", ".v_proj.")


@dataclass(frozen=True)
class WeightTotals:
    """Bytes of a model's weights at one precision (or as shipped)."""

    all: int  # every tensor the checkpoint holds
    unread: int  # tables a text decode step only looks rows up in, and vision towers
    experts: int  # the routed experts (0 for a dense model)


def expected_experts_touched(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Experts a layer reads for ``tokens`` tokens routed uniformly at random:
    ``E x (1 - (1 - k / E) ** B)`` (each expert is missed by a token with
    probability ``1 - k / E``). Uniform routing spreads tokens the most: a skewed
    router touches fewer distinct experts on average, so this is an upper bound
    on the expected count of a real router.
    """
    require_int(num_experts, "num_experts", 1)
    require_int(experts_per_token, "experts_per_token", 1)
    require_int(tokens, "tokens", 1)
    return num_experts * (1 - (1 - experts_per_token / num_experts) ** tokens)


def group_bytes(cfg: ModelConfig, groups: Sequence[WeightGroup], weight_dtype: str | None) -> int:
    """Bytes of some of a model's tensors, at ``weight_dtype`` or as shipped (None)."""
    if weight_dtype is not None:
        return bytes_for(sum(g.count for g in groups), weight_dtype)
    shipped = _as_shipped(cfg, groups)
    if shipped.bytes is None:
        raise ConfigError(shipped.note)
    return shipped.bytes


def _as_shipped(cfg: ModelConfig, groups: Sequence[WeightGroup]) -> ShippedWeights:
    base = require_dtype(cfg.dtype or "bf16")
    if cfg.quantization is None:
        return ShippedWeights(bytes_for(sum(g.count for g in groups), base), base)
    return shipped_bytes(groups, cfg.quantization, base)


@dataclass(frozen=True)
class _Placed:
    """One tensor group on ``tp`` ranks: ``share`` of ``placed`` (the group, its rows
    padded where vLLM pads them) on each rank; ``share`` 1 is kept whole."""

    group: WeightGroup
    placed: WeightGroup
    share: Fraction


@dataclass(frozen=True)
class ModelView:
    """Everything derived from one model config, computed once. Get it with
    :func:`model_view`; each method caches its answer per argument."""

    cfg: ModelConfig
    _memo: dict[tuple[object, ...], object] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def memo(self, key: tuple[object, ...], make: Callable[[], _T]) -> _T:
        """``make()`` the first time ``key`` is asked for, the kept answer after: the hook
        by which a module above this one (the paging pools, say) keeps what it derives from
        a config on the config's one view instead of working it out again."""
        if key not in self._memo:
            self._memo[key] = make()
        return cast(_T, self._memo[key])

    @functools.cached_property
    def layer_groups(self) -> tuple[tuple[CacheSpec, int], ...]:
        """Each distinct layer cache spec and how many layers have it, in first-seen order.

        A sum over layers is a sum over these pairs, ``count x term(spec)``: a dense model
        has one spec for all its layers, so the step model's per-layer sums, evaluated
        millions of times in a simulation, do one layer's arithmetic instead of 32-126.
        """
        return tuple(Counter(self.cfg.layers).items())

    @functools.cached_property
    def groups(self) -> tuple[WeightGroup, ...]:
        """Every weight tensor (:func:`kvlib.weights.layouts.weight_groups`)."""
        return weight_groups(self.cfg)

    @functools.cached_property
    def param_count(self) -> int:
        """Every parameter a checkpoint holds: embeddings, layers, norms, LM head, towers."""
        return sum(g.count for g in self.groups)

    @functools.cached_property
    def active_param_count(self) -> int:
        """Parameters one text token is multiplied through, LM head included and the
        input embedding (a lookup) left out: the ``k`` routed experts of a MoE layer,
        not a vision tower (:func:`kvlib.weights.params.active_param_count`)."""
        text = [g for g in self.groups if g.part == "text"]
        active = sum(g.active_count for g in text if g.role != "embedding")
        return active + self._tied_head_params

    @functools.cached_property
    def matmul_params(self) -> tuple[int, int]:
        """``(body, lm_head)``: the active linear, expert and router matrices one text
        token goes through, and the output projection (the embedding table when tied).
        ``body + lm_head`` is :attr:`active_param_count` less the 1-D tensors (norms,
        biases) and other non-matmul parameters."""
        text = [g for g in self.groups if g.part == "text"]
        matmul = ("linear", "expert", "router")
        body = sum(g.active_count for g in text if g.role in matmul and len(g.shape) == 2)
        head = sum(g.count for g in text if g.role == "lm_head") + self._tied_head_params
        return body, head

    @property
    def _tied_head_params(self) -> int:
        if not self.cfg.tie_word_embeddings:
            return 0
        return (self.cfg.vocab_size or 0) * self.cfg.hidden_size  # the LM head multiplies by it

    @functools.cached_property
    def unread_groups(self) -> tuple[WeightGroup, ...]:
        """Tensors a text decode step does not read: the input (and position) embedding
        tables, of which it looks up one row a token, unless the token table is also the
        LM head (tied); and any vision tower, which runs once per image."""
        unread = [g for g in self.groups if g.part == "vision" or g.role == "embedding"]
        if self.cfg.tie_word_embeddings:
            table = (self.cfg.vocab_size or 0, self.cfg.hidden_size)
            tied = next((g for g in unread if g.role == "embedding" and g.shape == table), None)
            if tied is not None:
                unread.remove(tied)
        return tuple(unread)

    @functools.cached_property
    def expert_groups(self) -> tuple[WeightGroup, ...]:
        """The routed experts: tensors stored once per expert in a layer."""
        return tuple(g for g in self.groups if g.copies_per_layer > 1)

    def shipped(self) -> ShippedWeights:
        """The weights as the checkpoint stores them (``quantization_config``, then
        ``torch_dtype``), or unknown bytes with the reason."""
        try:
            groups = self.groups
        except UnknownLayout as err:
            return ShippedWeights(None, "unknown", str(err))
        return self.memo(("shipped",), lambda: _as_shipped(self.cfg, groups))

    def _bytes(self, groups: Sequence[WeightGroup], weight_dtype: str | None) -> int:
        """:func:`group_bytes`, with each group's as-shipped bytes worked out once (a
        quantized format prices every layer's copy by name; the sums are additive)."""
        if weight_dtype is not None:
            return group_bytes(self.cfg, groups, weight_dtype)
        total = 0
        for g in groups:
            priced = functools.partial(_priced, self.cfg, g)
            total += self.memo(("shipped-group", id(g)), priced)[1]
        return total

    def weights(self, weight_dtype: str | None = "bf16") -> WeightTotals:
        """:class:`WeightTotals` at ``weight_dtype``, or as shipped (None)."""
        dtype = None if weight_dtype is None else require_dtype(weight_dtype)

        def make() -> WeightTotals:
            return WeightTotals(
                all=self._bytes(self.groups, dtype),
                unread=self._bytes(self.unread_groups, dtype),
                experts=self._bytes(self.expert_groups, dtype),
            )

        return self.memo(("weights", dtype), make)

    def tp_degrees(self, max_tp: int = 8) -> list[int]:
        """Tensor-parallel degrees up to ``max_tp`` that split the heads evenly.

        vLLM requires ``num_attention_heads % tp == 0``; KV heads are split when
        ``num_key_value_heads % tp == 0`` and replicated when ``tp % num_key_value_heads
        == 0`` (``QKVParallelLinear``).
        """
        require_int(max_tp, "max_tp", 1)

        def make() -> tuple[int, ...]:
            kv_heads = {layer.kv_heads for layer in self.cfg.layers if layer.kv_heads is not None}
            return tuple(
                tp
                for tp in range(1, max_tp + 1)
                if self.cfg.num_attention_heads % tp == 0
                and all(h % tp == 0 or tp % h == 0 for h in kv_heads)
            )

        return list(self.memo(("tp", max_tp), make))

    def tp_error(self, tp: int) -> str | None:
        """Why ``tp`` cannot serve this model (one line naming the fix), or None."""
        require_int(tp, "tp", 1)
        return self.memo(("tp_error", tp), lambda: self._tp_error(tp))

    def _tp_error(self, tp: int) -> str | None:
        heads = self.cfg.num_attention_heads
        if tp > heads:  # no degree above the head count splits the heads
            return (f"tp={tp} is more GPUs than the {heads} attention heads of "
                    f"{self.cfg.name}: use one of {self.tp_degrees(max_tp=min(heads, 8))}")
        if tp in self.tp_degrees(max_tp=tp):
            return None
        return (
            f"tp={tp} does not split the {self.cfg.num_attention_heads} attention heads and "
            f"{self.cfg.num_key_value_heads} KV heads of {self.cfg.name} evenly: use one of "
            f"{self.tp_degrees(max_tp=max(tp, 8))}"
        )

    def _placement(self, tp: int) -> tuple[_Placed, ...]:
        def make() -> tuple[_Placed, ...]:
            kv_heads = self.cfg.num_key_value_heads
            placed = []
            for g in self.groups:
                if _kept_whole(g):
                    placed.append(_Placed(g, g, Fraction(1)))
                elif kv_heads < tp and any(m in g.module for m in _KV_PROJECTIONS):
                    placed.append(_Placed(g, g, Fraction(1, kv_heads)))  # one head a rank
                else:
                    padded = _vocab_padded(g, self.cfg.vocab_size)
                    placed.append(_Placed(g, padded, Fraction(1, tp)))
            return tuple(placed)

        return self.memo(("placement", tp), make)

    def _per_gpu(self, groups: Iterable[WeightGroup], tp: int, weight_dtype: str | None) -> int:
        """Bytes of ``groups`` on each of ``tp`` ranks, placed as vLLM places them: the
        split tensors summed, then divided (``cdiv``) once."""
        chosen = {id(g) for g in groups}
        mine = [p for p in self._placement(tp) if id(p.group) in chosen]
        whole = [p.placed for p in mine if p.share == 1]
        split = [p.placed for p in mine if p.share == Fraction(1, tp) and p.share != 1]
        shares = [p for p in mine if p.share not in (1, Fraction(1, tp))]
        return (
            self._bytes(whole, weight_dtype)
            + cdiv(self._bytes(split, weight_dtype), tp)
            + sum(
                math.ceil(self._bytes([p.placed], weight_dtype) * p.share)
                for p in shares
            )
        )

    def weight_bytes_per_gpu(self, tp: int = 1, weight_dtype: str | None = "bf16") -> int:
        """Weight bytes on each of ``tp`` tensor-parallel GPUs: the replicated tensors
        whole, the vocab-parallel tables padded to 64 rows and split, the rest split
        (see the module's docstring for vLLM's rules)."""
        require_int(tp, "tp", 1)
        dtype = None if weight_dtype is None else require_dtype(weight_dtype)
        return self.memo(
            ("per_gpu", tp, dtype), lambda: self._per_gpu(self.groups, tp, dtype)
        )

    def step_weight_bytes_per_gpu(
        self, tokens: int, tp: int = 1, weight_dtype: str | None = "bf16"
    ) -> int:
        """Weight bytes a forward pass over ``tokens`` tokens reads on each of ``tp`` GPUs
        (a decode step of a batch of ``tokens`` sequences, or a prompt's prefill).

        Every weight it multiplies by, once, where it sits (:meth:`weight_bytes_per_gpu`),
        less the tables it only looks rows up in and vision towers; of a mixture-of-experts
        layer only the experts its ``tokens`` are routed to: the expected number under
        uniform routing (:func:`expected_experts_touched`) of the ``E`` experts' bytes.
        """
        require_int(tokens, "tokens", 1)
        require_int(tp, "tp", 1)
        dtype = None if weight_dtype is None else require_dtype(weight_dtype)

        def make() -> int:
            unread = {id(g) for g in self.unread_groups}
            experts = {id(g) for g in self.expert_groups}
            rest = [g for g in self.groups if id(g) not in unread | experts]
            read = self._per_gpu(rest, tp, dtype)
            moe = self.cfg.moe
            if moe is None or not self.expert_groups:
                return read
            expert_bytes = self._per_gpu(self.expert_groups, tp, dtype)
            touched = expected_experts_touched(moe.num_experts, moe.experts_per_token, tokens)
            return read + math.ceil(expert_bytes * touched / moe.num_experts)

        return self.memo(("step", tokens, tp, dtype), make)

    def dp_weight_bytes_per_gpu(self, gpus: int, weight_dtype: str | None = "bf16") -> int:
        """Weight bytes on each of ``gpus`` GPUs under data-parallel attention with expert
        parallelism (vLLM ``-dp N --enable-expert-parallel``): the routed experts split
        ``gpus`` ways (``cdiv`` of their bytes), every other tensor whole on every GPU as
        one GPU holds it (:meth:`weight_bytes_per_gpu` at ``tp = 1``: the vocab-parallel
        tables padded to 64 rows, as ``pad_vocab_size`` pads them at any degree)."""
        require_int(gpus, "gpus", 1)
        dtype = None if weight_dtype is None else require_dtype(weight_dtype)

        def make() -> int:
            experts = {id(g) for g in self.expert_groups}
            whole = [g for g in self.groups if id(g) not in experts]
            return self._per_gpu(whole, 1, dtype) + cdiv(self._bytes(self.expert_groups, dtype),
                                                         gpus)

        return self.memo(("dp", gpus, dtype), make)

    def dp_step_weight_bytes_per_gpu(
        self, tokens: int, gpus: int, weight_dtype: str | None = "bf16"
    ) -> int:
        """Weight bytes one of ``gpus`` data-parallel GPUs (:meth:`dp_weight_bytes_per_gpu`)
        reads in a step of ``tokens`` tokens of its own, every GPU stepping with as many.

        Its whole tensors, less the tables it only looks rows up in and vision towers, once;
        of its ``E / gpus`` experts those the node's ``gpus x tokens`` tokens are routed to
        (expert parallelism sends each token to the GPU holding its expert): the expected
        fraction under uniform routing (:func:`expected_experts_touched` over ``E``) of its
        share of the experts' bytes. ``gpus = 1`` is :meth:`step_weight_bytes_per_gpu` at
        ``tp = 1``.
        """
        require_int(tokens, "tokens", 1)
        require_int(gpus, "gpus", 1)
        dtype = None if weight_dtype is None else require_dtype(weight_dtype)

        def make() -> int:
            skipped = {id(g) for g in self.unread_groups + self.expert_groups}
            read = self._per_gpu([g for g in self.groups if id(g) not in skipped], 1, dtype)
            moe = self.cfg.moe
            if moe is None or not self.expert_groups:
                return read
            share = cdiv(self._bytes(self.expert_groups, dtype), gpus)
            touched = expected_experts_touched(moe.num_experts, moe.experts_per_token,
                                               gpus * tokens)
            return read + math.ceil(share * touched / moe.num_experts)

        return self.memo(("dp-step", tokens, gpus, dtype), make)


def _priced(cfg: ModelConfig, group: WeightGroup) -> tuple[WeightGroup, int]:
    """``group`` and its bytes as shipped (the group kept alive beside its ``id``)."""
    return group, group_bytes(cfg, [group], None)


def _kept_whole(group: WeightGroup) -> bool:
    """Whether vLLM holds ``group`` whole on every tensor-parallel rank."""
    if group.role in ("router", "norm") or _position_table(group):
        return True
    if any(name in group.module for name in _REPLICATED_MODULES):
        return True
    if group.role != "bias":
        return False
    return any(name in group.module for name in _ROW_PARALLEL) or group.module.endswith(
        ".down_proj_bias"
    )


def _position_table(group: WeightGroup) -> bool:
    """A learned position-embedding table (GPT-2's ``wpe``), an ``nn.Embedding`` in vLLM."""
    return group.role == "embedding" and ".wpe." in group.module


def _vocab_padded(group: WeightGroup, vocab_size: int | None) -> WeightGroup:
    """A vocab-parallel table with its rows padded as vLLM pads them (``pad_vocab_size``)."""
    vocab_parallel = group.role in ("embedding", "lm_head") or group.module == "lm_head.bias"
    if not vocab_parallel or not vocab_size or group.shape[0] != vocab_size:
        return group
    rows = cdiv(vocab_size, VOCAB_PADDING) * VOCAB_PADDING
    return dataclasses.replace(group, shape=(rows, *group.shape[1:]))


@functools.lru_cache(maxsize=64)
def model_view(cfg: ModelConfig) -> ModelView:
    """The one :class:`ModelView` of ``cfg`` (a frozen config: cached on it)."""
    return ModelView(cfg)
