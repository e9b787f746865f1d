"""The book's page kernels, forked from one interpreter that has already imported their
common modules, instead of each started as a fresh ``python -m ipykernel_launcher``.

A build runs about eighty pages, each in its own kernel. A fresh kernel spends most of
its CPU importing what every page imports again (ipykernel and IPython, numpy,
matplotlib, torch); forked from a server that imported them once, it starts at once.

- ``serve SOCKET [MODULE ...]``: the server. It imports the modules (:data:`PRELOAD`, or
  those of it the pages import: :func:`preloads_for`) with the build's environment
  (the one every kernel gets), then waits on a Unix socket. For each launch it forks a
  child that takes the launcher's standard streams, working directory, environment and
  arguments, and runs ``ipykernel``'s ``launch_new_instance`` as ``ipykernel_launcher``
  would. It never loads kvlib, the course or pyplot: a page that forgets an import fails
  as in a fresh kernel (pyplot is the one module that must load inside the kernel, where
  matplotlib-inline hooks itself into the kernel's shell).
- ``launch -f CONNECTION_FILE``: the command of the ``python3`` kernel spec the build
  installs (:func:`write_kernel_spec`). It is what jupyter_client starts and watches as
  "the kernel process": it asks the server for a child, forwards the signals it receives
  (interrupt, terminate) to it, and exits with the child's status (a child a signal
  ended is named on its stderr, which the build's log keeps). Killed outright, it
  takes the child with it (the child watches the launcher's connection). With no server
  (``$KVLIB_KERNEL_SERVER`` unset or refused), it becomes ``python -m ipykernel_launcher``.

The launcher runs under ``python -S`` and imports only the standard library: it costs a
few milliseconds, against the second or more a fresh kernel spends on its imports.

What differs from a fresh kernel: modules in :data:`PRELOAD` (and the submodules they
load) are already in ``sys.modules``, so an ``import`` of them is free, and a submodule
they loaded is reachable as an attribute of its package; the child re-seeds ``random``
and numpy's global generator from the OS, as a fresh interpreter seeds them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import signal
import socket
import struct
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["PRELOAD", "SERVER_ENV", "preloads_for", "running_server", "write_kernel_spec"]

SERVER_ENV = "KVLIB_KERNEL_SERVER"  # the server's socket path, read by the launcher
# What every page's kernel imports (ipykernel's kernel app, which loads its kernel and
# IPython's shell) and what most pages import (numpy, matplotlib's figures without
# pyplot, which load its fonts and colours, and torch).
PRELOAD = ("ipykernel.kernelapp", "numpy", "matplotlib.figure", "torch")
_HEADER = struct.Struct("!I")
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)
_REAP_EVERY_S = 0.05


# --- the launcher: jupyter_client's kernel process ---------------------------------------


def _fresh_kernel(argv: list[str]) -> NoReturn:
    """Replace this process with the kernel jupyter_client would have started."""
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])


def _read_line(sock: socket.socket, buffer: bytearray) -> str | None:
    """The next line the server sends, or None once the connection is closed."""
    while b"\n" not in buffer:
        chunk = sock.recv(4096)
        if not chunk:
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode()


def launch(argv: list[str]) -> int:
    """Ask the server for a kernel with ``argv``; forward signals; its exit status."""
    path = os.environ.get(SERVER_ENV)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not path:
            raise OSError("no kernel server")
        sock.connect(path)
    except OSError:
        sock.close()
        _fresh_kernel(argv)
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    buffer = bytearray()
    try:
        socket.send_fds(sock, [_HEADER.pack(len(request))], [0, 1, 2])
        sock.sendall(request)
        first = _read_line(sock, buffer)
    except OSError:
        first = None
    if first is None or not first.startswith("pid "):
        sock.close()
        _fresh_kernel(argv)  # the server could not preload or fork: a plain kernel
    child = int(first.split()[1])

    forwarded: set[str] = set()

    def forward(signum: int, frame: object) -> None:
        forwarded.add(signal.Signals(signum).name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    try:
        line = _read_line(sock, buffer)  # recv resumes after a forwarded signal (PEP 475)
    except OSError:
        line = None
    # Said on stderr (the build's log) when the kernel did not simply exit and was not
    # stopped by a signal jupyter_client sent: jupyter_client only reports that it died.
    if line is None or not line.startswith("exit "):
        print(f"kernel_server launch: the server closed kernel {child}'s connection without "
              "its exit status", file=sys.stderr, flush=True)
        return 1  # the server went away: the kernel with it
    _, status, *killed_by = line.split()
    if killed_by and killed_by[0] not in forwarded:
        print(f"kernel_server launch: kernel {child} was killed by {killed_by[0]}",
              file=sys.stderr, flush=True)
    return int(status)


# --- the server ------------------------------------------------------------------------


def preloads_for(sources: Iterable[str]) -> tuple[str, ...]:
    """The modules of :data:`PRELOAD` worth importing for pages with these MyST sources:
    ipykernel's kernel app (every kernel's), and numpy, matplotlib and torch where a page
    imports them by name. A book whose pages import none of them (a test's one-page book)
    gets a server that starts in 0.2 CPU s instead of 2.6; a page that imports one only
    through another module imports it itself, as a fresh kernel would."""
    text = "\n".join(sources)

    def imported(name: str) -> bool:
        package = re.escape(name.split(".")[0])
        return re.search(rf"^\s*(?:import|from)\s+{package}\b", text, re.MULTILINE) is not None

    return (PRELOAD[0], *(name for name in PRELOAD[1:] if imported(name)))


def _preload(modules: Iterable[str]) -> None:
    """Import ``modules`` as a kernel would, with the backend ipykernel sets before any
    cell runs: matplotlib reads ``$MPLBACKEND`` once, when it is imported."""
    import importlib

    if not os.environ.get("MPLBACKEND"):
        os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    for name in modules:
        importlib.import_module(name)


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The launcher's request and its three standard streams."""
    data, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    if len(data) < _HEADER.size or len(fds) != 3:
        raise OSError("a launch request without its header or its three streams")
    (size,) = _HEADER.unpack(data)
    body = bytearray()
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise OSError("the launcher closed its request half-way")
        body += chunk
    return json.loads(body), fds


def _watch_launcher(conn: socket.socket) -> None:
    """End this kernel when its launcher is gone (killed with SIGKILL, it sends nothing)."""
    def watch() -> None:
        while conn.recv(1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="kernel-launcher-watch", daemon=True).start()


def _run_kernel(request: dict[str, Any], fds: list[int], conn: socket.socket,
                fresh_path: list[str]) -> int:
    """In the forked child: become the launcher's kernel; its exit status."""
    import importlib.util

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    launcher = importlib.util.find_spec("ipykernel_launcher")
    sys.argv = [str(launcher.origin if launcher else "ipykernel_launcher"), *request["argv"]]
    sys.path[:] = fresh_path  # as ipykernel_launcher leaves it; IPython adds "" back
    _reseed()
    _watch_launcher(conn)
    from ipykernel import kernelapp

    # Two of IPKernelApp's defaults are read from the environment when the class is
    # defined, which was in the server: give it this kernel's.
    parent_handle = int(os.environ.get("JPY_PARENT_PID") or 0)
    interrupt = int(os.environ.get("JPY_INTERRUPT_EVENT") or 0)
    try:  # as launch_new_instance()
        kernelapp.IPKernelApp.launch_instance(parent_handle=parent_handle, interrupt=interrupt)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def _reseed() -> None:
    """Fresh seeds for ``random`` and numpy's global generator, as a new interpreter has."""
    import random

    import numpy

    random.seed()
    numpy.random.seed()


def _fork_kernel(conn: socket.socket, listener: socket.socket, fresh_path: list[str],
                 children: dict[int, socket.socket]) -> None:
    """Fork a kernel for the launcher on ``conn``; the child never returns."""
    request, fds = _receive(conn)
    if threading.active_count() != 1:
        raise RuntimeError("the kernel server must not fork with threads running")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            listener.close()
            for other in children.values():
                other.close()
            status = _run_kernel(request, fds, conn, fresh_path)
        finally:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    conn.sendall(f"pid {pid}\n".encode())


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each ended kernel's launcher how it ended, as a shell reports it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        # "exit STATUS", and the signal's name after it when a signal ended the kernel.
        line = f"exit {code}" if code >= 0 else f"exit {128 - code} {signal.Signals(-code).name}"
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(f"{line}\n".encode())
            conn.close()


def serve(path: str, modules: Iterable[str] = PRELOAD) -> int:
    """Listen on ``path`` and say so, preload ``modules``, then fork a kernel per launch
    (launches that came during the preload wait in the backlog); end with the process that
    started the server."""
    fresh_path = sys.path[1:]  # without this file's folder, as ipykernel_launcher starts
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    print("listening", flush=True)
    try:
        _preload(modules)
    except Exception as exc:  # the launchers waiting then start fresh kernels
        print(f"kernel server: cannot preload: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        for _ in selector.select(timeout=_REAP_EVERY_S):
            conn, _ = listener.accept()
            try:
                _fork_kernel(conn, listener, fresh_path, children)
            except (OSError, ValueError, RuntimeError) as exc:
                print(f"kernel server: a launch failed: {exc}", file=sys.stderr, flush=True)
                conn.close()
        _reap(children)
    return 0


# --- the build's side ------------------------------------------------------------------


def write_kernel_spec(data_dir: Path) -> Path:
    """``data_dir/kernels/python3/kernel.json``, launching through the server; put
    ``data_dir`` first on ``$JUPYTER_PATH`` for kernels to find it before ipykernel's."""
    spec = data_dir / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-S", str(Path(__file__).resolve()), "launch", "-f",
                 "{connection_file}"],
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "metadata": {"debugger": True},
    }, indent=1))
    return data_dir


