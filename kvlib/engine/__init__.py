"""Chapter 7: a small serving engine over a paged KV cache.

- :mod:`kvlib.engine.scheduler`: which sequences run in the next forward pass and how
  many of their tokens (static or continuous batching, a per-step token budget with
  chunked prefill, ``max_num_seqs``, prefix-cache hits, admission by free blocks,
  preemption, no admission in a step that preempted);
- :mod:`kvlib.engine.core`: the engine that runs the scheduler's decisions on
  :class:`kvlib.nn.decoder.TinyDecoder` (torch, CPU): stop tokens, ``max_model_len``,
  per-token times for TTFT and inter-token latency.
"""
