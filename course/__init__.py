"""What runs the course: nbgrader wiring, the grading sandbox, batch grading, the self-check.

Students never import this package's grading machinery into their reasoning; a
notebook's last cell calls :func:`course.selfcheck.check_notebook`, which grades
the saved notebook the way the instructor's batch does.

- :mod:`course.autograde`: ``configure(c, root)``, the nbgrader settings every path uses;
- :mod:`course.intake`, :mod:`course.repair`: submissions read, repaired or set aside;
- :mod:`course.stored`: a notebook file read without its stored outputs, in one pass;
- :mod:`course.execute`: the executing preprocessor (limits, hidden tests in this process);
- :mod:`course.hidden`: hidden tests checked on plain values read out of the kernel;
- :mod:`course.sandbox`, :mod:`course.limits`, :mod:`course.mounts`: bubblewrap kernels
  with memory, time and output limits;
- :mod:`course.flags`: what grading repaired or stopped, in the feedback and ``grades.csv``;
- :mod:`course.scratch`: throwaway nbgrader course folders driven through nbgrader's CLI;
- :mod:`course.batch`: ``make grade``, a class on every core;
- :mod:`course.runlock`: one ``make grade`` per course at a time (a file lock, and a
  PostgreSQL advisory lock for a shared gradebook);
- :mod:`course.records`: grading a stopped run left half-done, found and undone;
- :mod:`course.cluster`: ``make grade ... SCHEDULER=``, the kernels on a Dask cluster;
- :mod:`course.selfcheck`: ``make check`` and the notebook's "Check your work" cell;
- :mod:`course.tables`: the results tables the book's pages glue (MyST Markdown);
- :mod:`course.gpu_runs`: the GPU check's JSON runs (``scripts/gpu_check.py``), read back
  for chapter 6's runs page;
- :mod:`course.kernel_keys`: encrypted kernel connections, a build without transport warnings;
- :mod:`course.browser`: Debian's Chromium as the browser checks and benchmarks run it.
"""
