"""Chapter 8: the tiers a KV cache lives in beyond one GPU's memory, the links between
them, reload against recompute, and the hand-off of a request's cache from a prefill GPU
to a decode GPU. Standard library only; every time comes from :mod:`kvlib.step` and every
byte count from :mod:`kvlib.bounds` and :mod:`kvlib.sizing`.

- :mod:`kvlib.tiers.links`: the links, their datasheet and measured rates, bits to bytes;
- :mod:`kvlib.tiers.nodes`: what each tier of a named node holds, in tokens of a model;
- :mod:`kvlib.tiers.reload`: reload or recompute a cached prefix, the break-even;
- :mod:`kvlib.tiers.handoff`: prefill-to-decode transfer, and DistServe's instance ratio;
- :mod:`kvlib.tiers.split`: layer-by-layer overlap of the hand-off, goodput at TTFT and TPOT
  targets with prefill and decode together or apart.
"""

from __future__ import annotations

__all__: list[str] = []
