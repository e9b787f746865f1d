"""The deployments chapter 7 works through, bundled so that pages, problems and tests share them.

- :func:`document_assistant`: the chapter's scenario, KV-bound. Llama-3.1-8B on one
  H100-SXM, 4,000-token prompts of which 2,000 are a system prompt every request shares,
  1,000-token replies, 128 conversations in flight. Its pool holds fewer sequences than
  the traffic keeps in flight, and its engine steps spend more time reading (the cache,
  the weights) than computing at the stated model FLOPs utilization: memory-bound
  (:attr:`kvlib.capacity.assessment.Capacity.bound_by`).
- :func:`retrieval_heavy`: the same model and card with 6,000-token prompts and
  500-token replies. Its pool is just as full, yet each generated token comes with
  twelve prompt tokens of prefill (6,000 / 500), and the steps' arithmetic takes longer
  than their reads: the other regime, which the same metrics cannot tell apart from the
  first (the chapter's signature page shows how to).

Each comes with the model a "fewer bytes per token" remedy would switch to.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvlib.capacity.scenario import Scenario
from kvlib.config import ModelConfig, load_config
from kvlib.hardware import get_gpu

__all__ = [
    "BUNDLED_NAMES", "BundledScenario", "bundled_scenarios", "document_assistant",
    "retrieval_heavy",
]

# The names of :func:`bundled_scenarios`, in its order: what a command line lists without
# reading three model configs to build them.
BUNDLED_NAMES = ("document assistant", "retrieval-heavy")


@dataclass(frozen=True)
class BundledScenario:
    """A named scenario, what it shows, and a model with fewer KV bytes per token."""

    name: str
    shows: str
    scenario: Scenario
    alternative: ModelConfig | None


def document_assistant() -> Scenario:
    """The chapter's KV-bound deployment (see the module docstring)."""
    return Scenario(
        model=load_config("Llama-3.1-8B"),  # bf16 weights, as shipped
        gpu=get_gpu("H100-SXM"),
        prompt_tokens=4_000,  # the documents and the question...
        shared_prefix_tokens=2_000,  # ...after a system prompt every request shares
        output_tokens=1_000,
        concurrency=128,  # conversations in flight (arrival rate x time in the engine)
        needed_context_tokens=8_192,  # the longest request the product accepts
    )


def retrieval_heavy() -> Scenario:
    """Long prompts, short replies: the pool is full, and prefill arithmetic holds the steps."""
    return dataclasses.replace(document_assistant(), prompt_tokens=6_000, output_tokens=500)


def bundled_scenarios() -> tuple[BundledScenario, ...]:
    """Every scenario the course bundles, each with its alternative model."""
    oss = load_config("gpt-oss-20b")
    assistant, retrieval = BUNDLED_NAMES
    return (
        BundledScenario(assistant, "KV-bound: the steps are memory-bound",
                        document_assistant(), oss),
        BundledScenario(retrieval, "compute-bound: prefill arithmetic holds the steps",
                        retrieval_heavy(), oss),
    )
