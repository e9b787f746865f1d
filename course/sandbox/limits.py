"""Resource limits for one student's kernel, enforced without cgroups.

Three mechanisms, each covering what the others cannot:

- ``setrlimit`` in the sandbox, set by a tiny launcher just before it execs the
  kernel (:func:`launcher_argv`): address space per process (the memory
  limit), tasks (``RLIMIT_NPROC``, processes and threads), the largest file,
  open files, CPU seconds, no core dumps. ``RLIMIT_NPROC`` is ignored for
  uid 0, so when the grader runs as root the launcher also switches to an
  unprivileged uid of the kernel's own (:func:`kernel_uid`); run unprivileged,
  the user namespace bubblewrap creates counts the sandbox's tasks apart from
  the user's other processes (Linux 5.14 and later).
- A :class:`Watchdog` thread in the grader that sums the proportional set size
  (PSS) and the tasks of every process in the sandbox's pid namespace a few
  times a second, and kills the sandbox when the sum passes the memory limit
  or the task limit: per-process limits alone would let a kernel fork its way
  to ``processes x memory``.
- Size-limited tmpfs mounts for every writable path (``Limits.scratch_bytes``,
  applied in :mod:`course.sandbox.kernel`): tmpfs pages are not counted in any
  process's memory, so they must be capped where they are mounted.

Output per cell and the whole notebook's wall time are limited on the
grader's side, where the output arrives (:mod:`course.notebooks.execute`): output past
the cap is dropped with a note, and the cell runs on. The kernel runs from
:func:`kernel_boot` (:func:`kernel_argv`), so that a long print arrives as
many small messages, never one above the largest message the grader accepts,
and printed text the grader would drop is dropped in the kernel as it is
printed, before it fills the kernel's memory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
from dataclasses import dataclass

from kvlib.units import GiB, MiB

__all__ = [
    "CELL_TIMEOUT_S",
    "LAUNCHER",
    "STREAM_CHUNK_CHARS",
    "Limits",
    "Usage",
    "Watchdog",
    "kernel_argv",
    "kernel_boot",
    "kernel_uid",
    "launcher_argv",
    "sandbox_usage",
    "tasks_of",
]

# Seconds one cell may run (nbgrader's own per-cell timeout, Execute.timeout).
CELL_TIMEOUT_S = 30

# uids handed to kernels when the grader runs as root: far above any real account
# (Debian allocates from 1000; systemd's dynamic users stop at 65519), and one per
# grading process, so two kernels never share a task count.
_UID_BASE = 3_000_000_000


@dataclass(frozen=True)
class Limits:
    """What one student's kernel may use. Every field is a hard ceiling."""

    memory_bytes: int = 2 * GiB  # address space per process, and PSS of the whole sandbox
    processes: int = 64  # tasks (processes + threads) in the sandbox
    output_bytes: int = 1 * MiB  # output of one cell kept; the rest is dropped, with a note
    notebook_s: float = 300.0  # wall time for the whole notebook
    file_bytes: int = 64 * MiB  # largest file the kernel may write
    scratch_bytes: int = 64 * MiB  # each writable tmpfs (the notebook's folder, /tmp)
    open_files: int = 1024

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "processes", "output_bytes", "file_bytes", "scratch_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive int, got {value!r}")
        if not (isinstance(self.notebook_s, int | float) and self.notebook_s > 0):
            raise ValueError(f"Limits.notebook_s must be positive, got {self.notebook_s!r}")
        if self.processes < 16:
            raise ValueError("Limits.processes below 16 leaves no room for the kernel's threads")

    def rlimits(self) -> dict[str, int]:
        """``resource`` limit names and values the launcher sets (soft = hard)."""
        return {
            "RLIMIT_AS": self.memory_bytes,
            "RLIMIT_NPROC": self.processes,
            "RLIMIT_FSIZE": self.file_bytes,
            "RLIMIT_NOFILE": self.open_files,
            "RLIMIT_CORE": 0,
            # A backstop only: the grader stops the notebook at notebook_s of wall time.
            "RLIMIT_CPU": math.ceil(self.notebook_s) + 30,
        }


# Runs inside the sandbox with ``python -I -S``: limits, then (as root) an unprivileged
# uid with no supplementary groups, stdio to /dev/null, then exec the kernel.
LAUNCHER = """\
import json, os, resource, sys
spec = json.loads(sys.argv[1])
for name, value in spec["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.execv(spec["argv"][0], spec["argv"])
"""


