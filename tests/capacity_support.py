"""The scenario the capacity tests share (``tests/unit/test_capacity_*.py``)."""

from __future__ import annotations

import dataclasses

from kvlib.capacity.scenario import Scenario
from kvlib.config import load_config
from kvlib.hardware import get_gpu

LLAMA8 = load_config("Llama-3.1-8B")
H100 = get_gpu("H100-SXM")


def rag(**changes: object) -> Scenario:
    """Llama-3.1-8B on one H100: 6,000-token prompts (2,000 of them a shared system
    prompt), 500-token replies (6,500 tokens: 407 blocks of 16, the last one partly
    filled), 128 in flight; ``changes`` replace fields."""
    base = Scenario(
        model=LLAMA8,
        gpu=H100,
        prompt_tokens=6_000,
        output_tokens=500,
        concurrency=128,
        needed_context_tokens=8_192,
        shared_prefix_tokens=2_000,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
