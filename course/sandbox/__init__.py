"""The grading sandbox: each student kernel in bubblewrap, with limits.

- :mod:`course.sandbox.kernel`: the sandboxed kernel manager (bubblewrap, no network, the
  course read-only);
- :mod:`course.sandbox.limits`: memory, CPU time, output and wall-clock limits, and the
  watchdog that enforces them;
- :mod:`course.sandbox.mounts`: what the sandbox binds (the interpreter, the course, the
  submission).
"""
