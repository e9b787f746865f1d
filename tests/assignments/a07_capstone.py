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
        "gpu, layers, heads, kv_heads, head_dim, params_billion = N.setup\n"
        "pool = math.ceil(total_bytes * 0.92) - params_billion * 10**9 - N.runtime_gib * GiB\n"
        "fp8_seats = pool // (N.context * 2 * layers * kv_heads * head_dim)",
        "quantizes only the cache",
    ),
    "tp_gpus": (
        "layers, heads, kv_heads, head_dim, params_billion, gpu, sequences, context = N.case\n"
        "budget = math.ceil(total_bytes * 0.92) - 2 * GiB\n"
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
    "config_seats": (
        "if config.get('kv_lora_rank'):\n"
        "    per_token = (config['kv_lora_rank'] + config['qk_rope_head_dim']) * 2\n"
        "else:\n"
        "    head_dim = config.get('head_dim') or config['hidden_size'] // "
        "config['num_attention_heads']\n"
        "    per_token = 2 * (config['num_key_value_heads'] // N.tp) * head_dim * 2\n"
        "config_seats = N.pool_gib * GiB // (N.context * per_token)",
        "cached in every layer",
    ),
    "first_token_step": (
        "first_token_step = math.ceil(N.prompt / (N.budget - N.decoding)) + 1",
        "not the step after it",
    ),
    "step_ms": (
        "layers, heads, kv_heads, head_dim, params_billion = N.model\n"
        "f = N.mfu * peak_flops_per_s\n"
        "weights_s = max(2e9 * params_billion / bandwidth_bytes_per_s,\n"
        "                2e9 * params_billion * N.decoding / f)\n"
        "decode_s = N.decoding * N.context * 4 * layers * kv_heads * head_dim"
        " / bandwidth_bytes_per_s\n"
        "step_ms = 1e3 * (weights_s + decode_s)",
        "prefill chunk out",
    ),
}
