"""Chapter 1: sizing the KV cache."""

ASSIGNMENT = "01_kv_cache"
NOTEBOOK = "kv_cache"
WRONG = {
    "bytes_per_token": ("bytes_per_token = 2 * 48 * 40 * 128 * 1", "attention heads"),
    "seats": ("seats = int(30e9 / (10_000 * 131_072))", "30 GB"),
    "prefill_s": ("prefill_s = 32e9 * 6000 / 400e12", "left out the 2"),
}
