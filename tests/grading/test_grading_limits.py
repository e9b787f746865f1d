"""course.sandbox.limits: rlimits in the sandbox, and a watchdog for what rlimits cannot see."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from course.notebooks.execute import apply_carriage_returns
from course.sandbox.kernel import SandboxedKernelManager
from course.sandbox.limits import (
    LAUNCHER,
    STREAM_CHUNK_CHARS,
    Limits,
    descendants,
    kernel_argv,
    launcher_argv,
    sandbox_usage,
)
from course.sandbox.mounts import system_argv

MiB = 2**20


class TestLimits:
    def test_defaults(self) -> None:
        limits = Limits()
        assert limits.memory_bytes == 2 * 1024**3 and limits.processes == 64
        assert limits.rlimits()["RLIMIT_CORE"] == 0

    @pytest.mark.parametrize(
        "field", ["memory_bytes", "processes", "output_bytes", "file_bytes", "scratch_bytes"]
    )
    @pytest.mark.parametrize("value", [0, -1, 1.5, True])
    def test_bad_values_name_the_field(self, field: str, value: object) -> None:
        with pytest.raises(ValueError, match=field):
            Limits(**{field: value})  # type: ignore[arg-type]

    def test_too_few_processes_for_a_kernel(self) -> None:
        with pytest.raises(ValueError, match="processes"):
            Limits(processes=4)

    def test_launcher_applies_limits_then_runs_the_command(self) -> None:
        """The launcher alone (no sandbox): limits set, stdout to /dev/null, command run."""
        probe = (
            "import resource as r, sys; open(sys.argv[1], 'w').write(str("
            "[r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_NOFILE)[0]]))"
        )
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp, "out")
            argv = launcher_argv(Limits(memory_bytes=512 * MiB), [sys.executable, "-c", probe,
                                                                  str(out)], None)
            result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            assert result.returncode == 0 and result.stdout == ""
            assert json.loads(out.read_text()) == [512 * MiB, 1024]


def test_kernel_argv_swaps_only_ipykernel_launcher() -> None:
    argv = kernel_argv(["python", "-m", "ipykernel_launcher", "-f", "k.json"], MiB)
    assert argv[:2] == ["python", "-c"] and argv[3:] == ["-f", "k.json"]
    compile(argv[2], "<kernel boot>", "exec")  # the boot code parses
    assert f"{MiB + STREAM_CHUNK_CHARS}" in argv[2]
    assert kernel_argv(["julia", "kernel.jl", "k.json"], MiB) == ["julia", "kernel.jl", "k.json"]


def _printed(cells: list[str], **manager: Any) -> tuple[list[list[str]], list[str]]:
    """Run ``cells`` in one kernel: the texts of each cell's stream messages, and each
    cell's reply status (or error name)."""

    async def main() -> tuple[list[list[str]], list[str]]:
        km = SandboxedKernelManager(kernel_name="python3", **manager)
        await km.start_kernel(cwd=tempfile.mkdtemp())
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            texts: list[list[str]] = []
            statuses: list[str] = []
            for code in cells:
                texts.append([])
                reply = await kc.execute_interactive(
                    code, timeout=60,
                    output_hook=lambda msg: texts[-1].append(msg["content"].get("text", ""))
                    if msg["msg_type"] == "stream" else None,
                )
                statuses.append(reply["content"].get("ename") or reply["content"]["status"])
            return texts, statuses
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    return asyncio.run(main())


def test_the_kernel_drops_output_past_the_executors_own_cap() -> None:
    """One setting: the cap an instructor gives the executor is the one its kernel applies."""
    import nbformat

    from course.notebooks.execute import VerifiedExecute

    executor = VerifiedExecute(max_output_bytes=3 * MiB, kernel_name="python3")
    executor.nb = nbformat.v4.new_notebook()
    km = executor.create_kernel_manager()
    assert isinstance(km, SandboxedKernelManager) and km.max_output_bytes == 3 * MiB


