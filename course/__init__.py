"""What runs the course, in five parts (nbgrader's own split, plus the answer checks).

- :mod:`course.checks`: the answer checks a student's notebook imports (drawn numbers,
  plausibility, the slip catalogue); standard library only, so the same code runs in
  JupyterLab, in the grader and in JupyterLite's browser kernel.
- :mod:`course.notebooks`: notebook processing, nbgrader's preprocessors and exporters
  (submissions read, repaired, executed, their hidden tests checked and flagged).
- :mod:`course.sandbox`: the bubblewrap kernel every student notebook runs in, with its
  memory, time and output limits.
- :mod:`course.apps`: what an instructor or a learner runs (``make grade`` on a pool or a
  Dask cluster, ``kvlib grade``, ``make check`` and the notebook's "Check your work").
- :mod:`course.book`: helpers the book's build uses (results tables, the GPU runs,
  kernel keys, Debian's Chromium for the browser checks).

Nothing in :mod:`kvlib` imports this package; ``kvlib grade`` is added to the command line
through the ``kvlib.commands`` entry point. This file and the ``__init__`` files of
``notebooks``, ``sandbox``, ``apps`` and ``book`` import nothing, so importing
:mod:`course.checks` loads only the standard library (JupyterLite's kernel packs them as
they are).
"""