# Characters of printed text per stream message. ipykernel sends whatever a cell printed
# between two flushes (every 0.2 s) as one message: one print of 20 MB is one 20 MB
# message, which the grader refuses whole (course.sandbox.kernel's max_message_bytes).
STREAM_CHUNK_CHARS = 64 * 1024

# ipykernel_launcher's own steps (cwd off sys.path while ipykernel loads), with stdout and
# stderr sent in pieces of at most STREAM_CHUNK_CHARS characters, and a cell's printed text
# kept in the kernel's memory only until it is sent, and only as much as the grader keeps:
# - IPython 9 copies everything a cell prints into its history (InteractiveShell._tee);
#   a print loop fills the sandbox's memory with it in seconds, so the copy is turned off;
# - ipykernel buffers printed text until its IO thread sends it, and a print loop outruns
#   that thread (most of all on a busy machine): each stream's text in one cell past the
#   grader's cap plus one chunk (kernel_boot's cell_chars) is dropped where it is printed.
# - no debugger: ipykernel imports debugpy and pydevd at start only to offer one, a quarter
#   of a fresh kernel's CPU time (0.29 to 0.22 s measured); nothing attaches a debugger to
#   a grading kernel, and with debugpy unimportable ipykernel starts without it.
_KERNEL_BOOT = """\
import contextlib, sys
if sys.path and sys.path[0] == "":
    del sys.path[0]
sys.modules["debugpy"] = None
from IPython.core.interactiveshell import InteractiveShell
from ipykernel import iostream, kernelapp
if hasattr(InteractiveShell, "_tee"):
    InteractiveShell._tee = lambda self, channel: contextlib.nullcontext()
class ChunkedOutStream(iostream.OutStream):
    _cell, _cell_chars = None, 0
    def write(self, string):
        cell = self.parent_header.get("msg_id")
        if cell != self._cell:
            self._cell, self._cell_chars = cell, 0
        room = {cell_chars} - self._cell_chars
        self._cell_chars += len(string)
        if room < len(string):
            if room > 0:
                super().write(string[:room])
            return len(string)
        return super().write(string)
    def _flush_buffers(self):
        for parent, data in super()._flush_buffers():
            for start in range(0, len(data), {chunk_chars}):
                yield parent, data[start:start + {chunk_chars}]
iostream.ChunkedOutStream = ChunkedOutStream
kernelapp.launch_new_instance(
    argv=sys.argv[1:] + ["--IPKernelApp.outstream_class=ipykernel.iostream.ChunkedOutStream"]
)
"""


def kernel_boot(output_bytes: int) -> str:
    """The kernel's start-up code (:data:`_KERNEL_BOOT`) for a grader that keeps
    ``output_bytes`` characters of a cell's output: each stream sends one chunk more, so
    that the grader sees that the cell printed more than it keeps."""
    cell_chars = output_bytes + STREAM_CHUNK_CHARS
    return _KERNEL_BOOT.format(cell_chars=cell_chars, chunk_chars=STREAM_CHUNK_CHARS)


def kernel_argv(kernel_cmd: list[str], output_bytes: int) -> list[str]:
    """``python -m ipykernel_launcher ARGS`` as ``python -c BOOT ARGS``, ``BOOT`` being
    :func:`kernel_boot` (``output_bytes``); any other kernel command unchanged."""
    if kernel_cmd[1:3] == ["-m", "ipykernel_launcher"]:
        return [kernel_cmd[0], "-c", kernel_boot(output_bytes), *kernel_cmd[3:]]
    return kernel_cmd


def kernel_uid() -> int | None:
    """The uid kernels of this process run as: its own when unprivileged, else a fresh one.

    A process grades one notebook at a time, so its pid names its kernel's uid.
    """
    if os.geteuid() != 0:
        return None
    return _UID_BASE + os.getpid()


