"""Chapter 1: sizing the KV cache. Every answer is written on the student's own numbers ``N``."""

ASSIGNMENT = "01_kv_cache"
NOTEBOOK = "kv_cache"
WRONG = {
    "bytes_per_token": (
        "bytes_per_token = 2 * N.layers * (N.kv_heads * N.group) * N.head_dim * 1",
        "attention heads",
    ),
    "seats": (
        "seats = int(N.free_gib * 1e9 // (N.context_tokens * N.kv_bytes_per_token))",
        "GiB is 2^30 bytes",
    ),
    "prefill_s": (
        "prefill_s = N.params_billion * 1e9 * N.prompt_tokens / (N.tflop_per_s * 1e12)",
        "left out the 2",
    ),
    "conversation_bytes": (
        "conversation_bytes = sum(2 * config['num_key_value_heads'] * config['head_dim'] * 2\n"
        "    * min(N.context_tokens, config['sliding_window'])\n"
        "    if kind == 'sliding_attention' else 2 * config['num_key_value_heads']\n"
        "    * config['head_dim'] * 2 * N.context_tokens for kind in config['layer_types'])",
        "the window includes the current token",
    ),
    "batch_tokens_per_s": (
        "batch_tokens_per_s = N.batch * N.tb_per_s * 1e12 / (N.batch * (N.params_billion * 1e9\n"
        "    * N.bytes_per_weight + N.context_tokens * N.kv_bytes_per_token))",
        "share one read of the weights",
    ),
    "cache_tokens": (
        "cache_tokens = (int(N.utilization * N.gpu_mib * MiB) - params_billion * 10**9\n"
        "    * bytes_per_weight) // (N.kv_bytes_per_token // gpus)",
        "you subtracted all of them",
    ),
}
