"""course/book/kernel_server.py: the book's page kernels, forked from a preloaded server,
behave as the fresh kernels jupyter_client would start (names, modules, folder, seeds,
figures, interrupts, exit status), and a killed launcher takes its kernel with it."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager
from site_helpers import ROOT

from course.book import kernel_server

pytestmark = pytest.mark.notebooks


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running server and the environment a build gives the kernels (without the
    build's CurveZMQ keys: that patch is process-wide, and this worker goes on to start
    other kernels)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    data = kernel_server.write_kernel_spec(tmp_path_factory.mktemp("spec"))
    env["JUPYTER_PATH"] = str(data)
    with kernel_server.running_server(env) as ready:
        assert ready
        yield dict(env)


def test_the_server_preloads_what_the_pages_import() -> None:
    pages = ["```{code-cell} ipython3\nimport torch\nfrom matplotlib import pyplot\n```",
             "```{code-cell} ipython3\nimport torchvision  # not torch\n```"]
    assert kernel_server.preloads_for(pages) == (
        "ipykernel.kernelapp", "matplotlib.figure", "torch")
    assert kernel_server.preloads_for(["```{code-cell} ipython3\nprint(6 * 7)\n```"]) == (
        "ipykernel.kernelapp",)
    assert kernel_server.preloads_for(["text that says import numpy, in prose"]) == (
        "ipykernel.kernelapp",)


def test_a_server_preloading_less_gives_kernels_that_import_the_rest(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env["JUPYTER_PATH"] = str(kernel_server.write_kernel_spec(tmp_path / "spec"))
    with kernel_server.running_server(env, ("ipykernel.kernelapp",)) as ready:
        assert ready
        started = Kernel(env, tmp_path)
        try:
            assert started.value("'torch' in __import__('sys').modules") == "False"
            assert started.value("__import__('torch').tensor([2]).item() * 21") == "42"
        finally:
            started.close()


class Kernel:
    """A kernel started as nbclient starts a page's: the ``python3`` spec, a folder."""

    def __init__(self, env: dict[str, str], cwd: Path, **launch: Any) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.kernel_spec_manager.kernel_dirs = [str(Path(env["JUPYTER_PATH"]) /
                                                            "kernels")]
        self.manager.start_kernel(env=env, cwd=str(cwd), **launch)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str) -> tuple[str, list[dict[str, Any]]]:
        """The reply's status and the outputs (stream, display, result, error)."""
        outputs: list[dict[str, Any]] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] in ("stream", "display_data", "execute_result", "error"):
                outputs.append({"type": msg["msg_type"], **msg["content"]})

        reply = self.client.execute_interactive(code, timeout=60, output_hook=hook)
        return str(reply["content"]["status"]), outputs

    def value(self, expression: str) -> str:
        status, outputs = self.run(f"print(repr({expression}))")
        assert status == "ok", outputs
        return "".join(o["text"] for o in outputs if o["type"] == "stream").strip()

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture
def kernel(server_env: dict[str, str], tmp_path: Path) -> Iterator[Kernel]:
    started = Kernel(server_env, tmp_path)
    yield started
    started.close()


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_kernel_is_forked_and_starts_as_a_fresh_one(
    kernel: Kernel, server_env: dict[str, str], tmp_path: Path
) -> None:
    assert kernel.manager.kernel_spec is not None
    assert kernel.manager.kernel_spec.argv[2:4] == [
        str(Path(kernel_server.__file__).resolve()), "launch"]
    launcher = kernel.manager.provisioner.pid  # type: ignore[union-attr]
    assert int(kernel.value("__import__('os').getppid()")) != launcher  # the server's child
    assert kernel.value("__import__('os').getcwd()") == repr(str(tmp_path))
    assert kernel.value("__import__('os').environ['JUPYTER_PATH']") == repr(
        server_env["JUPYTER_PATH"])
    # Read from the kernel's environment, not the server's: jupyter_client's pid.
    assert kernel.value("__import__('ipykernel.kernelapp').kernelapp.IPKernelApp.instance()"
                        ".parent_handle") == str(os.getpid())
    # Preloaded modules are loaded, not imported into the page's names.
    status, outputs = kernel.run("np.zeros(1)")
    assert status == "error" and outputs[-1]["ename"] == "NameError"
    loaded = kernel.value("sorted(m for m in ('numpy', 'torch', 'matplotlib', "
                          "'matplotlib.pyplot', 'kvlib', 'course') if m in __import__('sys')."
                          "modules)")
    assert loaded == repr(["matplotlib", "numpy", "torch"])
    # As ipykernel_launcher leaves it, with IPython's "" before site-packages.
    assert kernel.value("__import__('sys').path.index('')") != "0"
    assert kernel.value("__import__('sys').argv[0].endswith('ipykernel_launcher.py')") == "True"


