"""Chapter 2: paged attention. Every answer is written on the student's own numbers ``N``."""

ASSIGNMENT = "02_paging"
NOTEBOOK = "paging"
WRONG = {
    "blocks": ("blocks = N.context_tokens // N.block_size", "you rounded down"),
    "reserved_extra_mib": (
        "layers, kv_heads, head_dim = N.model\n"
        "per_token = 2 * layers * kv_heads * head_dim * 2\n"
        "reserved_extra_mib = sum(N.max_model_len - t for t in N.lengths) * per_token / MiB",
        "whole blocks",
    ),
    "prefix_saved_mib": (
        "layers, kv_heads, head_dim = N.model\n"
        "per_token = 2 * layers * kv_heads * head_dim * 2\n"
        "prefix_saved_mib = N.requests * (N.system_tokens // N.block_size) * N.block_size"
        " * per_token / MiB",
        "one copy of it is still stored",
    ),
    "fork_blocks": (
        "partial = -(-N.prompt_tokens // N.block_size)\n"
        "per_sample = -(-(N.prompt_tokens + N.new_tokens) // N.block_size)\n"
        "fork_blocks = partial + N.samples * (per_sample - partial)",
        "partly filled last block as well",
    ),
    "pool_tokens": (
        "layers, kv_heads, head_dim = N.model\n"
        "b = {'bf16': 2, 'fp8': 1}[N.kv_dtype]\n"
        "pool_tokens = N.kv_memory_bytes // (2 * layers * kv_heads * head_dim * b)",
        "first cuts it into whole blocks",
    ),
    "max_concurrency": (
        "layers, kv_heads, head_dim = N.model\n"
        "per_token = 2 * layers * kv_heads * head_dim * 2\n"
        "max_concurrency = N.kv_memory_bytes // (N.block_size * per_token)"
        " * N.block_size / N.max_model_len",
        "divided the pool's tokens by max_model_len",
    ),
    "hybrid_concurrency": (
        "page = 2 * 16 * 8 * 64 * 2\n"
        "num_blocks = N.kv_memory_bytes // (page * (N.layers // 2))\n"
        "hybrid_concurrency = num_blocks / (2 * -(-N.max_model_len // 16))",
        "budgeted the sliding group like the full one",
    ),
}
