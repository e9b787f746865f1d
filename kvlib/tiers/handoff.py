"""Prefill on some GPUs, decode on others: the cache a request hands over, who sends which
KV heads, how long it takes, and how many prefill instances a decode instance needs.

A request's cache is every layer's K and V for its ``T`` prompt tokens
(:func:`kvlib.sizing.kv_bytes`; a sliding layer only its window). With tensor
parallelism each side splits a layer's ``H_kv`` heads as vLLM does: ``tp <= H_kv`` gives
GPU ``g`` heads ``[g H_kv / tp, (g + 1) H_kv / tp)``; ``tp > H_kv`` gives each GPU one
head, head ``g // (tp / H_kv)`` (replicated). An MLA latent has no heads to split and
sits whole on every GPU. Each decode GPU receives the heads it will hold, each from one
prefill GPU that holds it (spread over the holders). With ``A`` prefill and ``B`` decode
GPUs the pairs' bytes add up to the cache once when neither side replicates; a replicated
latent crosses once per decode GPU.

Every GPU has its own link (HGX nodes give each GPU its own NIC and NVLink ports), so the
transfer lasts as long as the busiest GPU's share: ``setup_s + max over GPUs of
(bytes it sends or receives) / link_bytes_per_s``.

DistServe (Zhong et al., OSDI 2024, section 4) places prefill and decode instances so
their rates match. One prefill instance finishes a prompt every ``t_prefill(P)``; one
decode instance holding ``B`` requests finishes ``B`` of them every ``O`` steps of
``t_decode(B, P + O/2)``; so a workload needs ``t_prefill x B / (O x t_decode)`` prefill
instances a decode instance. Both times come from the step model (:mod:`kvlib.step`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from kvlib._validate import require_int, require_positive
from kvlib.bounds import tp_error
from kvlib.config import ModelConfig
from kvlib.hardware import GPUSpec
from kvlib.sizing import kv_bytes
from kvlib.specs import CacheSpec
from kvlib.step import ASSUMED_MFU, PrefillChunk, mixed_step, step_time

__all__ = ["Handoff", "InstanceRatio", "handoff", "instance_ratio", "kv_heads_held", "sender",
           "transfer_s"]


def kv_heads_held(gpu: int, heads: int, tp: int) -> list[int]:
    """KV heads GPU ``gpu`` of a ``tp``-way group holds, of a layer's ``heads``: a run of
    ``heads / tp`` of them, or one (replicated) when ``tp > heads``."""
    if tp <= heads:
        share = heads // tp
        return list(range(gpu * share, (gpu + 1) * share))
    return [gpu // (tp // heads)]


def sender(head: int, heads: int, prefill_tp: int, receiver: int) -> int:
    """The prefill GPU that sends KV head ``head`` to decode GPU ``receiver``: its one
    holder, or, where ``prefill_tp > heads`` replicates it, holders taken in turn."""
    if prefill_tp <= heads:
        return head // (heads // prefill_tp)
    copies = prefill_tp // heads
    return head * copies + receiver % copies


def _layer_pairs(
    spec: CacheSpec, tokens: int, kv_dtype: str, a: int, b: int
) -> Counter[tuple[int, int]]:
    """Bytes each (prefill GPU, decode GPU) pair sends for one layer."""
    layer_bytes = spec.bytes_for_context(tokens, kv_dtype)
    pairs: Counter[tuple[int, int]] = Counter()
    if layer_bytes == 0:
        return pairs
    heads = spec.kv_heads
    if heads is None:
        if spec.tp_share(2) != 1:
            raise ValueError(f"{type(spec).__name__}: the hand-off of a state split across "
                             "GPUs is not modelled")
        for j in range(b):  # replicated whole on every GPU: one sender a receiver
            pairs[(j % a, j)] += layer_bytes
        return pairs
    per_head = layer_bytes // heads
    for j in range(b):
        for h in kv_heads_held(j, heads, b):
            pairs[(sender(h, heads, a, j), j)] += per_head
    return pairs


@dataclass(frozen=True)
class Handoff:
    """One request's cache handed from ``prefill_tp`` GPUs to ``decode_tp`` GPUs."""

    prompt_tokens: int
    prefill_tp: int
    decode_tp: int
    transfer_bytes: int  # the request's cache, every layer, K and V, once
    bytes_per_gpu_pair: dict[str, int]  # "i->j": bytes prefill GPU i sends decode GPU j
    wire_bytes: int  # the pairs' bytes added (more than transfer_bytes where replicated)
    busiest_gpu_bytes: int  # the most any one GPU sends or receives


