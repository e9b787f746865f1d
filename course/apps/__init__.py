"""What instructors and learners run.

- :mod:`course.apps.autograde`: ``configure(c, root)``, the nbgrader settings every path uses;
- :mod:`course.apps.batch`: ``make grade``, a class on every core;
- :mod:`course.apps.cluster`: ``make grade ... SCHEDULER=``, the kernels on a Dask cluster;
- :mod:`course.apps.runlock`: one ``make grade`` per course at a time (a file lock, and a
  PostgreSQL advisory lock for a shared gradebook);
- :mod:`course.apps.records`: grading a stopped run left half-done, found and undone;
- :mod:`course.apps.scratch`: throwaway nbgrader course folders driven through nbgrader's CLI;
- :mod:`course.apps.grade_command`: ``kvlib grade``, the same self-check on the command line;
- :mod:`course.apps.selfcheck`: ``make check`` and the notebook's "Check your work" cell.
"""
