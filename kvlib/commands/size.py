"""``kvlib size CONFIG``: KV cache, weights, seats and decode bound for a model config."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kvlib import bounds, sizing
from kvlib.commands import UsageError, emit, fail, flags
from kvlib.config import ConfigError, ModelConfig, bundled_models
from kvlib.dtypes import DTYPE_BITS
from kvlib.hardware import (
    VLLM_GPU_MEMORY_UTILIZATION,
    GPUSpec,
    get_gpu,
    gpu_names,
    vllm_budget_bytes,
)
from kvlib.paging import sglang_pool, vllm_pool
from kvlib.units import format_bytes, format_rate, parse_bytes
from kvlib.weights import params

__all__ = ["SizeReport", "register", "render", "size_report"]

AUTO = "auto"
ENGINES = ("vllm", "sglang", "both")


@dataclass(frozen=True)
class SGLangReport:
    """SGLang's pool on one GPU (:mod:`kvlib.paging.sglang_pool`); sizes that do not apply
    (K and V for an MLA pool, the one KV buffer otherwise) and those needing memory are None."""

    cell_size_bytes: int
    max_total_num_tokens: int | None
    k_size_bytes: int | None
    v_size_bytes: int | None
    kv_size_bytes: int | None
    page_size: int
    mem_fraction_static: float | None  # None with --kv-memory: the rest is given
    rest_memory_bytes: int | None
    startup_lines: list[str] | None


@dataclass(frozen=True)
class SizeReport:
    """Everything ``kvlib size`` prints; ``--json`` prints these fields (bytes are ints).

    Fields that need a GPU (or ``--kv-memory``) are None without one.
    """

    model: str
    model_type: str
    attention: str
    num_hidden_layers: int
    layer_kinds: dict[str, int]
    sliding_window_tokens: int | None
    num_key_value_heads: int
    head_dim: int
    latent_dims: tuple[int, int] | None  # MLA: (kv_lora_rank, qk_rope_head_dim) cached a layer
    context_tokens: int
    batch: int
    kv_dtype: str
    kv_bytes_per_token: int
    kv_bytes: int
    kv_bytes_batch: int
    param_count: int | None
    active_param_count: int | None
    param_count_note: str | None
    weight_dtype: str
    weight_format: str
    weight_bytes: int | None
    weight_note: str | None
    tp: int
    gpu: str | None
    gpu_memory_bytes: int | None
    gpu_memory_source: str | None
    gpu_memory_utilization: float | None
    weight_bytes_per_gpu: int | None
    min_gpus: int | None
    valid_tp_degrees: list[int] | None
    hbm_bandwidth_bytes_per_s: float | None
    kv_bytes_per_gpu: int
    free_kv_bytes_per_gpu: int | None
    fits: bool | None
    seats: int | None
    decode_bytes_per_gpu: int | None
    decode_tokens_per_s_bound: float | None
    block_size: int
    block_bytes: int | None
    blocks_per_request: int | None
    pool_blocks: int | None
    pool_tokens: int | None
    max_concurrency: float | None
    vllm_version: str
    estimated_max_model_len: int | None  # vLLM's estimate, where it would refuse to start
    engine: str
    sglang: SGLangReport | None
    notes: list[str]


def register(commands: Any) -> None:
    """Add ``kvlib size`` to the subcommands."""
    size = commands.add_parser(
        "size",
        help="KV cache, weights and seats for a model config",
        description="Size a model's KV cache from its config.json, and how many "
        f"sequences fit on a GPU. Bundled configs: {', '.join(bundled_models())}.",
    )
    size.add_argument(
        "config",
        help="path to a config.json (or its folder), a bundled name, or a Hugging Face "
        "model id OWNER/NAME[@revision] (its config.json only: from the local cache, else "
        "downloaded unless HF_HUB_OFFLINE is set)",
    )
    size.add_argument("--context", type=int, default=4096, help="tokens per sequence (4096)")
    size.add_argument("--batch", type=int, default=1, help="concurrent sequences (1)")
    dtypes = ", ".join(DTYPE_BITS)
    size.add_argument("--kv-dtype", default="bf16", help=f"KV element type: {dtypes} (bf16)")
    size.add_argument(
        "--weight-dtype",
        default=AUTO,
        help=f"weight element type: {dtypes}, or 'auto' for the checkpoint as it ships "
        "(its quantization_config, else torch_dtype) (auto)",
    )
    size.add_argument("--gpu", help=f"one of {', '.join(gpu_names())}")
    size.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=VLLM_GPU_MEMORY_UTILIZATION,
        help=(
            "fraction of the GPU's memory the engine may use (weights, activations and "
            f"cache), as vLLM's default ({VLLM_GPU_MEMORY_UTILIZATION}); vLLM multiplies "
            "it by CUDA's total, "
            "the driver's where no CUDA reading is recorded"
        ),
    )
    size.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (1)")
    size.add_argument(
        "--kv-memory", help="free memory for the cache per GPU, e.g. '9 GiB' (else from --gpu)"
    )
    size.add_argument(
        "--block-size",
        type=int,
        default=vllm_pool.DEFAULT_BLOCK_SIZE,
        help=f"tokens a KV block holds, as vLLM's --block-size ({vllm_pool.DEFAULT_BLOCK_SIZE})",
    )
    size.add_argument(
        "--vllm-version",
        default=vllm_pool.DEFAULT_VLLM_VERSION,
        help="the vLLM release whose start-up lines to print; 'GPU KV cache size' is "
        "whole blocks per group before 0.20, int(max concurrency x max_model_len) since "
        f"({vllm_pool.DEFAULT_VLLM_VERSION})",
    )
    size.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="whose KV pool to print: vllm, sglang, or both side by side (vllm)",
    )
    size.add_argument(
        "--mem-fraction-static",
        type=float,
        help="SGLang's --mem-fraction-static (weights and KV pool over the GPU's memory); "
        "default: SGLang's own, chosen from the GPU's memory and --tp",
    )
    size.add_argument(
        "--page-size",
        type=int,
        default=sglang_pool.DEFAULT_PAGE_SIZE,
        help=f"SGLang's --page-size in tokens ({sglang_pool.DEFAULT_PAGE_SIZE})",
    )
    size.add_argument("--json", action="store_true", help="print one JSON object")
    size.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the size report; exit status 2 with one line on bad input."""
    try:
        report = size_report(args)
    except (ConfigError, UsageError) as exc:
        return fail("size", str(exc.args[0]) if exc.args else str(exc))
    return emit(report, args.json, render)


