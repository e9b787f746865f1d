"""How much of a KV cache holds token states: reservation policies against paging.

A seeded simulation of a saturated server (every request queued at step 0,
admitted first come first served while memory lasts, one output token per
running request per step), after the PagedAttention paper (Kwon et al.,
"Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023, section 3 and Figure 2). Policies:

- ``"max"``: reserve ``max_seq_len`` slots per request (Orca (Max));
- ``"pow2"``: the prompt plus the output rounded up to a power of two, at
  most twice the output (Orca (Pow2): "if the true output length is 25, it
  reserves 32 positions");
- ``"oracle"``: exactly prompt + output, known in advance (Orca (Oracle));
- ``"paged"``: blocks of ``block_size`` slots taken one at a time as tokens
  arrive, the last admitted request preempted when none is free (vLLM's
  ``Scheduler.schedule`` in ``vllm/v1/core/sched/scheduler.py``, read at commit
  ``00024d314514``; :func:`~kvlib.paging.fragmentation.paged.simulate_paged`).

Reservations are contiguous and placed first fit in one address space, so
freed holes too small for the next request are external fragmentation. A
request holds ``prompt + k`` token states during its ``k``-th step (the slot
of the token that step produces counts as filled). Shares are time averages
over the steps in which requests are waiting (the memory-bound regime),
split the way the paper's Figure 3 splits memory (:class:`MemoryShares`).
"""

from __future__ import annotations

from kvlib._validate import cdiv, require_int
from kvlib.paging.fragmentation.paged import simulate_paged
from kvlib.paging.fragmentation.reserved import (
    RESERVATION_POLICIES,
    FirstFit,
    reservation_tokens,
    simulate_reserved,
)
from kvlib.paging.fragmentation.shares import MemoryShares
from kvlib.paging.fragmentation.workload import (
    ALPACA_LIKE,
    SHAREGPT_LIKE,
    LengthDistribution,
    LengthMix,
    RequestLengths,
    sample_requests,
)

__all__ = [
    "ALPACA_LIKE",
    "POLICIES",
    "SHAREGPT_LIKE",
    "FirstFit",
    "LengthDistribution",
    "LengthMix",
    "MemoryShares",
    "RequestLengths",
    "reservation_tokens",
    "sample_requests",
    "simulate",
]

POLICIES = (*RESERVATION_POLICIES, "paged")


def simulate(
    requests: list[RequestLengths],
    policy: str,
    capacity_tokens: int,
    *,
    block_size: int = 16,
    max_seq_len: int = 2048,
    max_num_seqs: int = 256,
    timeline: bool = False,
) -> MemoryShares:
    """Serve ``requests`` with ``policy`` in a KV cache of ``capacity_tokens`` slots.

    ``block_size`` applies to ``"paged"``; ``max_seq_len`` is what ``"max"``
    reserves (and caps ``"pow2"``); at most ``max_num_seqs`` requests run at
    once (256: vLLM's default on GPUs under 70 GiB and on A100s; 1,024 on larger
    ones in v1-engine releases). ``timeline=True`` keeps every step's counts.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    require_int(capacity_tokens, "capacity_tokens", 1)
    require_int(block_size, "block_size", 1)
    require_int(max_seq_len, "max_seq_len", 1)
    require_int(max_num_seqs, "max_num_seqs", 1)
    if not requests:
        raise ValueError("requests is empty: draw some with sample_requests()")
    longest = max(r.final_tokens for r in requests)
    if longest > max_seq_len:
        raise ValueError(f"a request of {longest:,} tokens exceeds max_seq_len={max_seq_len:,}")
    if policy != "paged":
        return simulate_reserved(
            requests, policy, capacity_tokens, max_seq_len, max_num_seqs, timeline
        )
    if cdiv(longest, block_size) > capacity_tokens // block_size:
        raise ValueError(
            f"capacity_tokens={capacity_tokens:,} cannot hold one {longest:,}-token request "
            f"in {block_size}-token blocks"
        )
    return simulate_paged(requests, capacity_tokens, block_size, max_num_seqs, timeline)
