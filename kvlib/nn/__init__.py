"""The torch zone: mechanisms of the course run as real tensor code.

Only modules under ``kvlib.nn`` (and ``kvlib.timing``, ``kvlib.engine.core``)
import torch; the arithmetic modules never do. Each module here states the
tensor shapes in its comments and is checked against a torch reference
(``scaled_dot_product_attention``, a decompressed computation, a float
round trip) in ``tests/``. Nothing is imported here: ``import kvlib.nn``
stays cheap until a submodule is used.
"""
