"""``kvlib engine-bench``: one seeded workload through static and continuous batching,
then continuous batching under a range of per-step token budgets.

Times are this process's CPU time (``time.process_time``: on a shared machine,
the moments another process held the core are left out). The budget sweep shows
the trade vLLM's ``max_num_batched_tokens`` makes with chunked prefill: a large budget
prefills a long prompt in one step (a short TTFT for it, a long gap for every stream
decoding beside it), a small one spreads the prompt over many steps (smooth decodes,
later first tokens, more steps).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from kvlib.commands import emit, fail

__all__ = ["BudgetFigures", "EngineBenchReport", "SchedulerFigures", "register"]

DEFAULT_BUDGETS = "none,256,64,32"  # tokens a step computes; none: whole prompts


@dataclass(frozen=True)
class SchedulerFigures:
    """One scheduler's run of the workload (times in seconds on this machine)."""

    policy: str
    elapsed_s: float
    generated_tokens: int
    tokens_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p95_s: float
    itl_p99_s: float
    steps: int
    preemptions: int


@dataclass(frozen=True)
class BudgetFigures:
    """Continuous batching under one token budget (None: no budget, prompts whole)."""

    max_num_batched_tokens: int | None
    figures: SchedulerFigures
    max_step_tokens: int  # the most tokens one step computed


@dataclass(frozen=True)
class EngineBenchReport:
    """Both schedulers on the same requests, and the equivalence check."""

    device: str
    torch_threads: int
    requests: int
    seed: int
    num_blocks: int
    block_size: int
    max_num_seqs: int
    continuous: SchedulerFigures
    static: SchedulerFigures
    continuous_over_static: float
    budgets: tuple[BudgetFigures, ...]
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
    bench.add_argument("--max-num-seqs", "--max-batch-size", dest="max_num_seqs", type=int,
                       default=8, help="sequences a step may hold (8)")
    bench.add_argument("--token-budgets", default=DEFAULT_BUDGETS,
                       help="max_num_batched_tokens values to sweep, comma-separated; "
                       f"'none' for no budget ({DEFAULT_BUDGETS})")
    bench.add_argument("--num-blocks", type=int, default=96, help="KV pool blocks (96)")
    bench.add_argument("--block-size", type=int, default=16, help="tokens a block (16)")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit status 2 with one line on bad input."""
    for flag, value in (("--requests", args.requests), ("--max-num-seqs",
                        args.max_num_seqs), ("--num-blocks", args.num_blocks),
                        ("--block-size", args.block_size)):
        if value < 1:
            return fail("engine-bench", f"{flag} must be at least 1, got {value}")
    try:
        args.budgets = parse_budgets(args.token_budgets)
    except ValueError as error:
        return fail("engine-bench", str(error))
    return emit(benchmark(args), args.json, render)


def parse_budgets(text: str) -> list[int | None]:
    """``"none,256,64"`` -> ``[None, 256, 64]``; a bad item names itself and the fix."""
    budgets: list[int | None] = []
    for item in text.split(","):
        item = item.strip().lower()
        if item == "none":
            budgets.append(None)
            continue
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"--token-budgets: {item!r} is not a whole number of tokens "
                             "or 'none'; e.g. --token-budgets none,256,64")
        budgets.append(int(item))
    return budgets


def _workload(n: int, seed: int) -> list[tuple[str, list[int], int]]:
    """Mixed lengths: prompts of 8-192 tokens and outputs of 4-96, drawn log-uniformly."""
    rng = random.Random(seed)

    def draw(low: int, high: int) -> int:
        return int(round(low * (high / low) ** rng.random()))

    return [(f"r{i}", [rng.randrange(512) for _ in range(draw(8, 192))], draw(4, 96))
            for i in range(n)]


def benchmark(args: argparse.Namespace) -> EngineBenchReport:
    """Both schedulers, then every request alone (the equivalence check)."""
    import torch
    from tqdm import tqdm

    from kvlib.config import load_config
    from kvlib.engine.core import Engine, EngineConfig, Request
    from kvlib.engine.scheduler import Policy
    from kvlib.nn.decoder import TinyDecoder, tiny_config
    from kvlib.timing.devices import device_name

    torch.set_num_threads(1)
    model = TinyDecoder(load_config(tiny_config(max_positions=512)), seed=args.seed)
    requests = [Request(rid, p, m) for rid, p, m in _workload(args.requests, args.seed)]
    sizes = (args.num_blocks, args.block_size, args.max_num_seqs)
    figures, outputs = {}, {}
    policies: tuple[Policy, ...] = ("static", "continuous")
    for policy in policies:
        engine = Engine(model, EngineConfig(*sizes, policy=policy), clock=time.process_time)
        results = engine.run(requests)
        figures[policy] = _figures(policy, engine, results)
        outputs[policy] = [r.output_tokens for r in results]
    budgets, chunked_outputs = [], []
    for budget in getattr(args, "budgets", parse_budgets(DEFAULT_BUDGETS)):
        config = EngineConfig(*sizes, max_num_batched_tokens=budget)
        engine = Engine(model, config, clock=time.process_time)
        results = engine.run(requests)
        most = max(s.prefill_tokens + s.decode_tokens for s in engine.steps)
        budgets.append(BudgetFigures(budget, _figures("continuous", engine, results), most))
        chunked_outputs.append([r.output_tokens for r in results])
    alone = []
    for request in tqdm(requests, desc="each request alone", leave=False, disable=args.json):
        engine = Engine(model, EngineConfig(args.num_blocks, args.block_size, 1))
        alone.append(engine.run([request])[0].output_tokens)
    return EngineBenchReport(
        device=device_name("cpu"),
        torch_threads=torch.get_num_threads(),
        requests=args.requests,
        seed=args.seed,
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        continuous=figures["continuous"],
        static=figures["static"],
        continuous_over_static=figures["continuous"].tokens_per_s / figures["static"].tokens_per_s,
        budgets=tuple(budgets),
        outputs_match_single=all(
            out == alone for out in [outputs["continuous"], outputs["static"], *chunked_outputs]
        ),
    )


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p95, p99 (inclusive method: within the observed range)."""
    if not values:
        return (0.0, 0.0, 0.0)
    if len(values) == 1:
        return (values[0],) * 3
    cuts = statistics.quantiles(sorted(values), n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98]


