"""Notebook processing: nbgrader's preprocessors and exporters, as every grading path uses them.

- :mod:`course.notebooks.intake`: the submitted notebook read, each check cell's metadata
  restored from the release;
- :mod:`course.notebooks.repair`: notebooks repaired or set aside, unsafe files refused;
- :mod:`course.notebooks.stored`: a notebook file read without its stored outputs, in one pass;
- :mod:`course.notebooks.execute`: the executing preprocessor (limits, hidden tests in this
  process);
- :mod:`course.notebooks.hidden`: hidden tests checked on plain values read out of the kernel;
- :mod:`course.notebooks.flags`: what grading repaired or stopped, in the feedback and
  ``grades.csv``.
"""
