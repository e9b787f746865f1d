"""Prefill and decode on different engines: the prefill engine computes a prompt and its
first token, hands the prompt's keys and values (the tensors themselves) to the decode
engine, and the decode engine generates the rest (DistServe, Splitwise, vLLM's and
Dynamo's disaggregated serving, in miniature).

The hand-off is a copy of every layer's K and V for the prompt's ``P`` positions, read
through the prefill engine's block table while the request still holds its blocks (its
first token's callback runs before the engine frees them) and written through the block
table the decode engine gives it (:meth:`kvlib.engine.core.Engine.adopt`). Its bytes are
the tensors' own, to be checked against :func:`kvlib.tiers.handoff.handoff`; split by the
KV heads each GPU pair would carry (:func:`kvlib.tiers.handoff.kv_heads_held`,
:func:`~kvlib.tiers.handoff.sender`) they are the per-pair bytes a ``prefill_tp`` to
``decode_tp`` hand-off moves.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from kvlib.engine.core import Engine, EngineConfig, Request, RequestResult, StepClock
from kvlib.nn.decoder import TinyDecoder
from kvlib.tiers.handoff import kv_heads_held, sender

__all__ = ["DisaggregatedEngines", "Handover"]


@dataclass
class Handover:
    """One request's prompt cache in transit: per layer, K and V of shape ``(P, H_kv, d)``."""

    request: Request
    first_token: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        """Bytes of every layer's K and V for the prompt."""
        return sum(t.nbytes for t in self.keys + self.values)

    def bytes_per_gpu_pair(self, prefill_tp: int, decode_tp: int) -> dict[str, int]:
        """The tensors' bytes split by the KV heads each (prefill GPU, decode GPU) pair sends."""
        pairs: Counter[str] = Counter()
        for k, v in zip(self.keys, self.values, strict=True):
            heads = k.shape[1]
            for j in range(decode_tp):
                for h in kv_heads_held(j, heads, decode_tp):
                    pair = f"{sender(h, heads, prefill_tp, j)}->{j}"
                    pairs[pair] += k[:, h].nbytes + v[:, h].nbytes
        return dict(sorted(pairs.items()))


def _slots(table: list[int], block_size: int, positions: int) -> list[int]:
    return [table[p // block_size] * block_size + p % block_size for p in range(positions)]


@dataclass
class DisaggregatedEngines:
    """A prefill engine and a decode engine of the same model, on step clocks."""

    model: TinyDecoder
    prefill_config: EngineConfig
    decode_config: EngineConfig
    handovers: list[Handover] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.decode_config.enable_prefix_caching:
            raise ValueError("decode_config: turn prefix caching off; the decode engine "
                             "receives every prompt's cache whole")
        self.prefill_clock, self.decode_clock = StepClock(), StepClock()
        self.prefill = Engine(self.model, self.prefill_config, clock=self.prefill_clock)
        self.decode = Engine(self.model, self.decode_config, clock=self.decode_clock)

    def _capture(self, request: Request, queue: deque[Handover]) -> Request:
        """The request as the prefill engine runs it: one token, whose callback copies the
        prompt's K and V out before the engine frees the blocks."""
        def on_token(request_id: str, token: int) -> None:
            table = self.prefill.cache.block_table(request_id)
            slots = _slots(table, self.prefill_config.block_size, len(request.prompt))
            kv = self.prefill.kv
            queue.append(Handover(request, token, [k[slots].clone() for k in kv.keys],
                                  [v[slots].clone() for v in kv.values]))
        return replace(request, max_new_tokens=1, on_token=on_token)

    def _adopt(self, handover: Handover) -> bool:
        state = self.decode.adopt(handover.request, [handover.first_token])
        if state is None:
            return False
        request_id = handover.request.request_id
        table = self.decode.cache.block_table(request_id)
        slots = _slots(table, self.decode_config.block_size, len(handover.request.prompt))
        for layer, (k, v) in enumerate(zip(handover.keys, handover.values, strict=True)):
            self.decode.kv.keys[layer][slots] = k
            self.decode.kv.values[layer][slots] = v
        return True

    def run(self, requests: Sequence[Request]) -> list[RequestResult]:
        """Serve ``requests``: prefill on one engine, hand over, decode on the other."""
        queue: deque[Handover] = deque()
        first = {r.request_id: self.prefill.submit(self._capture(r, queue)) for r in requests}
        finished_early: set[str] = set()
        while True:
            prefilling = any(r.finish_s is None and r.error is None for r in first.values())
            if prefilling:
                self.prefill.step(self.prefill_clock.now)
                self.prefill_clock.now += 1.0
            while queue:
                handover = queue[0]
                stops = handover.first_token in handover.request.stop_token_ids
                if handover.request.max_new_tokens == 1 or stops:
                    finished_early.add(handover.request.request_id)
                elif not self._adopt(handover):
                    if not self.decode.scheduler.running:
                        raise RuntimeError(f"request {handover.request.request_id!r} does not "
                                           "fit the decode engine's pool or batch")
                    break
                self.handovers.append(queue.popleft())
            if self.decode.scheduler.has_work:
                self.decode.step(self.decode_clock.now)
                self.decode_clock.now += 1.0
            elif not prefilling and not queue:
                break
        return [first[r.request_id] if (r.request_id in finished_early
                                         or first[r.request_id].error is not None)
                else self.decode.results[r.request_id] for r in requests]
