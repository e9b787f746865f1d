"""Chapter 2: paged attention's memory, as vLLM v1 manages it.

- :mod:`kvlib.paging.block_pool`: fixed-size blocks, reference counts, the free queue;
- :mod:`kvlib.paging.table`: ``PagedKVCache``, a block table per sequence;
- :mod:`kvlib.paging.prefix`: block hashes and prefix-cache hits;
- :mod:`kvlib.paging.vllm_pool`: vLLM's page sizes, blocks in a memory budget and
  its two start-up lines;
- :mod:`kvlib.paging.step_bytes`: the bytes a decode step reads through a block table;
- :mod:`kvlib.paging.fragmentation`: reservation policies against paging, simulated.

Standard library only.
"""
