"""kvlib.grading.sandbox: student kernels see neither the course directory nor the network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import kvlib.grading.sandbox as sandbox
from kvlib.grading.sandbox import (
    SandboxedKernelManager,
    SandboxError,
    bwrap_available,
    sandbox_argv,
)


def run_sandboxed(argv: list[str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*argv, sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def course(tmp_path: Path) -> Path:
    (tmp_path / "course" / "solutions").mkdir(parents=True)
    (tmp_path / "course" / "solutions" / "answer.txt").write_text("secret")
    (tmp_path / "course" / "autograded" / "s").mkdir(parents=True)
    return tmp_path / "course"


def test_bwrap_is_installed() -> None:
    """`make test` installs bubblewrap (target grading-deps); grading requires it."""
    assert bwrap_available(), "install bubblewrap: apt-get install bubblewrap"


def test_mount_order(tmp_path: Path) -> None:
    argv = sandbox_argv(
        hidden=[tmp_path / "a" / "b", tmp_path / "a"],
        readable=[tmp_path / "a" / "venv"],
        writable=[tmp_path / "a" / "work"],
        env={"K": "V"},
        cwd=tmp_path / "a" / "work",
    )
    tmpfs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]
    assert tmpfs == [str(tmp_path / "a")]  # the nested path is covered by its parent
    assert argv.index("--tmpfs") < argv.index("--bind")
    assert argv[-3:] == ["--chdir", str(tmp_path / "a" / "work"), "--"]
    assert "--unshare-net" in argv


class TestIsolation:
    def argv(self, course: Path) -> list[str]:
        work = course / "autograded" / "s"
        return sandbox_argv([course], [Path(sys.prefix)], [work], {}, work)

    def test_hidden_directory_is_empty(self, course: Path) -> None:
        code = f"import os; print(os.listdir({str(course)!r}))"
        out = run_sandboxed(self.argv(course), code)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "['autograded']"

    def test_solution_unreadable(self, course: Path) -> None:
        out = run_sandboxed(self.argv(course), "open('../../solutions/answer.txt').read()")
        assert out.returncode != 0 and "FileNotFoundError" in out.stderr
        # the same code outside the sandbox does read it: the test above can fail
        direct = subprocess.run(
            [sys.executable, "-c", "print(open('../../solutions/answer.txt').read())"],
            cwd=course / "autograded" / "s",
            capture_output=True,
            text=True,
        )
        assert direct.stdout.strip() == "secret"

    def test_only_own_directory_writable(self, course: Path) -> None:
        code = "open('mine.txt', 'w').write('x')\nopen('/etc/kvlib-test', 'w')"
        out = run_sandboxed(self.argv(course), code)
        assert "Read-only file system" in out.stderr
        assert (course / "autograded" / "s" / "mine.txt").read_text() == "x"

    def test_no_network(self, course: Path) -> None:
        code = "import socket; print(socket.if_nameindex())"
        out = run_sandboxed(self.argv(course), code)
        assert out.stdout.strip() == "[(1, 'lo')]"


class TestModes:
    def test_require_without_bwrap_is_a_clear_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(sandbox, "bwrap_available", lambda: False)
        monkeypatch.delenv(sandbox.MODE_ENV, raising=False)
        with pytest.raises(SandboxError, match="bubblewrap"):
            SandboxedKernelManager(mode="require")
        assert not SandboxedKernelManager(mode="auto").sandboxed

    def test_env_overrides_and_is_checked(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv(sandbox.MODE_ENV, "off")
        assert not SandboxedKernelManager(mode="require").sandboxed
        monkeypatch.setenv(sandbox.MODE_ENV, "sometimes")
        with pytest.raises(SandboxError, match=sandbox.MODE_ENV):
            SandboxedKernelManager()

    def test_sandboxed_kernel_uses_unix_sockets(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv(sandbox.MODE_ENV, raising=False)
        km = SandboxedKernelManager(mode="require")
        assert km.sandboxed and km.transport == "ipc"
        assert km.connection_file.startswith(km.runtime_dir)


def test_kernel_command_hides_course_home_and_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(sandbox.MODE_ENV, raising=False)
    km = SandboxedKernelManager(mode="require", hidden_paths=[str(tmp_path / "course")])
    km._launch_args = {"cwd": str(tmp_path / "course" / "autograded" / "s" / "a")}
    argv = km.format_kernel_cmd()
    tmpfs = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"}
    checkout = Path(sandbox.__file__).resolve().parents[2]
    # Each must be hidden, itself or under a hidden parent (a checkout may live in /tmp).
    for hidden in (Path.home().resolve(), Path("/tmp"), checkout, tmp_path / "course"):
        assert any(hidden.is_relative_to(mount) for mount in tmpfs), hidden
    ro_binds = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind"}
    assert str(Path(sys.prefix).resolve()) in ro_binds
    assert argv[argv.index("--chdir") + 1] == km._launch_args["cwd"]
    assert argv[argv.index("--") + 1 :][0] == sys.executable