def test_a_figure_is_shown_inline(kernel: Kernel) -> None:
    status, outputs = kernel.run("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nNone")
    assert status == "ok"
    assert [o["type"] for o in outputs] == ["display_data"]
    assert "image/png" in outputs[0]["data"]


def test_kernels_draw_different_seeds(server_env: dict[str, str], tmp_path: Path) -> None:
    draws = []
    for _ in range(2):
        started = Kernel(server_env, tmp_path)
        try:
            draws.append(started.value("(__import__('random').random(), "
                                       "__import__('numpy').random.random())"))
        finally:
            started.close()
    assert draws[0] != draws[1]


def _reply_to(kernel: Kernel, sent: str, timeout_s: float) -> dict[str, Any] | None:
    """The shell reply to request ``sent`` (skipping a late kernel_info reply), or None."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            reply: dict[str, Any] = kernel.client.get_shell_msg(timeout=left)
        except queue.Empty:
            return None
        if reply["parent_header"].get("msg_id") == sent:
            return reply
    return None


def test_an_interrupt_reaches_the_kernel(kernel: Kernel) -> None:
    sent = kernel.client.execute("import time\nprint('asleep', flush=True)\ntime.sleep(120)")
    while True:  # interrupt once the sleep has begun, not before the cell runs
        msg = kernel.client.get_iopub_msg(timeout=20)
        if msg["msg_type"] == "stream" and "asleep" in msg["content"]["text"]:
            break
    kernel.manager.interrupt_kernel()
    reply = _reply_to(kernel, sent, 15)
    if reply is None:
        # Sent once more, as a reader presses Stop again: once, in development, a first
        # interrupt under load did not end the cell. A launcher that forwards no signal
        # still fails: the cell sleeps 120 s, past both waits.
        kernel.manager.interrupt_kernel()
        reply = _reply_to(kernel, sent, 30)
    assert reply is not None, "no reply to the interrupted cell"
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    # And it goes on. ipykernel aborts what arrives just after an error ("aborted"),
    # until its shell thread has passed on a message that ends the aborting.
    for _ in range(50):
        status, outputs = kernel.run("print(repr(1 + 1))")
        if status != "aborted":
            break
        time.sleep(0.1)
    assert status == "ok" and outputs[-1]["text"].strip() == "2", (status, outputs)


def test_the_launcher_exits_with_the_kernel_s_status(kernel: Kernel) -> None:
    kernel.client.execute("import os\nos._exit(7)")
    process = kernel.manager.provisioner.process  # type: ignore[union-attr]
    assert process.wait(timeout=20) == 7


def test_a_kernel_killed_by_a_signal_is_named_on_the_launcher_s_stderr(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    """jupyter_client says only that a kernel died: the launcher says how (the build's log
    keeps its stderr), and exits as a shell reports a killed process."""
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        kernel = Kernel(server_env, tmp_path, stderr=stderr)
        try:
            child = int(kernel.value("__import__('os').getpid()"))
            os.kill(child, signal.SIGSEGV)
            process = kernel.manager.provisioner.process  # type: ignore[union-attr]
            assert process.wait(timeout=20) == 128 + signal.SIGSEGV
        finally:
            kernel.close()
    said = log.read_text()
    assert f"kernel_server launch: kernel {child} was killed by SIGSEGV" in said, said


def test_a_kernel_stopped_by_a_forwarded_signal_goes_unremarked(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    """jupyter_client stops a kernel that will not shut down with SIGTERM to its launcher:
    the launcher forwards it and leaves the build's log alone."""
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        kernel = Kernel(server_env, tmp_path, stderr=stderr)
        try:
            kernel.value("1")  # started and answering
            process = kernel.manager.provisioner.process  # type: ignore[union-attr]
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 128 + signal.SIGTERM
        finally:
            kernel.close()
    assert "kernel_server launch" not in log.read_text()


def test_a_killed_launcher_takes_its_kernel(kernel: Kernel) -> None:
    child = int(kernel.value("__import__('os').getpid()"))
    kernel.manager.provisioner.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    assert _gone(child)


@pytest.mark.parametrize("server", ["none", "refusing"])
def test_without_a_server_the_launcher_becomes_a_fresh_kernel(
    server: str, server_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in server_env.items() if k != kernel_server.SERVER_ENV}
    with contextlib.ExitStack() as stack:
        if server == "refusing":  # accepts, then closes: a server whose preload failed
            path = tmp_path / "s.sock"
            listener = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            listener.bind(str(path))
            listener.listen(1)
            threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True).start()
            env[kernel_server.SERVER_ENV] = str(path)
        started = Kernel(env, tmp_path)
        try:
            launcher = started.manager.provisioner.pid  # type: ignore[union-attr]
            assert int(started.value("__import__('os').getpid()")) == launcher  # exec'd
            assert started.value("'torch' in __import__('sys').modules") == "False"
        finally:
            started.close()
