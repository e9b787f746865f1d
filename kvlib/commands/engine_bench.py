"""``kvlib engine-bench``: one seeded workload through static and continuous batching,
then continuous batching under a range of per-step token budgets.

Times are this process's CPU time (``time.process_time``: on a shared machine,
the moments another process held the core are left out), and beside them each step's
modelled time on a named GPU (:class:`kvlib.engine.gpu_clock.GpuClock`: the scheduler's
batches priced as steps of a real model, by default Llama-3.1-8B on an H100-SXM, by the
step model at its assumed MFU). The budget sweep shows
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
from kvlib.engine.gpu_clock import DEFAULT_GPU, DEFAULT_MODEL, GpuClock
from kvlib.step import ASSUMED_MFU, VLLM_MAX_NUM_BATCHED_TOKENS_API

__all__ = [
    "BudgetFigures",
    "EngineBenchReport",
    "PreemptionFigures",
    "SchedulerFigures",
    "SpikeFigures",
    "register",
]

DEFAULT_BUDGETS = "none,256,64,32"  # tokens a step computes; none: whole prompts
# The long-prompt run: budgets from vLLM's API-server default down.
SPIKE_BUDGETS = (VLLM_MAX_NUM_BATCHED_TOKENS_API, 2048, 512)
SPIKE_STREAMS, SPIKE_STREAM_PROMPT, SPIKE_STREAM_TOKENS, SPIKE_ARRIVAL_STEP = 4, 16, 48, 8


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
    # The same run on the modelled GPU clock (seconds on that GPU).
    modelled_elapsed_s: float
    modelled_tokens_per_s: float
    modelled_ttft_p50_s: float
    modelled_ttft_p95_s: float
    modelled_ttft_p99_s: float
    modelled_itl_p50_s: float
    modelled_itl_p95_s: float
    modelled_itl_p99_s: float
    modelled_itl_max_s: float
    recompute_tokens: int  # tokens recomputed after preemptions
    modelled_recompute_s: float  # the GPU time those recomputes added


@dataclass(frozen=True)
class BudgetFigures:
    """Continuous batching under one token budget (None: no budget, prompts whole)."""

    max_num_batched_tokens: int | None
    figures: SchedulerFigures
    max_step_tokens: int  # the most tokens one step computed


@dataclass(frozen=True)
class SpikeFigures:
    """Streams decoding when a long prompt arrives, under one token budget (modelled GPU
    seconds): the streams' typical and largest gap between tokens, the long prompt's time
    to first token and the steps its prefill took."""

    max_num_batched_tokens: int
    stream_itl_p50_s: float
    stream_itl_max_s: float
    long_ttft_s: float
    long_prefill_steps: int


@dataclass(frozen=True)
class PreemptionFigures:
    """The continuous run on a smaller pool: its preemptions, the tokens they recompute and
    the modelled GPU time that costs, against the same run on the full pool."""

    num_blocks: int
    preemptions: int
    recompute_tokens: int
    modelled_recompute_s: float
    modelled_elapsed_s: float
    full_pool_modelled_elapsed_s: float
    victim_delay_s: float  # mean extra time to the last token of a preempted request


@dataclass(frozen=True)
class EngineBenchReport:
    """Both schedulers on the same requests, and the equivalence check."""

    device: str
    modelled_on: str  # "Llama-3.1-8B on H100-SXM at MFU 0.6"
    modelled_gpu: str
    modelled_model: str
    mfu: float
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
    long_prompt_tokens: int
    spike: tuple[SpikeFigures, ...]
    preemption: PreemptionFigures
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
    bench.add_argument("--long-prompt", dest="long_prompt", type=int, default=2048,
                       help="tokens of the prompt that arrives while streams decode (2048)")
    bench.add_argument("--preempt-blocks", dest="preempt_blocks", type=int, default=40,
                       help="KV pool blocks of the run that preempts (40)")
    bench.add_argument("--gpu", default=DEFAULT_GPU,
                       help=f"GPU whose step times are modelled ({DEFAULT_GPU})")
    bench.add_argument("--model", default=DEFAULT_MODEL,
                       help=f"model config the steps are priced as ({DEFAULT_MODEL})")
    bench.add_argument("--mfu", type=float, default=ASSUMED_MFU,
                       help=f"model FLOP utilization assumed for the step model ({ASSUMED_MFU})")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit status 2 with one line on bad input."""
    for flag, value in (("--requests", args.requests), ("--max-num-seqs",
                        args.max_num_seqs), ("--num-blocks", args.num_blocks),
                        ("--block-size", args.block_size), ("--long-prompt", args.long_prompt),
                        ("--preempt-blocks", args.preempt_blocks)):
        if value < 1:
            return fail("engine-bench", f"{flag} must be at least 1, got {value}")
    if not 0 < args.mfu <= 1:
        return fail("engine-bench", f"--mfu must be in (0, 1], got {args.mfu}; e.g. --mfu 0.6")
    try:
        args.budgets = parse_budgets(args.token_budgets)
        args.gpu_clock = GpuClock.named(args.model, args.gpu, args.mfu)
    except (KeyError, ValueError, FileNotFoundError) as error:
        return fail("engine-bench", str(error).strip("'\""))
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
    gpu_clock = getattr(args, "gpu_clock", None) or GpuClock.named()
    long_prompt = getattr(args, "long_prompt", 2048)
    positions = max(512, long_prompt + 64)
    model = TinyDecoder(load_config(tiny_config(max_positions=positions)), seed=args.seed)
    requests = [Request(rid, p, m) for rid, p, m in _workload(args.requests, args.seed)]
    sizes = (args.num_blocks, args.block_size, args.max_num_seqs)
    figures, outputs = {}, {}
    policies: tuple[Policy, ...] = ("static", "continuous")
    for policy in policies:
        engine = Engine(model, EngineConfig(*sizes, policy=policy), clock=time.process_time,
                        gpu_clock=gpu_clock)
        results = engine.run(requests)
        figures[policy] = _figures(policy, engine, results)
        outputs[policy] = [r.output_tokens for r in results]
    full_pool = results  # the continuous run, last of the two
    budgets, chunked_outputs = [], []
    for budget in getattr(args, "budgets", parse_budgets(DEFAULT_BUDGETS)):
        config = EngineConfig(*sizes, max_num_batched_tokens=budget)
        engine = Engine(model, config, clock=time.process_time, gpu_clock=gpu_clock)
        results = engine.run(requests)
        most = max(s.prefill_tokens + s.decode_tokens for s in engine.steps)
        budgets.append(BudgetFigures(budget, _figures("continuous", engine, results), most))
        chunked_outputs.append([r.output_tokens for r in results])
    preempt_blocks = getattr(args, "preempt_blocks", 40)
    engine = Engine(model, EngineConfig(preempt_blocks, args.block_size, args.max_num_seqs),
                    clock=time.process_time, gpu_clock=gpu_clock)
    tight_results = engine.run(requests)
    tight = _figures("continuous", engine, tight_results)
    chunked_outputs.append([r.output_tokens for r in tight_results])
    delays = [r.modelled_token_times_s[-1] - full.modelled_token_times_s[-1]
              for r, full in zip(tight_results, full_pool, strict=True) if r.preemptions]
    preemption = PreemptionFigures(preempt_blocks, tight.preemptions, tight.recompute_tokens,
                                   tight.modelled_recompute_s, tight.modelled_elapsed_s,
                                   figures["continuous"].modelled_elapsed_s,
                                   statistics.fmean(delays) if delays else 0.0)
    spike_requests = _spike_workload(long_prompt, args.seed)
    spike, spike_outputs = _spike(model, gpu_clock, spike_requests, args.block_size)
    alone = []
    for request in tqdm(requests, desc="each request alone", leave=False, disable=args.json):
        engine = Engine(model, EngineConfig(args.num_blocks, args.block_size, 1))
        alone.append(engine.run([request])[0].output_tokens)
    spike_blocks = -(-(long_prompt + 64) // args.block_size)
    spike_alone = [Engine(model, EngineConfig(spike_blocks, args.block_size, 1))
                   .run([Request(r.request_id, r.prompt, r.max_new_tokens)])[0].output_tokens
                   for r in spike_requests]
    return EngineBenchReport(
        device=device_name("cpu"),
        modelled_on=gpu_clock.label,
        modelled_gpu=gpu_clock.gpu.name,
        modelled_model=gpu_clock.cfg.name,
        mfu=gpu_clock.mfu,
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
        long_prompt_tokens=long_prompt,
        spike=spike,
        preemption=preemption,
        outputs_match_single=all(
            out == alone for out in [outputs["continuous"], outputs["static"], *chunked_outputs]
        ) and all(out == spike_alone for out in spike_outputs),
    )


def _spike_workload(long_prompt: int, seed: int) -> list[Any]:
    """``SPIKE_STREAMS`` short requests decoding from step 0, and one long prompt arriving
    at step ``SPIKE_ARRIVAL_STEP`` (arrival times in steps: :func:`serve_in_steps`)."""
    from kvlib.engine.core import Request

    rng = random.Random(seed + 1)
    streams = [Request(f"s{i}", [rng.randrange(512) for _ in range(SPIKE_STREAM_PROMPT)],
                       SPIKE_STREAM_TOKENS) for i in range(SPIKE_STREAMS)]
    long = Request("long", [rng.randrange(512) for _ in range(long_prompt)], 4,
                   arrival_s=float(SPIKE_ARRIVAL_STEP))
    return [*streams, long]


def _spike(model: Any, gpu_clock: GpuClock, requests: list[Any],
           block_size: int) -> tuple[tuple[SpikeFigures, ...], list[list[list[int]]]]:
    """The long-prompt run under each of ``SPIKE_BUDGETS``: the streams' gaps and the long
    prompt's TTFT on the modelled GPU, and every run's outputs."""
    from kvlib.engine.core import EngineConfig, serve_in_steps

    tokens = sum(len(r.prompt) + (r.max_new_tokens or 0) for r in requests)
    rows, outputs = [], []
    for budget in SPIKE_BUDGETS:
        config = EngineConfig(-(-tokens // block_size) + len(requests), block_size,
                              max_num_seqs=len(requests), max_num_batched_tokens=budget)
        engine = serve_in_steps(model, config, requests, gpu_clock=gpu_clock)
        gaps = [gap for r in engine.results.values() if r.request_id != "long"
                for gap in r.modelled_itl_s]
        long = engine.results["long"]
        rows.append(SpikeFigures(
            budget, _percentiles(gaps)[0], max(gaps), long.modelled_ttft_s or 0.0,
            # On the step clock the first token comes at the end of the last prefill step.
            int((long.first_token_s or 0.0) - long.arrival_s) + 1))
        outputs.append([engine.results[r.request_id].output_tokens for r in requests])
    return tuple(rows), outputs


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
    m_ttft = _percentiles([r.modelled_ttft_s for r in results if r.modelled_ttft_s is not None])
    m_gaps = [gap for r in results for gap in r.modelled_itl_s]
    m_elapsed = sum(s.modelled_s or 0.0 for s in engine.steps)
    return SchedulerFigures(
        policy, elapsed, generated, generated / elapsed, *ttft, *itl, len(engine.steps),
        preemptions,
        modelled_elapsed_s=m_elapsed,
        modelled_tokens_per_s=generated / m_elapsed,
        modelled_ttft_p50_s=m_ttft[0],
        modelled_ttft_p95_s=m_ttft[1],
        modelled_ttft_p99_s=m_ttft[2],
        modelled_itl_p50_s=_percentiles(m_gaps)[0],
        modelled_itl_p95_s=_percentiles(m_gaps)[1],
        modelled_itl_p99_s=_percentiles(m_gaps)[2],
        modelled_itl_max_s=max(m_gaps, default=0.0),
        recompute_tokens=sum(s.recompute_tokens for s in engine.steps),
        modelled_recompute_s=sum(s.recompute_s for s in engine.steps),
    )


def render(report: EngineBenchReport) -> str:
    """The two schedulers side by side, measured (CPU) and modelled (GPU); then one row per
    token budget, in modelled milliseconds."""
    rows = [("", "static", "continuous")]
    for label, attr, fmt in (
        ("CPU: throughput (tokens/s)", "tokens_per_s", "{:,.1f}"),
        ("CPU: elapsed (s)", "elapsed_s", "{:.2f}"),
        ("CPU: TTFT p50 (ms)", "ttft_p50_s", "ms"),
        ("CPU: TTFT p95 (ms)", "ttft_p95_s", "ms"),
        ("CPU: ITL p50 (ms)", "itl_p50_s", "ms"),
        ("CPU: ITL p99 (ms)", "itl_p99_s", "ms"),
        ("GPU model: throughput (tokens/s)", "modelled_tokens_per_s", "{:,.0f}"),
        ("GPU model: elapsed (ms)", "modelled_elapsed_s", "ms"),
        ("GPU model: TTFT p50 (ms)", "modelled_ttft_p50_s", "ms"),
        ("GPU model: TTFT p95 (ms)", "modelled_ttft_p95_s", "ms"),
        ("GPU model: ITL p50 (ms)", "modelled_itl_p50_s", "ms"),
        ("GPU model: ITL p99 (ms)", "modelled_itl_p99_s", "ms"),
        ("forward steps", "steps", "{:,}"),
        ("preemptions", "preemptions", "{:,}"),
        ("recomputed tokens", "recompute_tokens", "{:,}"),
        ("GPU model: recompute (ms)", "modelled_recompute_s", "ms"),
    ):
        static, continuous = (
            f"{value * 1e3:,.1f}" if fmt == "ms" else fmt.format(value)
            for value in (getattr(report.static, attr), getattr(report.continuous, attr))
        )
        rows.append((label, static, continuous))
    width = max(len(r[0]) for r in rows)
    lines = [f"{a:<{width}}  {b:>12}  {c:>12}" for a, b, c in rows]
    lines += [
        f"continuous / static throughput (CPU): {report.continuous_over_static:.2f}x",
        "",
        "continuous batching by token budget (max_num_batched_tokens), chunked prefill;",
        f"times in ms on the modelled GPU ({report.modelled_on}):",
        f"{'budget':>7} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p95':>9} {'ITL p50':>8} "
        f"{'ITL p99':>8} {'ITL max':>8} {'max step':>9} {'steps':>6} {'preempt':>8}",
    ]
    for row in report.budgets:
        f = row.figures
        budget = "none" if row.max_num_batched_tokens is None else f"{row.max_num_batched_tokens}"
        lines.append(
            f"{budget:>7} {f.modelled_tokens_per_s:>8,.0f} {f.modelled_ttft_p50_s * 1e3:>9.1f} "
            f"{f.modelled_ttft_p95_s * 1e3:>9.1f} {f.modelled_itl_p50_s * 1e3:>8.2f} "
            f"{f.modelled_itl_p99_s * 1e3:>8.2f} {f.modelled_itl_max_s * 1e3:>8.2f} "
            f"{row.max_step_tokens:>9,} {f.steps:>6,} {f.preemptions:>8,}"
        )
    lines += [
        "",
        f"{SPIKE_STREAMS} streams decoding when a {report.long_prompt_tokens:,}-token prompt "
        "arrives (ms on the modelled GPU):",
        f"{'budget':>7} {'stream ITL p50':>15} {'stream ITL max':>15} {'long TTFT':>10} "
        f"{'prefill steps':>14}",
    ]
    for spike in report.spike:
        lines.append(
            f"{spike.max_num_batched_tokens:>7,} {spike.stream_itl_p50_s * 1e3:>15.2f} "
            f"{spike.stream_itl_max_s * 1e3:>15.2f} {spike.long_ttft_s * 1e3:>10.1f} "
            f"{spike.long_prefill_steps:>14}"
        )
    p = report.preemption
    per = p.modelled_recompute_s / p.preemptions if p.preemptions else 0.0
    lines += [
        "",
        f"preemption: continuous, no budget, {p.num_blocks} blocks instead of "
        f"{report.num_blocks}: {p.preemptions} preemptions recompute "
        f"{p.recompute_tokens:,} tokens, {p.modelled_recompute_s * 1e3:.1f} ms of GPU time "
        f"({per * 1e3:.2f} ms each); whole run {p.modelled_elapsed_s * 1e3:,.1f} ms against "
        f"{p.full_pool_modelled_elapsed_s * 1e3:,.1f} ms on the full pool; a preempted "
        f"request's last token {p.victim_delay_s * 1e3:,.1f} ms later on average",
        f"outputs equal each request run alone (every run): {report.outputs_match_single}",
        f"{report.requests} requests, seed {report.seed}, max_num_seqs {report.max_num_seqs}, "
        f"{report.num_blocks} blocks of {report.block_size}",
        f"measured: {report.device}, this process's CPU time; modelled: each step's time "
        f"for {report.modelled_on} from the step model (MFU an assumption, times lower "
        "bounds)",
    ]
    return "\n".join(lines)
