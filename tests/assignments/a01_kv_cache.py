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
}
