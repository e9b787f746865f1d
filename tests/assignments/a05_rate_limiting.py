"""Chapter 5: rate limits, queues and shedding. Every answer is written on the student's
own numbers, as the cell above each answer prints and names them."""

ASSIGNMENT = "05_rate_limiting"
NOTEBOOK = "rate_limiting"
WRONG = {
    "admitted": (
        "admitted = min(N.first_burst, N.capacity) + min(\n"
        "    N.second_burst, N.capacity, N.requests_per_minute * N.gap_s)",
        "per-minute rate",
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
    "paid_p95_after_s": (
        "from kvlib.serving.queueing import mmc\n"
        "total = (paid_per_minute + free_per_minute) / 60\n"
        "paid_p95_after_s = mmc(total, service_s, slots * 7 // 10).p95_wait_s",
        "ignores the priority",
    ),
}
