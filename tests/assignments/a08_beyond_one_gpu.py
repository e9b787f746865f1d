"""Chapter 8: beyond one GPU. Every answer is written on the student's own numbers ``N``."""

ASSIGNMENT = "08_beyond_one_gpu"
NOTEBOOK = "beyond_one_gpu"
WRONG = {
    "reload_ms": (
        "layers, heads, kv_heads, head_dim = N.model\n"
        "name, joins, rate, unit = N.link\n"
        "per_token = layers * (kv_heads // N.tp) * head_dim * 2\n"
        "if unit == 'GT/s':\n"
        "    bytes_per_s = rate * 16 * 128 / 130 * 1e9 / 8\n"
        "else:\n"
        "    bytes_per_s = rate * {'Gb/s': 1e9 / 8, 'GB/s': 1e9, 'MB/s': 1e6}[unit]\n"
        "reload_ms = 1e3 * N.prefix * per_token / bytes_per_s",
        "count K and V both",
    ),
    "handoff_ms": (
        "layers, heads, kv_heads, head_dim = N.model\n"
        "name, joins, rate, unit = N.link\n"
        "cache = N.prompt * 2 * layers * kv_heads * head_dim * 2\n"
        "bytes_per_s = rate * {'Gb/s': 1e9 / 8, 'GB/s': 1e9}[unit]\n"
        "handoff_ms = 1e3 * cache / max(N.tps) / bytes_per_s",
        "set the pace",
    ),
    "prefill_per_decode": (
        "layers, heads, kv_heads, head_dim, params_billion = N.model\n"
        "f = N.mfu * peak_flops_per_s\n"
        "params = params_billion * 10**9\n"
        "read_s = 2 * params / bandwidth_bytes_per_s\n"
        "prefill_s = (max(read_s, 2 * params * N.prompt / f)\n"
        "             + N.prompt * (N.prompt + 1) // 2 * 4 * head_dim * heads * layers / f)\n"
        "kv = N.batch * (N.prompt + N.output // 2) * 4 * layers * kv_heads * head_dim\n"
        "step_s = max(read_s, 2 * params * N.batch / f) + kv / bandwidth_bytes_per_s\n"
        "prefill_per_decode = N.batch / step_s * prefill_s",
        "N.output steps",
    ),
    "ttft_saved_ms": (
        "layers, heads, kv_heads, head_dim, params_billion = N.model\n"
        "name, gt_per_s = N.link\n"
        "f = N.mfu * peak_flops_per_s\n"
        "params = params_billion * 10**9\n"
        "recompute_s = (max(2 * params / bandwidth_bytes_per_s, 2 * params * N.prefix / f)\n"
        "               + N.prefix * (N.prefix + 1) // 2 * 4 * head_dim * heads * layers / f)\n"
        "link = gt_per_s * 16e9 * 128 / 130 / 8\n"
        "reload_s = N.prefix * 4 * layers * kv_heads * head_dim / link\n"
        "ttft_saved_ms = 1e3 * (recompute_s - reload_s)",
        "multiply by the reuse fraction",
    ),
}
