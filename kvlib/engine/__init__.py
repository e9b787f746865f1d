"""Chapter 7: a small serving engine over a paged KV cache.

- :mod:`kvlib.engine.scheduler`: which sequences run in the next forward pass
  (static or continuous batching, admission by free blocks, preemption);
- :mod:`kvlib.engine.core`: the engine that runs the scheduler's decisions on
  :class:`kvlib.nn.decoder.TinyDecoder` (torch, CPU).
"""
