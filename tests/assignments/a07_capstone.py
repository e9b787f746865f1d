"""Chapter 7: a KV-bound deployment. Every answer is written on the student's own numbers ``N``."""

ASSIGNMENT = "07_capstone"
NOTEBOOK = "capstone"
WRONG = {
    "seats_freed": (
        "layers, heads, kv_heads, head_dim = N.model\n"
        "per_token = 2 * layers * kv_heads * head_dim * 2\n"
        "seats_freed = N.free_gib * GiB // (N.need * per_token)",
        "how many more than before",
    ),
    "fp8_seats": (
        "gpu, memory_mib, layers, heads, kv_heads, head_dim, params_billion = N.setup\n"
        "pool = memory_mib * MiB * 9 // 10 - params_billion * 10**9 - N.runtime_gib * GiB\n"
        "fp8_seats = pool // (N.context * 2 * layers * kv_heads * head_dim)",
        "quantizes only the cache",
    ),
    "tp_gpus": (
        "layers, heads, kv_heads, head_dim, params_billion, gpu_mib, sequences, context = N.case\n"
        "budget = gpu_mib * MiB * 9 // 10 - 2 * GiB\n"
        "tp_gpus = next(tp for tp in (1, 2, 4, 8) if 2 * params_billion * 10**9 / tp <= budget)",
        "weights alone",
    ),
    "still_running": (
        "num_blocks = N.admitted * N.prompt_blocks + N.extra_blocks\n"
        "prompt_tokens = N.prompt_blocks * N.block_size - N.prompt_gap\n"
        "still_running = min(N.admitted + N.waiting,\n"
        "                    num_blocks // -(-prompt_tokens // N.block_size))",
        "newest are preempted",
    ),
    "crossover": (
        "crossover = N.gpu_hour_price * 1e6 / (N.tokens_per_s_per_gpu * N.price_per_million)",
        "3,600 seconds",
    ),
}