def _inputs(
    args: argparse.Namespace,
) -> tuple[ModelConfig, str, str | None, GPUSpec | None, int | None]:
    """``(config, kv dtype, weight dtype or None for auto, GPU, --kv-memory bytes)``, every
    flag checked, each failure naming the flag and the fix."""
    counts = (("--context", args.context), ("--batch", args.batch), ("--tp", args.tp),
             ("--block-size", args.block_size), ("--page-size", args.page_size))
    for flag, value in counts:
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.mem_fraction_static is not None and not 0 < args.mem_fraction_static < 1:
        raise UsageError("--mem-fraction-static must be in (0, 1), e.g. 0.85")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise UsageError(
            f"--gpu-memory-utilization must be in (0, 1], e.g. {VLLM_GPU_MEMORY_UTILIZATION}"
        )
    try:
        vllm_pool.parse_vllm_version(args.vllm_version)
    except ValueError as err:
        raise UsageError(f"--vllm-version: {err}") from None
    kv_dtype = flags.dtype("--kv-dtype", args.kv_dtype)
    weight_dtype = (
        None if args.weight_dtype == AUTO else flags.dtype("--weight-dtype", args.weight_dtype)
    )
    gpu = None
    if args.gpu:
        try:
            gpu = get_gpu(args.gpu)
        except KeyError as err:
            raise UsageError(str(err.args[0])) from None
    kv_memory = None
    if args.kv_memory:
        try:
            kv_memory = parse_bytes(args.kv_memory)
        except ValueError as err:
            raise UsageError(f"--kv-memory: {err}") from None
    cfg = flags.model(args.config)
    flags.tp(cfg, "--tp", args.tp)
    return cfg, kv_dtype, weight_dtype, gpu, kv_memory


def _weights(cfg: ModelConfig, weight_dtype: str | None) -> tuple[str, int | None, str | None]:
    """(format, bytes or None, why None) of the weights at ``weight_dtype`` or as shipped."""
    if weight_dtype is None:
        shipped = params.shipped_weights(cfg)
        return shipped.format, shipped.bytes, shipped.note or None
    count = params.count_params(cfg)
    if count.total is None:
        return weight_dtype, None, count.note
    return weight_dtype, params.weight_bytes(cfg, weight_dtype), None