def handoff(
    cfg: ModelConfig, prompt_tokens: int, *, prefill_tp: int = 1, decode_tp: int = 1,
    kv_dtype: str = "bf16",
) -> Handoff:
    """Who sends which bytes when a prompt's cache moves between the two groups (module
    doc); raises ValueError (one line) for a TP degree the model's heads do not allow."""
    require_int(prompt_tokens, "prompt_tokens", 1)
    for name, tp in (("prefill_tp", prefill_tp), ("decode_tp", decode_tp)):
        require_int(tp, name, 1)
        error = tp_error(cfg, tp)
        if error:
            raise ValueError(f"{name}: {error}")
    pairs: Counter[tuple[int, int]] = Counter()
    for spec in cfg.layers:
        pairs.update(_layer_pairs(spec, prompt_tokens, kv_dtype, prefill_tp, decode_tp))
    sent: Counter[int] = Counter()
    received: Counter[int] = Counter()
    for (i, j), n in pairs.items():
        sent[i] += n
        received[j] += n
    return Handoff(
        prompt_tokens=prompt_tokens, prefill_tp=prefill_tp, decode_tp=decode_tp,
        transfer_bytes=kv_bytes(cfg, prompt_tokens, kv_dtype),
        bytes_per_gpu_pair={f"{i}->{j}": n for (i, j), n in sorted(pairs.items())},
        wire_bytes=sum(pairs.values()),
        busiest_gpu_bytes=max([*sent.values(), *received.values(), 0]),
    )


def transfer_s(plan: Handoff, bytes_per_s: float, setup_s: float = 0.0) -> float:
    """``setup_s + busiest GPU's bytes / bytes_per_s``: every GPU sends on its own link."""
    require_positive(bytes_per_s, "bytes_per_s")
    return setup_s + plan.busiest_gpu_bytes / bytes_per_s


@dataclass(frozen=True)
class InstanceRatio:
    """DistServe's rate balance for one workload (module doc); times from the step model."""

    prefill_s: float  # one prompt's prefill on a prefill instance
    decode_step_s: float  # one step of B decodes at the mean context P + O // 2
    prefill_requests_per_s: float
    decode_requests_per_s: float

    @property
    def prefill_per_decode(self) -> float:
        """Prefill instances a decode instance needs: decode rate over prefill rate."""
        return self.decode_requests_per_s / self.prefill_requests_per_s


def instance_ratio(
    cfg: ModelConfig, gpu: GPUSpec, prompt_tokens: int, output_tokens: int, decode_batch: int,
    *, mfu: float = ASSUMED_MFU, tp: int = 1, kv_dtype: str = "bf16",
) -> InstanceRatio:
    """Rates of one prefill and one decode instance of ``tp`` GPUs each for prompts of
    ``P`` and replies of ``O`` tokens, ``B`` requests decoding at once."""
    require_int(output_tokens, "output_tokens", 1)
    require_int(decode_batch, "decode_batch", 1)
    prefill = step_time(cfg, gpu, (), [PrefillChunk(prompt_tokens)], mfu=mfu, tp=tp,
                        kv_dtype=kv_dtype).total_s
    step = mixed_step(cfg, gpu, decode_batch, prompt_tokens + output_tokens // 2, mfu=mfu,
                      tp=tp, kv_dtype=kv_dtype).total_s
    return InstanceRatio(prefill, step, 1 / prefill, decode_batch / (output_tokens * step))
