"""``kvlib capacity [SCENARIO]``: chapter 7's remedies table for a bundled scenario."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any

from kvlib.capacity.assessment import Capacity
from kvlib.capacity.examples import BUNDLED_NAMES, bundled_scenarios
from kvlib.capacity.remedies import COST_TIERS, rank_remedies
from kvlib.capacity.scenario import SERVING_MFU, ScenarioError
from kvlib.commands import UsageError, emit, fail

__all__ = ["CapacityReport", "RemedyRow", "capacity_report", "register", "render"]

BASELINE = "as deployed"


def _key(name: str) -> str:
    """A bundled scenario's name as the command line spells it: ``document_assistant``."""
    return name.replace(" ", "_").replace("-", "_")


@dataclass(frozen=True)
class RemedyRow:
    """One row: the deployment after a remedy (or as deployed), at its mean step."""

    remedy: str
    cost: str  # the cost tier; "" for the deployment as it stands
    gpus: int
    seats: int  # block seats (Capacity.total_block_seats), every replica's, at full length
    batch: int  # sequences decoding together on one replica
    limited_by: str
    tokens_per_s: float
    full_use_tokens_per_s: float  # every seat the engine admits busy
    bound: str  # "memory" or "compute": what the mean step's time is mostly spent on
    step_s: float
    prefill_tokens_per_step: int
    flops_per_s: float  # one GPU, over the mean step
    hbm_bytes_per_s: float


@dataclass(frozen=True)
class CapacityReport:
    """Everything ``kvlib capacity`` prints; ``--json`` prints these fields."""

    scenario: str
    mfu: float
    gpu: str
    flops_ceiling_per_s: float  # mfu x the card's dense bf16 peak
    hbm_bandwidth_bytes_per_s: float
    rows: list[RemedyRow]
    skipped: list[list[str]]  # [remedy, why it does not apply]


def register(commands: Any) -> None:
    """Add ``kvlib capacity`` to the subcommands."""
    names = [_key(name) for name in BUNDLED_NAMES]
    capacity = commands.add_parser(
        "capacity",
        help="chapter 7's remedies table: seats and tokens/s of each remedy, cheapest first",
        description="Each remedy applied to a bundled deployment, ranked by cost (a tier, "
        "then the cheaper and safer first), with its seats and the tokens/s of its mean "
        "engine step: decodes and the prompts of the requests that replace those finishing, "
        "each operation's time added, the arithmetic at MFU x the dense peak.",
    )
    capacity.add_argument("scenario", nargs="?", default=names[0],
                          help=f"one of {', '.join(names)} ({names[0]})")
    capacity.add_argument("--mfu", type=float, default=SERVING_MFU,
                          help=f"model FLOPs utilization, an assumption ({SERVING_MFU})")
    capacity.add_argument("--json", action="store_true", help="print one JSON object")
    capacity.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the remedies table; exit status 2 with one line on bad input."""
    try:
        report = capacity_report(args.scenario, args.mfu)
    except UsageError as exc:
        return fail("capacity", str(exc))
    return emit(report, args.json, render)


def _row(remedy: str, cost: str, cap: Capacity) -> RemedyRow:
    return RemedyRow(
        remedy=remedy, cost=cost, gpus=cap.scenario.gpus, seats=cap.total_block_seats,
        batch=cap.batch, limited_by=cap.limited_by, tokens_per_s=cap.tokens_per_s,
        full_use_tokens_per_s=cap.full_use_tokens_per_s, bound=cap.bound_by,
        step_s=cap.step_s, prefill_tokens_per_step=cap.prefill_tokens_per_step,
        flops_per_s=cap.step.flops_per_s, hbm_bytes_per_s=cap.step.hbm_bytes_per_s,
    )


def capacity_report(scenario: str, mfu: float = SERVING_MFU) -> CapacityReport:
    """The remedies table of bundled ``scenario`` at ``mfu``; UsageError on bad input."""
    bundled = {_key(b.name): b for b in bundled_scenarios()}
    if scenario not in bundled:
        raise UsageError(f"unknown scenario {scenario!r}: use one of {', '.join(bundled)}")
    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu must be in (0, 1], e.g. {SERVING_MFU}, got {mfu}")
    chosen = bundled[scenario]
    s = dataclasses.replace(chosen.scenario, mfu=mfu)
    try:
        ranking = rank_remedies(s, chosen.alternative)
    except ScenarioError as err:
        raise UsageError(str(err)) from None
    rows = [_row(BASELINE, "", ranking.baseline)]
    rows += [_row(e.name, COST_TIERS[e.tier], e.after) for e in ranking.remedies]
    return CapacityReport(
        scenario=scenario, mfu=mfu, gpu=s.gpu.name,
        flops_ceiling_per_s=mfu * s.gpu.bf16_dense_flops_per_s,
        hbm_bandwidth_bytes_per_s=s.gpu.hbm_bandwidth_bytes_per_s,
        rows=rows, skipped=[[name, why] for name, why in ranking.skipped],
    )


def render(r: CapacityReport) -> str:
    """The human-readable table, one remedy a line, cheapest first."""
    head = ("remedy", "cost", "GPUs", "seats", "tokens/s", "bound", "step", "TFLOP/s", "TB/s")
    lines = [(row.remedy, row.cost or "-", str(row.gpus), f"{row.seats:,}",
              f"{row.tokens_per_s:,.0f}", row.bound, f"{row.step_s * 1e3:.1f} ms",
              f"{row.flops_per_s / 1e12:,.0f}", f"{row.hbm_bytes_per_s / 1e12:.2f}")
             for row in r.rows]
    widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head))]
    text = [f"{r.scenario} on {r.gpu} at MFU {r.mfu:g} (an assumption): ceilings "
            f"{r.flops_ceiling_per_s / 1e12:,.0f} TFLOP/s bf16, "
            f"{r.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s"]
    for x in [head, *lines]:
        text.append("  ".join(c.ljust(w) if i < 2 or i == 5 else c.rjust(w)
                              for i, (c, w) in enumerate(zip(x, widths, strict=True))))
    text += [f"not applied: {name}: {why}" for name, why in r.skipped]
    return "\n".join(text)
