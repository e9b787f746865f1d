"""A Jupyter kernel manager that runs a student's kernel inside bubblewrap, with limits.

The sandbox is built from an empty root, not from a read-only view of the
host: only the system directories (``/usr``, ``/etc``, the ``/lib`` links),
the Python installation, the virtual environment and the ``kvlib`` and
``course`` packages (code only) are mounted, read-only. The course's data
(``solutions/``, the gradebook, other students' work), home directories,
``/run`` (database and other Unix sockets) and the host's ``/tmp`` simply do
not exist inside. Writable paths are size-limited tmpfs mounts: ``/tmp``,
``/dev/shm`` and the notebook's folder, which holds read-only views of the
assignment's own files and nothing a student submitted besides the notebook (a
submitted symbolic link could otherwise smuggle in any file the grader can
read). Nothing the kernel writes reaches the host's disk.

The network, pids, IPC and hostname are unshared, so the kernel talks to the
grader over Unix sockets (ZeroMQ ``ipc``) in a tmpfs inside the sandbox; the
grader reaches them through ``/proc/<pid>/root`` of the sandbox's init, via
a symbolic link it updates at each (re)start. The environment is cleared
(the grader's own variables may hold database passwords) and rebuilt.

Limits (:mod:`course.sandbox.limits`): rlimits set by a launcher inside the
sandbox, as an unprivileged uid of the kernel's own when the grader runs as
root (bubblewrap then keeps every capability, which would let student code
unmount the sandbox), and a watchdog thread summing the sandbox's memory.

Modes (``SandboxedKernelManager.mode``, or ``KVLIB_GRADING_SANDBOX``):
``require`` fails when bubblewrap is missing, ``auto`` falls back to an
ordinary kernel, ``off`` never sandboxes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.manager import AsyncKernelManager
from traitlets import Float, Integer, Unicode

import kvlib
from course.checks import STUDENT_ENV
from course.sandbox.limits import (
    Limits,
    Watchdog,
    kernel_argv,
    kernel_uid,
    launcher_argv,
    tasks_of,
)
from course.sandbox.mounts import Mounts, outermost, python_paths, system_argv

__all__ = ["MODE_ENV", "SandboxError", "SandboxedKernelManager", "bwrap_available"]

MODE_ENV = "KVLIB_GRADING_SANDBOX"
# The package student code imports, mounted read-only (never the folder around it).
_KVLIB = Path(kvlib.__file__).resolve().parent
# The answer checks a notebook imports (course.checks) live in the course package: it is
# code only (solutions/ and the gradebook are beside it, and stay out).
_COURSE = Path(__file__).resolve().parents[1]
_DEFAULTS = Limits()


class SandboxError(RuntimeError):
    """The sandbox is required but cannot run here, or did not start."""


@functools.cache
def bwrap_available() -> bool:
    """Whether ``bwrap`` exists and can build the sandbox this module needs, as this user."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    probe = [exe, *system_argv(), "--unshare-net", "--unshare-pid", "--size", "65536"]
    probe += ["--tmpfs", "/tmp", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _read_child_pid(fd: int) -> int:
    """The ``child-pid`` bubblewrap writes to its ``--info-fd`` (blocks until it does)."""
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
        try:
            return int(json.loads(data)["child-pid"])
        except (ValueError, KeyError):
            continue
    raise ValueError("bubblewrap exited before reporting its sandbox")


# How long a kernel's launch waits for the processes of the kernel it replaces to end.
PREVIOUS_KERNEL_WAIT_S = 10.0


async def _previous_kernel_gone(uid: int) -> None:
    """Wait until no process runs as ``uid``, at most PREVIOUS_KERNEL_WAIT_S.

    A restarted kernel has the uid of the one it replaces (one grader process, one uid).
    Killing that kernel's sandbox ends every process in it, but the kernel takes a while
    to end many (a fork bomb's 64, on a busy machine); until then RLIMIT_NPROC counts
    them against the new kernel, which dies starting its threads."""
    deadline = time.monotonic() + PREVIOUS_KERNEL_WAIT_S
    while tasks_of(uid) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


class SandboxedKernelManager(AsyncKernelManager):
    """AsyncKernelManager whose kernel runs under bubblewrap, with resource limits."""

    mode = Unicode("auto", help="require | auto | off").tag(config=True)
    course_root = Unicode(
        "", help="The course folder; the kernel sees only its assignment's own files"
    ).tag(config=True)
    source_directory = Unicode("solutions", help="Assignments' sources in the course").tag(
        config=True
    )
    memory_bytes = Integer(_DEFAULTS.memory_bytes, help="Memory of the sandbox").tag(config=True)
    max_processes = Integer(_DEFAULTS.processes, help="Processes and threads").tag(config=True)
    file_bytes = Integer(_DEFAULTS.file_bytes, help="Largest file written").tag(config=True)
    scratch_bytes = Integer(_DEFAULTS.scratch_bytes, help="Each writable tmpfs").tag(config=True)
    cpu_s = Float(_DEFAULTS.notebook_s, help="CPU seconds per kernel (a backstop)").tag(config=True)
    max_message_bytes = Integer(16 * 2**20, help="Largest message the kernel may send").tag(
        config=True
    )
    max_output_bytes = Integer(
        _DEFAULTS.output_bytes,
        help="Printed characters per cell the grader keeps (VerifiedExecute sets its own): "
        "the kernel sends one chunk of a cell's printed text past it and drops the rest",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        mode = os.environ.get(MODE_ENV, self.mode)
        if mode not in ("require", "auto", "off"):
            raise SandboxError(f"{MODE_ENV}={mode!r}: use require, auto or off")
        self.sandboxed = mode != "off" and bwrap_available()
        if mode == "require" and not self.sandboxed:
            raise SandboxError(
                "grading needs bubblewrap to keep student code away from solutions/: "
                "install it (apt-get install bubblewrap) or set "
                f"{MODE_ENV}=off on a machine where no student code runs"
            )
        self.watchdog: Watchdog | None = None
        self.context.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        if self.sandboxed:
            self.runtime_dir = tempfile.mkdtemp(prefix="kvlib-kernel-")
            weakref.finalize(self, shutil.rmtree, self.runtime_dir, True)
            self.transport = "ipc"
            self.connection_file = os.path.join(self.runtime_dir, "kernel.json")
            # The same path inside (a tmpfs) and outside (a link into the sandbox).
            self.socket_dir = os.path.join(self.runtime_dir, "sock")
            self.ip = os.path.join(self.socket_dir, "kernel")

    @property
    def limits(self) -> Limits:
        """This manager's limits (output and notebook time are the executor's)."""
        return Limits(
            memory_bytes=self.memory_bytes,
            processes=self.max_processes,
            file_bytes=self.file_bytes,
            scratch_bytes=self.scratch_bytes,
            notebook_s=self.cpu_s,
        )

    @property
    def limit_reason(self) -> str:
        """Why the watchdog stopped the current kernel ("" if it did not)."""
        return self.watchdog.reason if self.watchdog is not None else ""

    def client(self, **kwargs: Any) -> Any:
        """A client that drops any message above ``max_message_bytes`` from the kernel."""
        kc = super().client(**kwargs)
        kc.context.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        return kc

    def _assignment_files(self, cwd: Path) -> list[Path]:
        """Entries of ``cwd`` that the assignment's source folder also has (master copies)."""
        if not self.course_root:
            return []
        source = Path(self.course_root, self.source_directory, cwd.name)
        if not source.is_dir():
            return []
        names = {p.name for p in source.iterdir() if p.suffix != ".ipynb"}
        return sorted(cwd / n for n in names if (cwd / n).exists() and not (cwd / n).is_symlink())

    def _environment(self) -> dict[str, str]:
        student = os.environ.get(STUDENT_ENV, "")
        path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
        env = {
            "PATH": path,
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "IPYTHONDIR": "/tmp/.ipython",
            "MPLCONFIGDIR": "/tmp/.matplotlib",
            "MPLBACKEND": "Agg",
            "PYTHONDONTWRITEBYTECODE": "1",
            # The kvlib and course the grader runs (and mounts), whichever checkout they
            # came from.
            "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(_KVLIB.parent),
                                                         str(_COURSE.parent)])),
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            "MALLOC_ARENA_MAX": "2",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            # ipykernel exits when its parent looks like init (pid 1 in the new pid
            # namespace); bubblewrap's --die-with-parent does that job instead.
            "JPY_PARENT_PID": "1",
        }
        if student:
            env[STUDENT_ENV] = student
        return env

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = kernel_argv(super().format_kernel_cmd(extra_arguments), self.max_output_bytes)
        if not self.sandboxed:
            return cmd
        launch_cwd = (self._launch_args or {}).get("cwd")
        cwd = Path(str(launch_cwd) if launch_cwd else os.getcwd()).resolve()
        # kvlib and course alone: the checkout around them holds solutions/ and the
        # gradebook.
        readable = outermost([*python_paths(), _KVLIB, _COURSE])
        limits = self.limits
        mounts = Mounts()
        mounts.add(["--size", str(1 << 20), "--perms", "1777", "--tmpfs"], Path("/dev/shm"))
        mounts.add(
            ["--size", str(limits.scratch_bytes), "--perms", "1777", "--tmpfs"], Path("/tmp")
        )
        for path in readable:
            mounts.add(["--ro-bind", str(path)], path)
        mounts.add(["--ro-bind", self.connection_file], Path(self.connection_file))
        mounts.add(["--size", str(1 << 20), "--perms", "1777", "--tmpfs"], Path(self.socket_dir))
        mounts.add(["--size", str(limits.scratch_bytes), "--perms", "1777", "--tmpfs"], cwd)
        for entry in self._assignment_files(cwd):
            mounts.add(["--ro-bind", str(entry)], entry)
        argv = ["bwrap", *system_argv(), "--proc", "/proc", "--dev", "/dev", *mounts.argv]
        argv += ["--clearenv"]
        for key, value in sorted(self._environment().items()):
            argv += ["--setenv", key, value]
        argv += ["--chdir", str(cwd), "--"]
        return argv + launcher_argv(limits, cmd, kernel_uid())

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        if not self.sandboxed:
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        uid = kernel_uid()
        if uid is not None:  # the kernel reads its connection file as that uid
            os.chown(self.connection_file, uid, uid)
            await _previous_kernel_gone(uid)
        # bubblewrap writes {"child-pid": N}, the sandbox's init, to --info-fd.
        info_read, info_write = os.pipe()
        kernel_cmd = [kernel_cmd[0], "--info-fd", str(info_write), *kernel_cmd[1:]]
        try:
            await super()._async_launch_kernel(kernel_cmd, pass_fds=(info_write,), **kw)
        finally:
            os.close(info_write)
        try:
            init = await asyncio.wait_for(asyncio.to_thread(_read_child_pid, info_read), 20)
        except (TimeoutError, ValueError) as err:
            raise SandboxError(f"the sandbox did not start: {err or 'no reply in 20 s'}") from None
        finally:
            os.close(info_read)
        await self._attach(init)

    async def _attach(self, init: int) -> None:
        """Link the socket folder into the new sandbox and start its watchdog."""
        assert self.provisioner is not None
        process = self.provisioner.process  # type: ignore[attr-defined]
        inside = f"/proc/{init}/root{self.socket_dir}"
        for _ in range(4000):  # the socket tmpfs appears once bubblewrap has mounted it
            if os.path.isdir(inside) or process.poll() is not None:
                break
            await asyncio.sleep(0.002)
        if process.poll() is not None or not os.path.isdir(inside):
            raise SandboxError(f"the sandbox did not start (bubblewrap status {process.poll()})")
        link = self.socket_dir + ".new"
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(inside, link)
        os.replace(link, self.socket_dir)  # clients reconnect through the new link
        namespace = os.readlink(f"/proc/{init}/ns/pid")
        self.watchdog = Watchdog(process.pid, namespace, self.limits, init=init)
        self.watchdog.start()

    async def _async_wait(self, pollinterval: float = 0.1) -> None:
        """Wait for a killed kernel to go: every 10 ms, not 100 (a class has many kernels)."""
        await super()._async_wait(pollinterval=min(pollinterval, 0.01))

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        await super()._async_cleanup_resources(restart=restart)
        if self.sandboxed and not restart:
            # Now, not when the manager is collected: a grading worker killed later (a Dask
            # worker stopped by its scheduler) would leave the folder in /tmp.
            shutil.rmtree(self.runtime_dir, ignore_errors=True)

    cleanup_resources = _async_cleanup_resources

    async def _async_interrupt_kernel(self) -> None:
        """Interrupt by control message: a signal would hit bwrap, not the kernel."""
        if not self.sandboxed:
            await super()._async_interrupt_kernel()
            return
        msg = self.session.msg("interrupt_request", content={})
        self._connect_control_socket()
        self.session.send(self._control_socket, msg)

    interrupt_kernel = _async_interrupt_kernel