def size_report(args: argparse.Namespace) -> SizeReport:
    """The report for parsed ``kvlib size`` arguments; UsageError/ConfigError on bad input."""
    cfg, kv_dtype, weight_dtype, gpu, free = _inputs(args)
    tp = args.tp
    count = params.count_params(cfg)
    weight_format, weights, weight_note = _weights(cfg, weight_dtype)
    per_gpu_kv = bounds.kv_bytes_per_gpu(cfg, args.context, kv_dtype, tp)
    notes = _notes(cfg, kv_dtype, gpu, kv_memory_given=free is not None)
    usable = None if gpu is None else vllm_budget_bytes(gpu, args.gpu_memory_utilization)
    weights_per_gpu = (
        None if weights is None else bounds.weight_bytes_per_gpu(cfg, tp, weight_dtype)
    )
    if free is None and usable is not None and weights_per_gpu is not None:
        free = usable - weights_per_gpu
    fits = None if free is None else free > 0
    free_kv = None if free is None else max(free, 0)
    seats = None if free_kv is None else sizing.seats(free_kv, per_gpu_kv)
    step_bytes = speed = min_gpus = None
    if gpu is not None and weights is not None:
        if fits and seats is not None and seats >= args.batch:  # a step that can run
            step_bytes = bounds.decode_bytes_per_gpu(
                cfg, args.batch, args.context, kv_dtype, weight_dtype, tp
            )
            speed = bounds.decode_tokens_per_s(step_bytes, gpu.hbm_bandwidth_bytes_per_s)
        min_gpus = bounds.min_gpus(cfg, gpu, weight_dtype, args.gpu_memory_utilization)
    with_vllm = args.engine in ("vllm", "both")
    pool = _pool(cfg, args, kv_dtype, free_kv, notes if with_vllm else [])
    sglang = None
    if args.engine != "vllm":
        given = None if gpu is not None and args.kv_memory is None else free
        sglang = _sglang(cfg, args, kv_dtype, gpu, weights_per_gpu, given, notes)
        if sglang is not None and args.engine == "both":
            notes += _differences(args, gpu, free_kv, pool, sglang)
    return SizeReport(
        model=cfg.name,
        model_type=cfg.model_type,
        attention=cfg.attention_type,
        num_hidden_layers=cfg.num_hidden_layers,
        layer_kinds={kind: cfg.layer_kinds.count(kind) for kind in dict.fromkeys(cfg.layer_kinds)},
        sliding_window_tokens=cfg.sliding_window,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        latent_dims=None if cfg.mla is None else (cfg.mla.kv_lora_rank, cfg.mla.qk_rope_head_dim),
        context_tokens=args.context,
        batch=args.batch,
        kv_dtype=kv_dtype,
        kv_bytes_per_token=sizing.kv_bytes_per_token(cfg, kv_dtype),
        kv_bytes=sizing.kv_bytes(cfg, args.context, kv_dtype),
        kv_bytes_batch=sizing.kv_bytes(cfg, args.context, kv_dtype, batch=args.batch),
        param_count=count.total,
        active_param_count=count.active,
        param_count_note=count.note or None,
        weight_dtype=weight_dtype or AUTO,
        weight_format=weight_format,
        weight_bytes=weights,
        weight_note=weight_note,
        tp=tp,
        gpu=None if gpu is None else gpu.name,
        gpu_memory_bytes=None if gpu is None else gpu.memory_bytes,
        gpu_memory_source=None if gpu is None else gpu.memory_source,
        gpu_memory_utilization=None if gpu is None else args.gpu_memory_utilization,
        weight_bytes_per_gpu=weights_per_gpu,
        min_gpus=min_gpus,
        valid_tp_degrees=None if gpu is None else bounds.valid_tp_degrees(cfg),
        hbm_bandwidth_bytes_per_s=None if gpu is None else gpu.hbm_bandwidth_bytes_per_s,
        kv_bytes_per_gpu=per_gpu_kv,
        free_kv_bytes_per_gpu=free_kv,
        fits=fits,
        seats=seats,
        decode_bytes_per_gpu=step_bytes,
        decode_tokens_per_s_bound=speed,
        block_size=args.block_size,
        block_bytes=pool.block_bytes,
        blocks_per_request=pool.blocks_per_request,
        pool_blocks=pool.pool_blocks,
        pool_tokens=pool.pool_tokens,
        max_concurrency=pool.max_concurrency,
        vllm_version=args.vllm_version,
        estimated_max_model_len=pool.estimated_max_model_len,
        engine=args.engine,
        sglang=sglang,
        notes=notes,
    )


