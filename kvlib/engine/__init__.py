"""Chapter 7: a small serving engine (:mod:`~kvlib.engine.core`) over a paged KV cache,
and its scheduler (:mod:`~kvlib.engine.scheduler`)."""
