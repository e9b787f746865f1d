"""``kvlib engine-bench``: one seeded workload through static and continuous batching.

Runs :class:`kvlib.engine.core.Engine` on the CPU with a small random-weight decoder,
prints each scheduler's throughput and time-to-first-token percentiles, their
ratio, and whether every request's greedy tokens equal those of running it
alone (``outputs_match_single``). torch is imported when the command runs.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
from dataclasses import dataclass
from typing import Any

from kvlib.commands import emit, fail

__all__ = ["EngineBenchReport", "SchedulerFigures", "register"]


@dataclass(frozen=True)
class SchedulerFigures:
    """One scheduler's run of the workload (times in seconds on this machine)."""

    policy: str
    wall_s: float
    generated_tokens: int
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    steps: int
    preemptions: int


@dataclass(frozen=True)
class EngineBenchReport:
    """Both schedulers on the same requests, and the equivalence check."""

    device: str
    torch_threads: int
    requests: int
    seed: int
    num_blocks: int
    block_size: int
    max_batch_size: int
    continuous: SchedulerFigures
    static: SchedulerFigures
    continuous_over_static: float
    outputs_match_single: bool


def register(commands: Any) -> None:
    """Add ``kvlib engine-bench`` to the subcommands."""
    bench = commands.add_parser(
        "engine-bench",
        help="static against continuous batching on a small model (CPU)",
        description="Serve a seeded mixed-length workload with a small random-weight "
        "decoder, once with static and once with continuous batching, and check "
        "that batching changes no request's greedy tokens.",
    )
    bench.add_argument("--requests", type=int, default=32, help="requests in the workload (32)")
    bench.add_argument("--seed", type=int, default=0, help="workload seed (0)")
    bench.add_argument("--max-batch-size", type=int, default=8, help="batch cap (8)")
    bench.add_argument("--num-blocks", type=int, default=96, help="KV pool blocks (96)")
    bench.add_argument("--block-size", type=int, default=16, help="tokens a block (16)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit status 2 with one line on bad input."""
    for flag, value in (("--requests", args.requests), ("--max-batch-size",
                        args.max_batch_size), ("--num-blocks", args.num_blocks),
                        ("--block-size", args.block_size)):  # fmt: skip
        if value < 1:
            return fail("engine-bench", f"{flag} must be at least 1, got {value}")
    return emit(benchmark(args), args.json, render)


def _workload(n: int, seed: int) -> list[tuple[str, list[int], int]]:
    """Mixed lengths: prompts of 8-192 tokens and outputs of 4-96, drawn log-uniformly."""
    rng = random.Random(seed)

    def draw(low: int, high: int) -> int:
        return int(round(low * (high / low) ** rng.random()))

    return [(f"r{i}", [rng.randrange(512) for _ in range(draw(8, 192))], draw(4, 96))
            for i in range(n)]  # fmt: skip


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()}"


def benchmark(args: argparse.Namespace) -> EngineBenchReport:
    """Both schedulers, then every request alone (the equivalence check)."""
    import torch
    from tqdm import tqdm

    from kvlib.config import load_config
    from kvlib.engine.core import Engine, EngineConfig, Request
    from kvlib.engine.scheduler import Policy
    from kvlib.nn.decoder import TinyDecoder, tiny_config

    torch.set_num_threads(1)
    model = TinyDecoder(load_config(tiny_config(max_positions=512)), seed=args.seed)
    requests = [Request(rid, p, m) for rid, p, m in _workload(args.requests, args.seed)]
    figures, outputs = {}, {}
    policies: tuple[Policy, ...] = ("static", "continuous")
    for policy in policies:
        config = EngineConfig(args.num_blocks, args.block_size, args.max_batch_size,
                              policy=policy)  # fmt: skip
        engine = Engine(model, config)
        results = engine.run(requests)
        figures[policy] = _figures(policy, engine, results)
        outputs[policy] = [r.output_tokens for r in results]
    alone = []
    for request in tqdm(requests, desc="each request alone", leave=False, disable=args.json):
        engine = Engine(model, EngineConfig(args.num_blocks, args.block_size, 1))
        alone.append(engine.run([request])[0].output_tokens)
    return EngineBenchReport(
        device=_cpu_name(),
        torch_threads=torch.get_num_threads(),
        requests=args.requests,
        seed=args.seed,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_batch_size=args.max_batch_size,
        continuous=figures["continuous"],
        static=figures["static"],
        continuous_over_static=figures["continuous"].tokens_per_s / figures["static"].tokens_per_s,
        outputs_match_single=outputs["continuous"] == outputs["static"] == alone,
    )


def _figures(policy: str, engine: Any, results: list[Any]) -> SchedulerFigures:
    ttfts = sorted(r.ttft_s for r in results if r.ttft_s is not None)
    wall = max(r.finish_s for r in results if r.finish_s is not None)
    generated = sum(len(r.output_tokens) for r in results)
    cuts = statistics.quantiles(ttfts, n=100, method="inclusive") if len(ttfts) > 1 else ttfts * 99
    return SchedulerFigures(
        policy=policy,
        wall_s=wall,
        generated_tokens=generated,
        tokens_per_s=generated / wall,
        ttft_p50_s=cuts[49],
        ttft_p95_s=cuts[94],
        ttft_p99_s=cuts[98],
        steps=len(engine.steps),
        preemptions=sum(r.preemptions for r in results),
    )


def render(report: EngineBenchReport) -> str:
    """A two-column table of both schedulers."""
    rows = [("", "static", "continuous")]
    for label, attr, fmt in (
        ("throughput (tokens/s)", "tokens_per_s", "{:,.1f}"),
        ("wall time (s)", "wall_s", "{:.2f}"),
        ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}"),
        ("TTFT p95 (s)", "ttft_p95_s", "{:.3f}"),
        ("TTFT p99 (s)", "ttft_p99_s", "{:.3f}"),
        ("forward steps", "steps", "{:,}"),
        ("preemptions", "preemptions", "{:,}"),
    ):
        rows.append((label, fmt.format(getattr(report.static, attr)),
                     fmt.format(getattr(report.continuous, attr))))  # fmt: skip
    width = max(len(r[0]) for r in rows)
    lines = [f"{a:<{width}}  {b:>12}  {c:>12}" for a, b, c in rows]
    lines += [
        f"continuous / static throughput: {report.continuous_over_static:.2f}x",
        f"outputs equal each request run alone: {report.outputs_match_single}",
        f"{report.requests} requests, seed {report.seed}, batch cap {report.max_batch_size}, "
        f"{report.num_blocks} blocks of {report.block_size}; {report.device}, "
        f"{report.torch_threads} thread",
    ]
    return "\n".join(lines)