@dataclass(frozen=True)
class _Pool:
    block_bytes: int | None = None
    blocks_per_request: int | None = None
    pool_blocks: int | None = None
    pool_tokens: int | None = None
    max_concurrency: float | None = None
    estimated_max_model_len: int | None = None


def _pool(
    cfg: ModelConfig, args: argparse.Namespace, kv_dtype: str, free: int | None, notes: list[str]
) -> _Pool:
    """vLLM's KV pool on one GPU (:mod:`kvlib.paging.vllm_pool`), with max_model_len = --context."""
    if cfg.mla is not None and args.block_size % 64:
        # CudaPlatform.check_and_update_config in vllm/platforms/cuda.py.
        notes.append(
            f"vLLM's MLA kernels do not run {args.block_size}-token blocks: FlashMLA (Hopper) "
            "forces 64, CUTLASS MLA (Blackwell) 128; pass --block-size 64 to match a Hopper log"
        )
    try:
        page = vllm_pool.unified_page_bytes(cfg, args.block_size, kv_dtype, args.tp)
        per_sequence = vllm_pool.blocks_per_request(cfg, args.context, args.block_size, kv_dtype)
    except ValueError as err:  # a layout vLLM pages in a way kvlib does not model
        notes.append(f"no vLLM pool figures: {err}")
        return _Pool()
    if free is None:
        return _Pool(page, per_sequence)
    pool = vllm_pool.kv_pool(cfg, free, max_model_len=args.context, block_size=args.block_size,
                             kv_dtype=kv_dtype, tp=args.tp, vllm_version=args.vllm_version)
    if pool.refusal:  # vLLM logs no pool it refuses to start with: its message instead
        notes.append(f"vLLM {args.vllm_version} would not start: {pool.refusal}")
        if free <= 0:  # no memory, no pool
            return _Pool(page, per_sequence)
        return _Pool(page, per_sequence, pool.num_blocks, pool.pool_tokens, None,
                     pool.estimated_max_model_len)
    notes.append(
        f"pool as vLLM {args.vllm_version} logs it: '{pool.startup_lines[0]}', "
        f"'{pool.startup_lines[1]}' (max_model_len = --context, max_num_batched_tokens = "
        f"{vllm_pool.DEFAULT_MAX_NUM_BATCHED_TOKENS:,})"
    )
    return _Pool(page, per_sequence, pool.num_blocks, pool.pool_tokens, pool.max_concurrency)


def _sglang(
    cfg: ModelConfig,
    args: argparse.Namespace,
    kv_dtype: str,
    gpu: GPUSpec | None,
    weights_per_gpu: int | None,
    kv_memory: int | None,
    notes: list[str],
) -> SGLangReport | None:
    """SGLang's pool in ``--kv-memory``, or in ``mem_fraction_static x total - weights``
    on ``--gpu``; None, with the reason in the notes, for a model SGLang sizes otherwise."""
    try:
        cell = sglang_pool.cell_size_bytes(cfg, kv_dtype, args.tp)
    except ValueError as err:
        notes.append(f"no SGLang pool figures: {err}")
        return None
    fraction = rest = None
    if kv_memory is not None:
        rest = kv_memory
    elif gpu is not None:
        total = gpu.vllm_total_bytes
        fraction = args.mem_fraction_static or sglang_pool.default_mem_fraction_static(
            total, args.tp)
        if weights_per_gpu is not None:
            rest = sglang_pool.rest_memory_bytes(total, weights_per_gpu, fraction)
        chosen = "given" if args.mem_fraction_static else "SGLang's default for this GPU and --tp"
        notes.append(
            f"SGLang: rest = mem_fraction_static {fraction} ({chosen}) x "
            f"{gpu.vllm_total_label} total - weights per GPU (profile_max_num_token); SGLang "
            "measures free memory before loading, a little under the total: an upper bound"
        )
    if rest is None:
        return SGLangReport(cell, None, None, None, None, args.page_size, fraction, None, None)
    if rest <= 0:
        notes.append("SGLang would not start: 'Not enough memory. Please try to increase "
                     "--mem-fraction-static.' (no memory left for the pool)")
        return SGLangReport(cell, 0, None, None, None, args.page_size, fraction, rest, None)
    pool = sglang_pool.sglang_pool(cfg, rest, kv_dtype=kv_dtype, tp=args.tp,
                                   page_size=args.page_size)
    if pool.max_total_num_tokens <= 0:  # init_memory_pool's check
        notes.append("SGLang would not start: 'Not enough memory. Please try to increase "
                     f"--mem-fraction-static.' (less than one {args.page_size}-token page "
                     "fits)")
        return SGLangReport(cell, 0, None, None, None, args.page_size, fraction, rest, None)
    return SGLangReport(cell, pool.max_total_num_tokens, pool.k_size_bytes, pool.v_size_bytes,
                        pool.kv_size_bytes, args.page_size, fraction, rest,
                        list(pool.startup_lines))


