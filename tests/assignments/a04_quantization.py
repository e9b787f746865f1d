"""Chapter 4: quantization. Every answer is written on the student's own numbers ``N``."""

ASSIGNMENT = "04_quantization"
NOTEBOOK = "quantization"
WRONG = {
    "weights_gb": (
        "weights_gb = N.params * N.bits / 8 / GB",
        "left out the scales",
    ),
    "clip_limit": (
        "vllm = 200 if N.tensor == 'keys' else 100\n"
        "clip_limit = N.calib_max / (448 if N.rule == 'llm-compressor' else vllm)",
        "gave the scale",
    ),
    "tokens_per_s": (
        "params, kv_bytes_per_token = N.model\n"
        "tokens_per_s = N.gpu[1] * GB / (params * N.weight_bits / 8)",
        "left out the KV cache",
    ),
    "kv_seats": (
        "layers, kv_heads, head_dim = N.model\n"
        "bits = 4 if N.cache[0] == 'q4_0' else 8\n"
        "bytes_per_token = 2 * layers * kv_heads * head_dim * bits // 8\n"
        "kv_seats = N.free_gib * GiB // (bytes_per_token * N.context)",
        "left out the scales",
    ),
    "max_error": (
        "max_error = (max(N.hi, 0) - min(N.lo, 0)) / 16 / 2",
        "15 steps",
    ),
}
