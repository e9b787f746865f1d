"""Chapter 3: MLA caches, reductions, seats under tensor parallelism, the absorbed path,
the decompress-or-absorb crossover and TP versus DP attention.
Every answer is written on the student's own numbers ``N``."""

ASSIGNMENT = "03_mla"
NOTEBOOK = "mla"
WRONG = {
    "latent_bytes": (
        "latent_bytes = 2 * N.layers * (N.kv_lora_rank + N.rope_dim) * N.bytes_per_element",
        "multiplied by 2 for keys and values",
    ),
    "reduction": (
        "factor = (2 * N.gqa_layers * N.gqa_heads[1] * N.head_dim * 2) / "
        "(2 * N.mla_layers * (N.kv_lora_rank + N.rope_dim) * 2)",
        "latent has no factor 2",
    ),
    "seats_gained": (
        "free = N.free_gib * GiB\n"
        "mla = N.context_tokens * N.mla_layers * (N.kv_lora_rank + N.rope_dim) * 2 // N.gpus\n"
        "gqa = N.context_tokens * 2 * N.gqa_layers * (8 // N.gpus) * 128 * 2\n"
        "seats_gained = free // mla - free // gqa",
        "does not split the MLA latent",
    ),
    "absorbed_flops": (
        "absorbed_flops = 2 * N.heads * N.context_tokens * (N.nope_dim + N.rope_dim)"
        " + 2 * N.heads * N.context_tokens * N.v_dim",
        "decompressed keys",
    ),
    "sparse_query_mib": (
        "sparse_query_mib = N.layers * min(N.top_k, N.context_tokens)"
        " * DS_MLA_FP8_BYTES_PER_TOKEN / MiB",
        "left out the indexer keys",
    ),
    "crossover_tokens": (
        "low_rank = N.kv_lora_rank * (N.nope_dim + N.v_dim)\n"
        "wider = 2 * N.kv_lora_rank - N.nope_dim - N.v_dim\n"
        "crossover_tokens = N.context_tokens * low_rank // (low_rank + N.context_tokens * wider)",
        "one more",
    ),
    "dp_seats_gained": (
        "per_sequence = N.context_tokens * N.layers * (N.kv_lora_rank + N.rope_dim) * 2\n"
        "free = N.budget_gib * GiB - (N.dense_gib + N.expert_gib) * GiB // N.gpus\n"
        "dp_seats_gained = N.gpus * (free // per_sequence) - free // per_sequence",
        "whole copy",
    ),
}