def test_a_long_print_reaches_the_grader_in_pieces() -> None:
    """One print of 3 MB: stream messages of at most STREAM_CHUNK_CHARS, all of it there."""
    (texts,), statuses = _printed(["print('x' * 3_000_000, end='')"], mode="off",
                                  max_output_bytes=4 * MiB)
    assert statuses == ["ok"]
    assert "".join(texts) == "x" * 3_000_000
    assert max(map(len, texts)) <= STREAM_CHUNK_CHARS


def test_a_print_loop_stays_within_the_kernels_memory() -> None:
    """3 GB printed in a 512 MiB sandbox: the kernel keeps none of it past what the grader
    keeps (IPython's history copy and ipykernel's send buffer would fill the limit and kill
    the kernel), sends one chunk more than the grader keeps, and counts each cell apart."""
    flood = "for _ in range(300_000):\n    print('x' * 10_000)"
    peak = "int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0]) * 1024"
    (flooded, peak_text, after), statuses = _printed(
        [flood, f"print({peak}, end='')", "print('y' * 1000, end='')"],
        mode="require", memory_bytes=512 * MiB, max_output_bytes=256 * 1024,
    )
    assert statuses == ["ok", "ok", "ok"]
    assert sum(map(len, flooded)) == 256 * 1024 + STREAM_CHUNK_CHARS
    assert after == ["y" * 1000]  # the next cell prints again
    kernel_peak_bytes = int("".join(peak_text))
    assert kernel_peak_bytes < 200 * MiB, f"the kernel's resident peak: {kernel_peak_bytes:,} B"


@pytest.mark.parametrize(
    "text", ["a\rb\n", "abc\r\n", "x\ry\rz", "12\r34\n56\r\n", "a\r\rb", "x\r\r\n", "plain"]
)
def test_carriage_returns_as_nbclient_applies_them(text: str) -> None:
    """The same rule as nbclient's regex, without its quadratic time on one long line."""
    assert apply_carriage_returns(text) == re.sub(r".*\r(?=[^\n])", "", text)


def _run_kernel(code: str, limits: dict[str, int], wait_s: float = 20) -> tuple[str, bool]:
    """Run ``code`` in a sandboxed kernel; (the watchdog's reason, whether the kernel died)."""

    async def main() -> tuple[str, bool]:
        km = SandboxedKernelManager(kernel_name="python3", mode="require", **limits)
        await km.start_kernel(cwd=tempfile.mkdtemp())
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            kc.execute(code)
            for _ in range(int(wait_s * 10)):
                if not await km.is_alive():
                    break
                await asyncio.sleep(0.1)
            return km.limit_reason, not await km.is_alive()
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    return asyncio.run(main())


def test_a_shut_down_kernel_leaves_no_runtime_folder() -> None:
    async def main() -> tuple[SandboxedKernelManager, str]:
        km = SandboxedKernelManager(kernel_name="python3", mode="require")
        await km.start_kernel(cwd=tempfile.mkdtemp())
        assert os.path.isdir(km.runtime_dir)
        await km.shutdown_kernel(now=True)
        return km, km.runtime_dir

    km, folder = asyncio.run(main())  # km is still alive: its finalizer has not run
    assert km.runtime_dir == folder and not os.path.exists(folder)


def test_watchdog_stops_memory_spread_over_processes() -> None:
    """Each child stays under the per-process limit; together they pass the sandbox's."""
    code = (
        "import os, time\nfor i in range(6):\n    if os.fork() == 0:\n"
        "        b = b'x' * (120 * 2**20)\n        time.sleep(60)\n        os._exit(0)\n"
        "time.sleep(60)"
    )
    reason, died = _run_kernel(code, {"memory_bytes": 400 * MiB})
    assert died and reason == "used more than 400 MiB of memory"


def test_watchdog_stops_a_fork_bomb() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    reason, died = _run_kernel(code, {"max_processes": 32})
    assert died and reason == "ran 32 or more processes and threads at once"


def test_quiet_kernel_is_left_alone() -> None:
    reason, died = _run_kernel("x = [0] * 10**6", {"memory_bytes": 400 * MiB}, wait_s=1.5)
    assert (reason, died) == ("", False)


def test_usage_of_an_empty_namespace_is_zero() -> None:
    assert sandbox_usage("pid:[0]").tasks == 0