def _differences(
    args: argparse.Namespace, gpu: GPUSpec | None, vllm_free: int | None, pool: _Pool,
    sglang: SGLangReport,
) -> list[str]:
    """Why the two engines' pools differ, in numbers where they are known."""
    lines = []
    if gpu is not None and args.kv_memory is None and vllm_free is not None \
            and sglang.rest_memory_bytes is not None:
        lines.append(
            f"share: vLLM gives the cache {args.gpu_memory_utilization} x total - weights - "
            f"what its profile run measures ({format_bytes(vllm_free)} before that run), "
            f"SGLang mem_fraction_static {sglang.mem_fraction_static} x total - weights "
            f"({format_bytes(max(sglang.rest_memory_bytes, 0))}): SGLang keeps activations and "
            "CUDA graphs outside its fraction by rule, vLLM by measuring them"
        )
    lines.append(
        f"granularity: vLLM counts whole {args.block_size}-token blocks "
        f"({'?' if pool.pool_blocks is None else f'{pool.pool_blocks:,}'} blocks), SGLang "
        f"tokens rounded to its {args.page_size}-token page, plus {args.page_size} padding "
        "slot(s) in every buffer"
    )
    return lines


def _notes(
    cfg: ModelConfig, kv_dtype: str, gpu: GPUSpec | None, kv_memory_given: bool
) -> list[str]:
    """What the figures assume, where a reader could assume otherwise."""
    notes = list(dict.fromkeys(n for n in (s.layout_note(kv_dtype) for s in cfg.layers) if n))
    if gpu is not None and not gpu.driver_reported:
        notes.append(f"{gpu.name} memory: {gpu.memory_source}")
    if gpu is not None and not kv_memory_given:
        total = (
            "nvidia-smi's total: no CUDA reading recorded, so an upper bound on vLLM's pool"
            if gpu.cuda_total_bytes is None
            else f"CUDA's total, as vLLM multiplies it: {gpu.cuda_total_source}"
        )
        notes.append(
            f"free memory = utilization x {gpu.vllm_total_label} total - weights per GPU "
            f"({total}); an engine grants somewhat less: it also reserves "
            "activations and CUDA graphs"
        )
    return notes


def _bytes(n: int | None, exact: bool = False) -> str:
    if n is None:
        return "unknown"
    return f"{format_bytes(n)} ({n:,} B)" if exact else format_bytes(n)


def _model_rows(r: SizeReport) -> list[tuple[str, str]]:
    layers = f"{r.num_hidden_layers}"
    if len(r.layer_kinds) > 1:
        layers += ": " + ", ".join(f"{count} {kind}" for kind, count in r.layer_kinds.items())
    if r.sliding_window_tokens:
        layers += f" (window {r.sliding_window_tokens:,} tokens)"
    params = "unknown" if r.param_count is None else f"{r.param_count / 1e9:,.2f} B"
    if r.param_count is not None and r.active_param_count not in (None, r.param_count):
        params += f" ({(r.active_param_count or 0) / 1e9:,.2f} B active a token)"
    weights = f"weights ({r.weight_format})"
    return [
        ("model", f"{r.model} ({r.attention})"),
        ("layers", layers),
        # An MLA layer caches one latent and one rotary key, not heads of keys and values.
        ("KV heads x head dim", f"{r.num_key_value_heads} x {r.head_dim}")
        if r.latent_dims is None
        else ("latent + rope key", f"{r.latent_dims[0]} + {r.latent_dims[1]} a layer"),
        (f"KV per token ({r.kv_dtype})", _bytes(r.kv_bytes_per_token, exact=True)),
        (f"KV for {r.context_tokens:,} tokens", _bytes(r.kv_bytes, exact=True)),
        (f"KV for batch of {r.batch}", _bytes(r.kv_bytes_batch)),
        ("parameters", params),
        (weights, _bytes(r.weight_bytes)),
    ]


