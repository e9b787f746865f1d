"""Queueing formulas for a pool of batch slots, in one import.

Re-exports the two modules that hold them, so ``kvlib.serving.queueing`` is the
one name chapters, commands and graded notebooks use:

- :mod:`kvlib.serving.erlang`: M/M/1 and M/M/c, first come first served
  (utilization, Erlang's C, the mean wait and any percentile of the wait);
- :mod:`kvlib.serving.priority`: paid and free classes sharing one pool with
  non-preemptive priority, the share of free traffic to shed for a target
  utilization or paid p95, and the arrival rates behind a published pair of
  waits before and after a capacity loss.

Both are standard library only; their simulation checks are in
:mod:`kvlib.serving.simulate`.
"""

from __future__ import annotations

from kvlib.serving.erlang import (
    QueueStats,
    UnstableQueueError,
    erlang_c,
    mm1,
    mmc,
    utilization,
)
from kvlib.serving.priority import (
    PriorityStats,
    paid_p95_after_shedding,
    priority_mmc,
    rates_for_paid_waits,
    shed_fraction_for_paid_wait,
    shed_fraction_for_utilization,
)

__all__ = [
    "PriorityStats",
    "QueueStats",
    "UnstableQueueError",
    "erlang_c",
    "mm1",
    "mmc",
    "paid_p95_after_shedding",
    "priority_mmc",
    "rates_for_paid_waits",
    "shed_fraction_for_paid_wait",
    "shed_fraction_for_utilization",
    "utilization",
]