# In a pid namespace: two children, a grandchild, and an orphan (its parent exits and the
# namespace's init adopts it); then every process sleeps.
_TREE = """\
import os, time
def sleeper(then=None):
    if os.fork() == 0:
        if then:
            then()
        time.sleep(60)
        os._exit(0)
sleeper(lambda: sleeper())
if os.fork() == 0:
    sleeper()
    os._exit(0)
os.wait()
time.sleep(60)
"""


@pytest.fixture
def process_tree() -> Any:
    """``(init, namespace)`` of a bubblewrap sandbox running :data:`_TREE`, once its five
    processes (the init, the script, two children, a grandchild, the orphan) all run."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    read, write = os.pipe()
    argv = ["bwrap", *system_argv(), "--proc", "/proc", "--dev", "/dev",
            "--info-fd", str(write), "--", "/usr/bin/python3", "-I", "-S", "-c", _TREE]
    sandbox = subprocess.Popen(argv, pass_fds=(write,))
    os.close(write)
    try:
        info = b""
        while b"}" not in info:
            chunk = os.read(read, 4096)
            assert chunk, f"bubblewrap said nothing (status {sandbox.poll()})"
            info += chunk
        init = int(json.loads(info[: info.index(b"}") + 1])["child-pid"])
        namespace = os.readlink(f"/proc/{init}/ns/pid")
        deadline = time.monotonic() + 30
        while sandbox_usage(namespace).tasks < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield init, namespace
    finally:
        os.close(read)
        sandbox.kill()
        sandbox.wait()


def _namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:  # ended meanwhile
        return None


def test_walking_down_from_the_init_finds_what_reading_all_of_proc_finds(
    process_tree: tuple[int, str],
) -> None:
    init, namespace = process_tree
    everyone = sorted(e.name for e in os.scandir("/proc") if e.name.isdigit()
                      and _namespace(e.name) == namespace)
    walked = descendants(init, namespace)
    assert walked is not None and sorted(walked) == everyone and len(everyone) == 5
    scanned, seen = sandbox_usage(namespace), sandbox_usage(namespace, init)
    assert seen.tasks == scanned.tasks == 5
    assert seen.memory_bytes == pytest.approx(scanned.memory_bytes, rel=0.05)


def test_an_init_that_ended_has_no_descendants(process_tree: tuple[int, str]) -> None:
    init, namespace = process_tree
    assert descendants(init, "pid:[0]") == []  # not that namespace's init (any more)
    assert descendants(os.getpid(), namespace) == []


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root to try the unprivileged sandbox as another user",
)
def test_unprivileged_sandbox_counts_its_own_processes() -> None:
    """Graded by a non-root user, the task limit counts the sandbox's user namespace only:
    the user's other processes neither use it up nor are limited by it."""
    uid = 2_000_000_000 + os.getpid() % 1000  # below 2^31: bubblewrap prints uid maps signed
    bomb = (
        "import os, time\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n"
        "            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
        "print(n, open('/proc/self/status').read().split('CapEff:')[1].split()[0])"
    )
    spec = {"rlimits": Limits(processes=24).rlimits(), "uid": None,
            "argv": ["/usr/bin/python3", "-c", bomb]}
    # The launcher's stdout goes to /dev/null: run the bomb's own print through a file.
    script = LAUNCHER.replace("for fd in (0, 1, 2):\n    os.dup2(null, fd)\n", "")
    argv = ["bwrap", *system_argv(unprivileged=True), "--proc", "/proc", "--dev", "/dev",
            "--", "/usr/bin/python3", "-I", "-S", "-c", script, json.dumps(spec)]
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    out = subprocess.run(setpriv + argv, capture_output=True, text=True, timeout=60)
    forks, caps = out.stdout.split()
    assert 15 <= int(forks) < 24 and caps == "0000000000000000", out.stderr
    nested = subprocess.run(setpriv + ["bwrap", *system_argv(unprivileged=True), "--proc",
                                       "/proc", "--dev", "/dev", "unshare", "-U", "true"],
                            capture_output=True, timeout=60)
    assert nested.returncode != 0  # no user namespace inside: no way to gain capabilities
