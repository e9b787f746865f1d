"""kvlib's exercise notebooks in the browser (JupyterLite's Pyodide kernel).

Shipped only in the site's JupyterLite build (scripts/build_lite.py), as the wheel
``kvlib_lite`` that the kernel loads at start beside kvlib:

- :mod:`kvlib_lite.startup`: run by IPython when the kernel starts (``PYTHONSTARTUP``):
  the learner's id, asked once and kept in the browser's storage, and a one-line
  notice instead of a traceback for a cell that needs numpy, matplotlib or torch;
- :mod:`kvlib_lite.check`: the "Check your work" cell without nbgrader: the saved
  notebook run cell by cell in a fresh namespace, the assignment's hidden tests run on
  the values it leaves (``course.notebooks.hidden``, as the course's grader does), the report
  printed by ``course.apps.selfcheck.format_report``.

Everything here uses the standard library and ``course.checks`` only, so the same code
runs in CPython, where the tests compare its reports with ``kvlib grade``.
"""
