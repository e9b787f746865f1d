"""kvlib: KV cache and LLM serving memory arithmetic.

Import what you need from the submodules (``kvlib.sizing``, ``kvlib.config``,
...). Nothing here imports torch: modules that need it import it inside the
functions that use it, or live in ``kvlib.nn`` (and ``kvlib.engine.core``).

Where each chapter's code lives (a package, then its modules in brackets):

Shared by every chapter, the leaves:
    kvlib.units
    kvlib.dtypes
    kvlib.hardware
    kvlib._validate

Chapter 1, the KV cache (bytes, seats, context, time bounds, weights; ``kvlib.view``
holds what every chapter derives from a model config, worked out once):
    kvlib.sizing
    kvlib.bounds
    kvlib.view
    kvlib.config (fields, guards, kv_heads, layer_types, layers, model, parts)
    kvlib.specs (attention, base, latent, states)
    kvlib.weights (families, families_moe, layouts, params, tensors)

Chapter 2, paging (vLLM's block pool, block tables, prefix cache, pool arithmetic):
    kvlib.paging (block_pool, prefix, sglang_pool, step_bytes, table, vllm_pool)
    kvlib.paging.fragmentation (paged, reserved, shares, workload)
    kvlib.nn.paged_attention

Chapter 3, Multi-head Latent Attention:
    kvlib.mla (cache, cost, placement)
    kvlib.nn.mla
    kvlib.nn.sparse

Chapter 4, quantization:
    kvlib.weights.quantized
    kvlib.nn.quant
    kvlib.nn.quant_fp8
    kvlib.nn.quant_int
    kvlib.nn.recall

Chapter 5, rate limiting and queues:
    kvlib.serving (bucket, erlang, latency, queueing, ratelimit, retries, simulate, slots)

Chapter 6, timing (the harness, ``bench``, is the package itself):
    kvlib.timing (devices, kernels, roofline, workloads)

Chapter 7, the capstone:
    kvlib.step
    kvlib.capacity (assessment, crossover, examples, remedies, scenario, symptoms)
    kvlib.engine (core, gpu_clock, scheduler)
    kvlib.nn (decoder)

Chapter 8, beyond one GPU (tiers, reload or recompute, prefill/decode hand-off):
    kvlib.tiers (handoff, links, nodes, reload, split)
    kvlib.engine.host_tier
    kvlib.engine.disagg
    kvlib.serving.routing

The command line (``kvlib size``, ``kvlib bench``, ...):
    kvlib.cli
    kvlib.__main__
    kvlib.commands (bench, capacity, engine_bench, flags, handoff, hub, queue, reload, size,
        step)
    (``kvlib grade`` is the course's, added through the ``kvlib.commands`` entry points;
    the answer checks a graded notebook imports are the course's too, ``course.checks``)

ARCHITECTURE.md at the repository's root says what each package owns and why.
"""

__version__ = "0.1.0"
