"""Chapter 6: timing and the roofline."""

ASSIGNMENT = "06_timing"
NOTEBOOK = "timing"
WRONG = {
    "intensity": (
        "intensity = 2 * N.model[0] * 1e9 * N.batch / (2 * N.model[0] * 1e9)",
        "left out the cache",
    ),
    "ridge_batch": (
        "ridge_batch = math.ceil(2 * gpu.bf16_dense_flops_per_s / gpu.hbm_bandwidth_bytes_per_s"
        " * N.weights[1] / 2)",
        "with sparsity",
    ),
    "ttft_s": (
        "ttft_s = 2 * N.model[0] * 1e9 * N.prompt_tokens / (N.mfu * gpu.bf16_dense_flops_per_s)",
        "left out attention",
    ),
    "copy_fraction": (
        "fraction = n_bytes / (median_us * 1e-6) / (N.datasheet_tb_s * 1e12)",
        "counted the copied bytes once",
    ),
}
