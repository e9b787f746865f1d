"""Time the fragmentation simulator and the paged-attention overhead on this machine's CPU.

Usage: ``python scripts/bench_paging.py [--requests 10000] [--threads 1]``.

1. Simulates ``--requests`` ShareGPT-like requests under each policy in a 12 GiB
   OPT-13B cache (15,728 token slots, the PagedAttention paper's setting) and
   prints the token-state share and the wall time of each run.
2. Times :func:`kvlib.nn.paged_attention.paged_decode_attention` against
   ``scaled_dot_product_attention`` on the same keys and values stored
   contiguously (one decode step, batch 8, 32 query / 8 KV heads of 128,
   1,024 cached tokens, 16-token blocks, float32), with
   ``torch.utils.benchmark.Timer.blocked_autorange``, and prints the ratio of
   the medians measured in this one run.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from kvlib.paging.fragmentation import POLICIES, SHAREGPT_LIKE, sample_requests, simulate
from kvlib.sizing import kv_bytes_per_token_dense
from kvlib.units import GiB


def bench_simulator(num_requests: int) -> None:
    capacity = 12 * GiB // kv_bytes_per_token_dense(40, 40, 128, 2)  # OPT-13B, fp16
    requests = sample_requests(num_requests, SHAREGPT_LIKE, seed=0)
    print(f"fragmentation: {num_requests:,} requests, {capacity:,} token slots")
    for policy in POLICIES:
        start = time.perf_counter()
        shares = simulate(requests, policy, capacity)
        seconds = time.perf_counter() - start
        print(f"  {policy:7s} token states {shares.token_states:6.1%}  "
              f"({shares.preemptions:,} preemptions)  {seconds * 1000:7.1f} ms")


def bench_attention(threads: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch.utils.benchmark import Timer

    from kvlib.nn.paged_attention import paged_decode_attention

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, dim, tokens, block = 8, 32, 8, 128, 1024, 16
    per_seq = tokens // block
    keys = torch.randn(batch, kv_heads, tokens, dim, generator=gen)  # contiguous (b, H_kv, T, d)
    values = torch.randn(batch, kv_heads, tokens, dim, generator=gen)
    query = torch.randn(batch, heads, dim, generator=gen)  # (b, H, d)
    # The same tokens in a pool of blocks, each sequence's blocks scattered at random.
    order = torch.randperm(batch * per_seq, generator=gen)
    tables = order.view(batch, per_seq)  # (b, blocks per sequence)
    key_cache = torch.empty(batch * per_seq, block, kv_heads, dim)  # (N, B, H_kv, d)
    value_cache = torch.empty_like(key_cache)
    key_cache[tables] = keys.permute(0, 2, 1, 3).reshape(batch, per_seq, block, kv_heads, dim)
    value_cache[tables] = values.permute(0, 2, 1, 3).reshape(batch, per_seq, block, kv_heads, dim)
    lens = torch.full((batch,), tokens)
    paged = paged_decode_attention(query, key_cache, value_cache, tables, lens)
    dense = F.scaled_dot_product_attention(query[:, :, None], keys, values, enable_gqa=True)
    torch.testing.assert_close(paged, dense[:, :, 0], atol=1e-5, rtol=1e-5)
    env = {"torch": torch, "F": F, "paged_decode_attention": paged_decode_attention,
           "q": query, "kc": key_cache, "vc": value_cache, "tables": tables, "lens": lens,
           "k": keys, "v": values}
    paged_t = Timer("paged_decode_attention(q, kc, vc, tables, lens)", globals=env,
                    num_threads=threads).blocked_autorange(min_run_time=1.0)
    dense_stmt = "F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)"
    dense_t = Timer(dense_stmt, globals=env, num_threads=threads).blocked_autorange(
        min_run_time=1.0
    )
    print(f"paged attention on {platform.processor() or platform.machine()}, "
          f"{threads} thread(s), torch {torch.__version__}")
    print(f"  paged      {paged_t.median * 1e3:8.3f} ms (median)")
    print(f"  contiguous {dense_t.median * 1e3:8.3f} ms (median)")
    print(f"  ratio      {paged_t.median / dense_t.median:8.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    bench_simulator(args.requests)
    bench_attention(args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
