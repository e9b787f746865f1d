"""Helpers for the book's build and the site's checks.

- :mod:`course.book.tables`: the results tables the book's pages glue (MyST Markdown);
- :mod:`course.book.gpu_runs`: the GPU check's JSON runs (``scripts/gpu_check.py``), read
  back for chapter 6's runs page;
- :mod:`course.book.kernel_keys`: encrypted kernel connections, a build without transport
  warnings;
- :mod:`course.book.kernel_server`: the pages' kernels, forked from one server that
  imported what they all import;
- :mod:`course.book.browser`: Debian's Chromium as the browser checks and benchmarks run it.
"""
