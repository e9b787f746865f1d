"""nbgrader settings: the repository root is the course root.

Assignments are written in ``solutions/`` and released, by ``make release``,
into ``exercises/``. The settings themselves (cell timeout, sandboxed kernel,
hidden tests checked outside the student's kernel, feedback without hidden
tests) live in ``kvlib.grading.autograde.configure``, shared with
``kvlib grade``.
"""

import os

from kvlib.grading.autograde import configure

c = get_config()  # noqa: F821 - provided by traitlets when it loads this file
configure(c, os.path.dirname(os.path.abspath(__file__)))
