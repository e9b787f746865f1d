"""Chapters 1 and 4: the weights a model reads, counted from its ``config.json``.

- :mod:`kvlib.weights.tensors`: the tensor types and the blocks every family shares;
- :mod:`kvlib.weights.families`, :mod:`kvlib.weights.families_moe`: each family's
  tensors, read off its ``modeling_*.py`` in transformers;
- :mod:`kvlib.weights.layouts`: ``weight_groups(cfg)``, the list every count reads;
- :mod:`kvlib.weights.params`: parameter counts and weight bytes at a precision;
- :mod:`kvlib.weights.quantized`: the bytes of a quantized checkpoint format.

Standard library only.
"""