def tasks_of(uid: int) -> int:
    """Processes whose real uid is ``uid``: what RLIMIT_NPROC counts against a new one."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        # OSError: a process that ended while it was read.
        with contextlib.suppress(OSError), open(f"/proc/{entry.name}/status") as status:
            for line in status:
                if line.startswith("Uid:"):
                    count += int(line.split()[1]) == uid
                    break
    return count


def launcher_argv(limits: Limits, kernel_cmd: list[str], uid: int | None) -> list[str]:
    """``kernel_cmd`` prefixed by the launcher that applies ``limits`` (and ``uid``)."""
    spec = {"rlimits": limits.rlimits(), "uid": uid, "argv": kernel_cmd}
    return [kernel_cmd[0], "-I", "-S", "-c", LAUNCHER, json.dumps(spec)]


@dataclass(frozen=True)
class Usage:
    """Memory (PSS, bytes) and tasks of the processes in one sandbox."""

    memory_bytes: int
    tasks: int


def _pss_bytes(pid: str) -> int:
    """Proportional set size: pages shared by forked children are counted once in the sum."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    with open(f"/proc/{pid}/statm", "rb") as f:  # kernels without smaps_rollup: RSS
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _threads(pid: str) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Threads:"):
                return int(line.split()[1])
    return 1


def sandbox_usage(pid_namespace: str, init: int | None = None) -> Usage:
    """Sum over the processes whose pid namespace is ``pid_namespace`` (a ``ns/pid`` link).

    With ``init``, the namespace's init (pid 1 inside), they are found by walking down from
    it (:func:`descendants`), reading the sandbox's own entries of /proc only: a watchdog
    reads them ten times a second, and a grading machine runs one sandbox per core beside
    thousands of other processes. Without it, or where /proc lists no children, every
    process's namespace is read.
    """
    pids = descendants(init, pid_namespace) if init is not None else None
    if pids is None:
        pids = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    memory = tasks = 0
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != pid_namespace:
                continue
            memory += _pss_bytes(pid)
            tasks += _threads(pid)
        except (OSError, ValueError, IndexError):  # exited meanwhile, or not ours to read
            continue
    return Usage(memory, tasks)


def descendants(init: int, pid_namespace: str) -> list[str] | None:
    """``init`` and every process below it, as /proc names; [] once ``init`` is no longer
    the init of ``pid_namespace`` (it ended: its pid may be another process's now); None
    where the kernel keeps no ``/proc/PID/task/TID/children`` (CONFIG_PROC_CHILDREN).

    Every process of a pid namespace descends from the namespace's init, which adopts the
    namespace's orphans, so the walk misses none that lived through it.
    """
    try:
        if os.readlink(f"/proc/{init}/ns/pid") != pid_namespace:
            return []
        if not os.path.exists(f"/proc/{init}/task/{init}/children"):
            return None
    except OSError:
        return []
    found, todo = [], [str(init)]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    todo.extend(child.decode() for child in f.read().split())
        except OSError:  # ended meanwhile: its children are the init's now, seen next time
            continue
    return found


class Watchdog(threading.Thread):
    """Kill a sandbox (SIGKILL to its bubblewrap process) once it passes ``limits``.

    ``bwrap_pid`` is the grader's own child, so its pid cannot be reused before
    the grader reaps it; bubblewrap's ``--die-with-parent`` then takes the whole
    pid namespace (``pid_namespace``, the ``ns/pid`` link of the sandbox's init)
    down. ``init``, the namespace's init, lets it read only the sandbox's processes
    (:func:`sandbox_usage`). ``reason`` says which limit was hit, for the student's feedback.
    """

    def __init__(
        self,
        bwrap_pid: int,
        pid_namespace: str,
        limits: Limits,
        interval_s: float = 0.1,
        init: int | None = None,
    ) -> None:
        super().__init__(name=f"kvlib-watchdog-{bwrap_pid}", daemon=True)
        self.bwrap_pid = bwrap_pid
        self.pid_namespace = pid_namespace
        self.init = init
        self.limits = limits
        self.interval_s = interval_s
        self.reason = ""
        self.peak = Usage(0, 0)
        self._stop_event = threading.Event()

    def stop(self) -> None:
        """Stop watching (the kernel was shut down by the grader)."""
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            usage = sandbox_usage(self.pid_namespace, self.init)
            self.peak = Usage(
                max(self.peak.memory_bytes, usage.memory_bytes), max(self.peak.tasks, usage.tasks)
            )
            if usage.memory_bytes > self.limits.memory_bytes:
                self.reason = f"used more than {_gib(self.limits.memory_bytes)} of memory"
            elif usage.tasks >= self.limits.processes:
                self.reason = f"ran {self.limits.processes} or more processes and threads at once"
            if self.reason:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.bwrap_pid, signal.SIGKILL)
                return


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GiB:g} GiB" if n_bytes >= GiB else f"{n_bytes / MiB:g} MiB"
