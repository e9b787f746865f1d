"""A Jupyter kernel manager that runs a student's kernel inside bubblewrap.

Student code runs with the whole file system read-only and the course
directory (``solutions/``, the gradebook, other students' work) replaced by an
empty tmpfs; only the notebook's own directory is writable. The network is
unshared, so the kernel talks to nbgrader over Unix sockets (ZeroMQ ``ipc``
transport) in a private runtime directory instead of TCP ports.

Modes (``SandboxedKernelManager.mode``, or ``KVLIB_GRADING_SANDBOX``):
``require`` fails when bubblewrap is missing, ``auto`` falls back to an
ordinary kernel, ``off`` never sandboxes.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager
from traitlets import List, Unicode

__all__ = ["SandboxError", "SandboxedKernelManager", "bwrap_available", "sandbox_argv"]

MODE_ENV = "KVLIB_GRADING_SANDBOX"


class SandboxError(RuntimeError):
    """The sandbox is required but cannot run here."""


@functools.cache
def bwrap_available() -> bool:
    """Whether ``bwrap`` exists and can create the namespaces the sandbox needs."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    probe = [exe, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _outermost(paths: list[Path]) -> list[Path]:
    """Drop paths that lie inside another listed path; sort by depth for mounting."""
    unique = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def sandbox_argv(
    hidden: list[Path],
    readable: list[Path],
    writable: list[Path],
    env: dict[str, str],
    cwd: Path,
) -> list[str]:
    """The ``bwrap`` prefix: ``/`` read-only, ``hidden`` emptied, then paths re-exposed.

    bubblewrap applies mounts in order, so each tmpfs comes before the paths
    re-exposed inside it.
    """
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in _outermost([p for p in hidden if len(p.parts) > 1]):  # never "/" itself
        argv += ["--tmpfs", str(path)]
    for path in sorted(set(readable), key=lambda p: len(p.parts)):
        if path.exists():
            argv += ["--ro-bind", str(path), str(path)]
    for path in sorted(set(writable), key=lambda p: len(p.parts)):
        argv += ["--bind", str(path), str(path)]
    for key, value in sorted(env.items()):
        argv += ["--setenv", key, value]
    argv += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent"]
    return argv + ["--chdir", str(cwd), "--"]


def _kvlib_paths() -> tuple[Path, Path]:
    """The installed kvlib package and the checkout holding it (hidden: it has solutions/)."""
    package = Path(__file__).resolve().parents[1]  # kvlib/, this file is kvlib/grading/
    return package, package.parent


class SandboxedKernelManager(AsyncKernelManager):
    """AsyncKernelManager whose kernel process runs under bubblewrap."""

    mode = Unicode("auto", help="require | auto | off").tag(config=True)
    hidden_paths = List(Unicode(), help="Directories replaced by an empty tmpfs").tag(config=True)

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
        if self.sandboxed:
            self.runtime_dir = tempfile.mkdtemp(prefix="kvlib-kernel-")
            weakref.finalize(self, shutil.rmtree, self.runtime_dir, True)
            self.transport = "ipc"
            self.connection_file = os.path.join(self.runtime_dir, "kernel.json")
            self.ip = os.path.join(self.runtime_dir, "kernel")

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd: list[str] = super().format_kernel_cmd(extra_arguments)
        if not self.sandboxed:
            return cmd
        package, checkout = _kvlib_paths()
        launch_cwd = (self._launch_args or {}).get("cwd")
        cwd = Path(str(launch_cwd) if launch_cwd else os.getcwd()).resolve()
        hidden = [Path(p).resolve() for p in self.hidden_paths]
        # Also hidden: temporary files and the grader's home (keys, tokens, other courses).
        hidden += [Path(tempfile.gettempdir()).resolve(), Path("/tmp"), Path.home().resolve()]
        if (checkout / "solutions").exists():
            hidden.append(checkout)
        # Re-exposed read-only: the interpreter (a venv and the Python it points to) and kvlib.
        readable = [Path(sys.prefix), Path(sys.base_prefix), package]
        readable = [p.resolve() for p in readable] + readable
        env = {
            # ipykernel exits when its parent looks like init (pid 1 in the new
            # pid namespace); bwrap --die-with-parent does that job instead.
            "JPY_PARENT_PID": "1",
            "IPYTHONDIR": os.path.join(self.runtime_dir, "ipython"),
            "MPLCONFIGDIR": os.path.join(self.runtime_dir, "matplotlib"),
            "HOME": self.runtime_dir,
        }
        writable = [cwd, Path(self.runtime_dir)]
        return sandbox_argv(hidden, readable, writable, env, cwd) + cmd

    async def interrupt_kernel(self) -> None:  # type: ignore[override]
        """Interrupt by control message: a signal would hit bwrap, not the kernel."""
        if not self.sandboxed:
            await super().interrupt_kernel()
            return
        msg = self.session.msg("interrupt_request", content={})
        self._connect_control_socket()
        self.session.send(self._control_socket, msg)