def _gpu_rows(r: SizeReport) -> list[tuple[str, str]]:
    if r.gpu is None:
        return []
    return [
        (
            "GPU",
            f"{r.gpu} x {r.tp}, {_bytes(r.gpu_memory_bytes)} each (driver), "
            f"{r.gpu_memory_utilization:.0%} usable",
        ),
        ("weights per GPU", _bytes(r.weight_bytes_per_gpu)),
        ("min GPUs for weights", "unknown" if r.min_gpus is None else str(r.min_gpus)),
        ("valid TP degrees", ", ".join(map(str, r.valid_tp_degrees or []))),
    ]


def _seat_rows(r: SizeReport) -> list[tuple[str, str]]:
    rows = []
    if r.free_kv_bytes_per_gpu is not None:
        rows += [
            ("free for KV per GPU", _bytes(r.free_kv_bytes_per_gpu)),
            ("KV per sequence per GPU", _bytes(r.kv_bytes_per_gpu)),
            (f"seats at {r.context_tokens:,} tokens", str(r.seats)),
        ]
    if r.decode_tokens_per_s_bound is not None and r.hbm_bandwidth_bytes_per_s is not None:
        rows.append(
            (
                f"decode bound at batch {r.batch}",
                f"{r.decode_tokens_per_s_bound:,.1f} tokens/s a sequence "
                f"({_bytes(r.decode_bytes_per_gpu)} a step at "
                f"{format_rate(r.hbm_bandwidth_bytes_per_s)})",
            )
        )
    return rows


def _pool_rows(r: SizeReport) -> list[tuple[str, str]]:
    if r.block_bytes is None:
        return []
    rows = [(f"page ({r.block_size} tokens, all layers)", _bytes(r.block_bytes, exact=True))]
    rows.append((f"blocks for {r.context_tokens:,} tokens", f"{r.blocks_per_request:,}"))
    if r.pool_blocks is not None:
        rows.append(("pool (vLLM)", f"{r.pool_blocks:,} blocks = {r.pool_tokens:,} tokens"))
    if r.max_concurrency is not None:
        rows.append(
            ("max concurrency (vLLM)", f"{r.max_concurrency:.2f}x at {r.context_tokens:,} tokens")
        )
    if r.estimated_max_model_len is not None:
        rows.append(("longest that fits (vLLM)", f"{r.estimated_max_model_len:,} tokens"))
    return rows


def _sglang_rows(r: SizeReport) -> list[tuple[str, str]]:
    s = r.sglang
    if s is None:
        return []
    rows = [("cell (SGLang, a token, all layers)", _bytes(s.cell_size_bytes, exact=True))]
    if s.mem_fraction_static is not None:
        rows.append(("mem_fraction_static (SGLang)", f"{s.mem_fraction_static}"))
    if s.max_total_num_tokens is not None:
        rows.append(("pool (SGLang)", f"{s.max_total_num_tokens:,} tokens"))
    for line in s.startup_lines or []:
        rows.append(("SGLang logs", line))
    return rows


def render(report: SizeReport) -> str:
    """The table: one row a figure, then notes on what the figures assume."""
    pools = _pool_rows(report) if report.engine != "sglang" else []
    rows = (_model_rows(report) + _gpu_rows(report) + _seat_rows(report) + pools
            + _sglang_rows(report))
    if report.fits is False:
        rows.append(("warning", "the weights do not fit: raise --tp or lower --weight-dtype"))
    # The weights are unknown because the parameter count is: one reason, said once.
    for note in dict.fromkeys((report.param_count_note, report.weight_note)):
        if note:
            rows.append(("unknown because", note))
    rows += [("note", note) for note in report.notes]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
