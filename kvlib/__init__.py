"""kvlib: KV cache and LLM serving memory arithmetic.

Import what you need from the submodules (``kvlib.sizing``, ``kvlib.config``,
...). Nothing here imports torch: modules that need it import it inside the
functions that use it.
"""

__version__ = "0.1.0"