@contextmanager
def running_server(env: dict[str, str],
                   preload: Iterable[str] = PRELOAD) -> Iterator[bool]:
    """The server, preloading ``preload``, started with the kernels' environment ``env``
    for the block's length; sets :data:`SERVER_ENV` in ``env``. Yields False (kernels
    then start fresh, the reason printed) when it does not start."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvlib-kernels-") as folder:
        path = Path(folder) / "server.sock"  # short: a socket path has 107 bytes at most
        process = subprocess.Popen(
            # Run as a file, so that no `course` module is loaded in the kernels.
            [sys.executable, str(Path(__file__).resolve()), "serve", str(path), *preload],
            env=env, stdout=subprocess.PIPE, text=True,
        )
        assert process.stdout is not None
        try:
            ready = process.stdout.readline().strip() == "listening"  # then it preloads
            if ready:
                env[SERVER_ENV] = str(path)
            else:
                print("build_book: the kernel server did not start; pages run in fresh "
                      "kernels", file=sys.stderr)
            yield ready
        finally:
            env.pop(SERVER_ENV, None)
            process.terminate()
            process.wait()


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) >= 2:
        return serve(argv[1], argv[2:] or PRELOAD)
    if argv[:1] == ["launch"]:
        return launch(argv[1:])
    print("usage: kernel_server.py serve SOCKET [MODULE ...] | launch -f CONNECTION_FILE",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
