"""One module per graded assignment: the mistakes its hidden tests must name.

Each module defines ``ASSIGNMENT`` (the folder in ``solutions/``), ``NOTEBOOK``
(the notebook's name without ``.ipynb``) and ``WRONG``: for the grade id of
each hidden test, the source of an answer cell that makes the classic mistake
and a phrase the hint for it must contain. ``tests/assignments/test_assignments.py``
grades the solution, a blank release and every wrong answer of every module
here with nbgrader.
"""
