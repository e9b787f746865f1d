"""The engine's clock on a named GPU: each step's time from the step model.

The engine runs a small model on the CPU, so its wall time says nothing about a GPU.
:class:`GpuClock` prices every step the scheduler plans as one step of a real model
(by default the course's Llama-3.1-8B) on a named GPU (by default chapter 5's H100-SXM),
with :func:`kvlib.step.step_time`, the one place kvlib computes a step's time:

- each decode chunk is a sequence reading its cache of ``start`` tokens (the tokens
  computed before this step) and adding one;
- each prefill chunk (a prompt, part of one, or a preempted sequence recomputed) is a
  :class:`kvlib.step.PrefillChunk` of its tokens after ``start`` already cached, ending
  its prompt when it samples a token.

So a step that carries a long prompt chunk beside the decodes takes longer, and every
sequence decoding in that step waits for it: the inter-token spike a large token budget
(``max_num_batched_tokens``) buys. A preemption costs the recompute of the victim's
tokens, priced as the extra time its chunks add to the steps that carry them.

MFU is the step model's stated assumption (:data:`kvlib.step.ASSUMED_MFU`); the times are
lower bounds, as the step model's are (no kernel launch or scheduler gap).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib.config import ModelConfig, load_config
from kvlib.engine.scheduler import Plan
from kvlib.hardware import GPUSpec, get_gpu
from kvlib.step import ASSUMED_MFU, PrefillChunk, step_time

__all__ = ["DEFAULT_GPU", "DEFAULT_MODEL", "GpuClock", "StepCost"]

DEFAULT_GPU = "H100-SXM"  # chapter 5's GPU
DEFAULT_MODEL = "Llama-3.1-8B"  # chapter 5's model


@dataclass(frozen=True)
class StepCost:
    """One step's modelled time, and the part of it spent recomputing preempted sequences
    (the step's time less the same step without their chunks)."""

    step_s: float
    recompute_s: float
    recompute_tokens: int


@dataclass(frozen=True)
class GpuClock:
    """Prices a :class:`kvlib.engine.scheduler.Plan` as one step of ``cfg`` on ``gpu``."""

    cfg: ModelConfig
    gpu: GPUSpec
    mfu: float = ASSUMED_MFU

    @classmethod
    def named(cls, model: str = DEFAULT_MODEL, gpu: str = DEFAULT_GPU,
              mfu: float = ASSUMED_MFU) -> GpuClock:
        """The clock for a bundled model config and a GPU row of :mod:`kvlib.hardware`."""
        return cls(load_config(model), get_gpu(gpu), mfu)

    def cost(self, plan: Plan) -> StepCost:
        """The step's modelled seconds, and the recompute share of them."""
        decoding = {id(seq) for seq in plan.decode}
        contexts: list[int] = []
        fresh: list[PrefillChunk] = []
        recompute: list[PrefillChunk] = []
        for chunk in plan.chunks:
            if id(chunk.seq) in decoding:
                contexts.append(chunk.start)
                continue
            piece = PrefillChunk(chunk.num_tokens, chunk.start, last=chunk.samples)
            # A sequence preempted before recomputes its prompt and its generated tokens.
            (recompute if chunk.seq.preemptions else fresh).append(piece)
        whole = self._seconds(contexts, fresh + recompute)
        if not recompute:
            return StepCost(whole, 0.0, 0)
        without = self._seconds(contexts, fresh) if contexts or fresh else 0.0
        return StepCost(whole, whole - without, sum(c.tokens for c in recompute))

    def _seconds(self, contexts: list[int], chunks: list[PrefillChunk]) -> float:
        return step_time(self.cfg, self.gpu, contexts, chunks, mfu=self.mfu).total_s

    @property
    def label(self) -> str:
        """``"Llama-3.1-8B on H100-SXM at MFU 0.6"``: what the modelled times price."""
        return f"{self.cfg.name} on {self.gpu.name} at MFU {self.mfu:g}"
