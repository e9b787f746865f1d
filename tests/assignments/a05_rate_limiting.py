"""Chapter 5: rate limits, queues and shedding. Every answer is written on the student's
own numbers, as the cell above each answer prints and names them."""

ASSIGNMENT = "05_rate_limiting"
NOTEBOOK = "rate_limiting"
WRONG = {
    "admitted": (
        "rate = N.requests_per_minute / 60\n"
        "tokens = N.capacity - N.first_burst + rate * N.idle_s\n"
        "second = min(N.second_burst, math.floor(tokens))\n"
        "tokens = tokens - second + rate * N.gap_s\n"
        "admitted = N.first_burst + second + min(N.third_burst, math.floor(tokens))",
        "never holds more than its capacity",
    ),
    "p95_wait_s": (
        "rho = arrivals_per_minute / 60 * service_s\np95_wait_s = rho * service_s / (1 - rho)",
        "mean wait",
    ),
    "shed_fraction": (
        "total = (paid_per_minute + free_per_minute) / 60\n"
        "shed_fraction = 1 - target * slots / service_s / total",
        "share of all traffic",
    ),
    "share_over_old_p95": (
        "from kvlib.serving.queueing import priority_mmc\n"
        "paid, free = paid_per_minute / 60, free_per_minute / 60\n"
        "old_p95 = priority_mmc(paid, free, service_s, slots).paid_p95_wait_s\n"
        "share_over_old_p95 = math.exp(-(slots * 7 // 10 / service_s - paid) * old_p95)",
        "leaves out C",
    ),
    "p95_queue_wait_s": (
        "from kvlib.serving.queueing import mmc\n"
        "seat = (prompt_tokens + output_tokens) * kv_kib_per_token * 1024\n"
        "c = min(max_num_seqs, free_gib * 1024**3 // seat)\n"
        "bw = bandwidth_tb_s * 10**12\n"
        "flop_s = 2 * params_b * 10**9 / (mfu * peak_tflops * 10**12)\n"
        "matmuls = max(weights_gb * 10**9 / bw, c * flop_s)\n"
        "step = matmuls + c * seat / bw\n"
        "p95_queue_wait_s = mmc(arrivals_per_minute / 60, output_tokens * step, c).p95_wait_s",
        "prefill is charged",
    ),
}