def _figures(policy: str, engine: Any, results: list[Any]) -> SchedulerFigures:
    ttft = _percentiles([r.ttft_s for r in results if r.ttft_s is not None])
    itl = _percentiles([gap for r in results for gap in r.itl_s])
    elapsed = max(r.finish_s for r in results if r.finish_s is not None)
    generated = sum(len(r.output_tokens) for r in results)
    preemptions = sum(r.preemptions for r in results)
    return SchedulerFigures(
        policy, elapsed, generated, generated / elapsed, *ttft, *itl, len(engine.steps), preemptions
    )


def render(report: EngineBenchReport) -> str:
    """The two schedulers side by side, then one row per token budget."""
    rows = [("", "static", "continuous")]
    for label, attr, fmt in (
        ("throughput (tokens/s)", "tokens_per_s", "{:,.1f}"),
        ("elapsed CPU time (s)", "elapsed_s", "{:.2f}"),
        ("TTFT p50 (ms)", "ttft_p50_s", "ms"),
        ("TTFT p95 (ms)", "ttft_p95_s", "ms"),
        ("TTFT p99 (ms)", "ttft_p99_s", "ms"),
        ("ITL p50 (ms)", "itl_p50_s", "ms"),
        ("ITL p99 (ms)", "itl_p99_s", "ms"),
        ("forward steps", "steps", "{:,}"),
        ("preemptions", "preemptions", "{:,}"),
    ):
        static, continuous = (
            f"{value * 1e3:,.1f}" if fmt == "ms" else fmt.format(value)
            for value in (getattr(report.static, attr), getattr(report.continuous, attr))
        )
        rows.append((label, static, continuous))
    width = max(len(r[0]) for r in rows)
    lines = [f"{a:<{width}}  {b:>12}  {c:>12}" for a, b, c in rows]
    lines += [
        f"continuous / static throughput: {report.continuous_over_static:.2f}x",
        "",
        "continuous batching by token budget (max_num_batched_tokens), chunked prefill:",
        f"{'budget':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p95':>9} {'ITL p50':>8} "
        f"{'ITL p95':>8} {'ITL p99':>8} {'max step':>9} {'steps':>6}   (times in ms)",
    ]
    for row in report.budgets:
        f = row.figures
        budget = "none" if row.max_num_batched_tokens is None else f"{row.max_num_batched_tokens}"
        lines.append(
            f"{budget:>7} {f.tokens_per_s:>8,.1f} {f.ttft_p50_s * 1e3:>9.1f} "
            f"{f.ttft_p95_s * 1e3:>9.1f} {f.itl_p50_s * 1e3:>8.1f} {f.itl_p95_s * 1e3:>8.1f} "
            f"{f.itl_p99_s * 1e3:>8.1f} {row.max_step_tokens:>9,} {f.steps:>6,}"
        )
    lines += [
        f"outputs equal each request run alone (every run): {report.outputs_match_single}",
        f"{report.requests} requests, seed {report.seed}, max_num_seqs {report.max_num_seqs}, "
        f"{report.num_blocks} blocks of {report.block_size}",
        f"{report.device}; times are this process's CPU time",
    ]
    return "\n".join(lines)
