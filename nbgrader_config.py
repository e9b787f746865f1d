"""nbgrader settings: the repository root is the course root.

Assignments are written in ``solutions/`` and released, by ``make release``,
into ``exercises/``; ``make grade ASSIGNMENT=name`` grades ``submitted/``. The
settings themselves (submissions repaired as they are read, sandboxed and
resource-limited kernels, hidden tests checked outside them, flags in the
feedback and ``grades.csv``) live in ``course.apps.autograde.configure``,
shared with ``kvlib grade``. The gradebook is ``gradebook.db`` here, or the
database ``$KVLIB_GRADEBOOK_URL`` names.

To change a limit, pass it here, e.g.
``configure(c, ROOT, timeout_s=60, limits=Limits(memory_bytes=4 * 2**30))`` with
``from course.sandbox.limits import Limits``; for a JupyterHub exchange, set
``c.CourseDirectory.course_id`` and ``c.Exchange.root`` after ``configure``.
"""

import os

from course.apps.autograde import configure

ROOT = os.path.dirname(os.path.abspath(__file__))

c = get_config()  # noqa: F821 - provided by traitlets when it loads this file
configure(c, ROOT)
