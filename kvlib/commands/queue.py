"""``kvlib queue``: the wait an M/M/c queue quotes for an arrival rate, a service time, servers."""

from __future__ import annotations

import argparse
from typing import Any

from kvlib.commands import emit, fail
from kvlib.serving.erlang import QueueStats
from kvlib.serving.queueing import UnstableQueueError, mmc

__all__ = ["register", "render", "run"]

_FLAGS = {"arrivals_per_s": "--arrivals-per-s", "service_s": "--service-s", "servers": "--servers"}


def register(commands: Any) -> None:
    """Add ``kvlib queue`` to the subcommands."""
    queue = commands.add_parser(
        "queue",
        help="queue waits (M/M/c, Erlang C) for an arrival rate, service time and servers",
        description="Closed-form waits of an M/M/c queue: Poisson arrivals, exponential "
        "service, SERVERS identical servers (batch slots), one first-come-first-served queue. "
        "Prints utilization, the probability of waiting (Erlang C), the mean wait and the "
        "95th-percentile wait. Utilization >= 1 is refused: that queue has no steady state.",
    )
    queue.add_argument(
        "--arrivals-per-s", type=float, required=True, help="arrival rate, requests per second"
    )
    queue.add_argument(
        "--service-s", type=float, required=True, help="mean service time per request, seconds"
    )
    queue.add_argument("--servers", type=int, default=1, help="servers or batch slots (1)")
    queue.add_argument("--json", action="store_true", help="print one JSON object")
    queue.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the M/M/c waits (``--json``: their fields); exit status 2 with one line for bad
    input or an unstable queue."""
    try:
        report = mmc(args.arrivals_per_s, args.service_s, args.servers)
    except UnstableQueueError as exc:
        return fail("queue", f"unstable queue: {exc}")
    except (ValueError, TypeError) as exc:
        name, _, rest = str(exc).partition(" ")  # "service_s must be ..." names the flag
        return fail("queue", f"{_FLAGS.get(name, name)} {rest}")
    return emit(report, args.json, render)


def _duration(seconds: float) -> str:
    if seconds == 0:
        return "0 s"
    if seconds < 1e-6:
        return f"{seconds:.3g} s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:,.1f} ms"
    return f"{seconds:,.3g} s" if seconds < 100 else f"{seconds:,.0f} s"


def render(report: QueueStats) -> str:
    """The human-readable table."""
    p95 = _duration(report.p95_wait_s)
    if report.p95_wait_s == 0:
        p95 += " (at most 5% of requests wait at all)"
    rows = [
        ("arrivals", f"{report.arrivals_per_s:g} requests/s"),
        ("service", f"{_duration(report.service_s)} mean"),
        ("servers", str(report.servers)),
        ("utilization", f"{report.utilization:.3f}"),
        ("P(wait)", f"{report.p_wait:.4f}" if report.p_wait >= 1e-4 else f"{report.p_wait:.2e}"),
        ("mean wait", _duration(report.mean_wait_s)),
        ("p95 wait", p95),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
