"""course.sandbox.kernel: what a student's kernel can see, reach, write and keep.

One sandboxed kernel runs a notebook of probes once (module fixture), in a
fake course folder holding a solution, a gradebook, a data file of the
assignment and a symbolic link a student submitted; each test reads one
probe's printed JSON. The grader's environment carries a fake database
password that must not reach the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from traitlets.config import Config

import course.sandbox.kernel as sandbox
from course.sandbox.kernel import SandboxedKernelManager, SandboxError, bwrap_available
from course.sandbox.limits import kernel_uid, tasks_of

MiB = 2**20
SECRET_ENV = {"PGPASSWORD": "hunter2", "KVLIB_GRADEBOOK_URL": "postgresql://u:hunter2@db/c"}

PROBES = {
    "identity": "import os, json\nstatus = open('/proc/self/status').read()\n"
    "caps = [l.split()[1] for l in status.splitlines() if l.startswith('CapEff')][0]\n"
    "print(json.dumps({'uid': os.getuid(), 'caps': caps}))",
    "files": "import os, json, glob\nprint(json.dumps({'cwd': sorted(os.listdir('.')), "
    "'course': sorted(os.listdir(COURSE)) if os.path.isdir(COURSE) else None, "
    "'root': sorted(os.listdir('/')), 'run': os.path.exists('/run'), "
    "'home': os.path.exists(HOME) and sorted(os.listdir(HOME)), "
    "'visible': sorted(glob.glob(COURSE + '/**', recursive=True)), "
    "'data': open('data.csv').read()}))",
    "env": "import os, json\nprint(json.dumps(dict(os.environ)))",
    "network": "import socket, json\nreach = []\n"
    "for addr in [('1.1.1.1', 53), ('127.0.0.1', 22)]:\n"
    "    try:\n        socket.create_connection(addr, timeout=1); reach.append(addr)\n"
    "    except OSError:\n        pass\n"
    "print(json.dumps({'interfaces': [n for _, n in socket.if_nameindex()], 'reach': reach}))",
    "writes": "import os, json, errno\ndef attempt(path, size):\n    try:\n"
    "        with open(path, 'wb') as f:\n            f.write(b'x' * size)\n        return 'ok'\n"
    "    except OSError as err:\n        return errno.errorcode[err.errno]\n"
    "result = {'cwd': attempt('mine.txt', 10), 'usr': attempt('/usr/x', 1), "
    "'big': attempt('/tmp/big', 12 * 2**20), 'shm': attempt('/dev/shm/x', 2 * 2**20)}\n"
    "n = 0\nwhile attempt(f'/tmp/f{n}', 2**20) == 'ok' and n < 100:\n    n += 1\n"
    "result['tmp_files_of_1MiB'] = n\nprint(json.dumps(result))",
    "escape": "import subprocess, json\n"
    "runs = {c: subprocess.run(c, shell=True, capture_output=True)"
    ".returncode for c in ['umount -l .', 'mount -t tmpfs none /usr']}\n"
    "nested = subprocess.run('unshare -rm sh -c \"umount -l /tmp; umount -l /work; '"
    "f'cat {COURSE}/solutions/a/answer.txt\"', shell=True, capture_output=True, text=True)\n"
    "import os\nprint(json.dumps({'runs': runs, 'nested': nested.stdout, "
    "'course': os.path.isdir(COURSE + '/solutions')}))",
    "limits": "import resource, json\n"
    "print(json.dumps({n: resource.getrlimit(getattr(resource, n))[0]"
    " for n in ['RLIMIT_AS', 'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_CORE']}))",
    "debugger": "import json, sys\n"
    "blocked = 'debugpy' in sys.modules and sys.modules['debugpy'] is None\n"
    "print(json.dumps({'blocked': blocked, "
    "'pydevd': sorted(m for m in sys.modules if 'pydevd' in m)[:3]}))",
    "memory": "import json\ntry:\n    x = bytearray(512 * 2**20)\n    r = 'allocated'\n"
    "except MemoryError:\n    r = 'MemoryError'\nprint(json.dumps({'result': r}))",
}


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    course = tmp_path_factory.mktemp("course")
    (course / "solutions" / "a").mkdir(parents=True)
    (course / "solutions" / "a" / "answer.txt").write_text("secret")
    (course / "solutions" / "a" / "data.csv").write_text("x,y\n")
    (course / "gradebook.db").write_text("grades")
    work = course / "autograded" / "s" / "a"
    work.mkdir(parents=True)
    (work / "data.csv").write_text("x,y\n")
    (work / "a.ipynb").write_text("{}")
    (work / "link.txt").symlink_to(course / "solutions" / "a" / "answer.txt")
    setup = f"COURSE, HOME = {str(course)!r}, {str(Path.home())!r}"
    cells = [nbformat.v4.new_code_cell(setup)]
    cells += [nbformat.v4.new_code_cell(code) for code in PROBES.values()]
    nb = nbformat.v4.new_notebook(cells=cells)
    config = Config()
    config.SandboxedKernelManager.mode = "require"
    config.SandboxedKernelManager.course_root = str(course)
    config.SandboxedKernelManager.memory_bytes = 256 * MiB
    config.SandboxedKernelManager.file_bytes = 8 * MiB
    config.SandboxedKernelManager.scratch_bytes = 16 * MiB
    before = dict(os.environ)
    os.environ.update(SECRET_ENV)
    try:
        client = NotebookClient(
            nb, timeout=60, kernel_name="python3", allow_errors=True, config=config,
            kernel_manager_class=SandboxedKernelManager,
            resources={"metadata": {"path": str(work)}},
        )
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(before)
    results: dict[str, Any] = {"course": course, "work": work}
    for name, cell in zip(PROBES, nb.cells[1:], strict=True):
        text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"probe {name}: {errors}"
        results[name] = json.loads(text.strip().splitlines()[-1])
    return results


def test_bwrap_is_installed() -> None:
    """`make test` installs bubblewrap (target system-deps); grading requires it."""
    assert bwrap_available(), "install bubblewrap: apt-get install bubblewrap"


def test_no_privileges(probes: dict[str, Any]) -> None:
    assert probes["identity"]["caps"] == "0000000000000000"
    assert probes["identity"]["uid"] != 0
    if os.geteuid() == 0:  # as root, a uid of the kernel's own: process limits then count
        assert probes["identity"]["uid"] >= 3_000_000_000


def test_course_home_and_sockets_absent(probes: dict[str, Any]) -> None:
    files = probes["files"]
    assert files["course"] == ["autograded"]  # only the path down to the notebook's folder
    visible = {Path(p).relative_to(probes["course"]).as_posix() for p in files["visible"]}
    assert visible == {
        ".",
        "autograded",
        "autograded/s",
        "autograded/s/a",
        "autograded/s/a/data.csv",
    }
    assert files["run"] is False  # no database or other Unix sockets
    python = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    for entry in files["home"] or []:  # only the way down to the Python installation
        assert any((Path.home() / entry) in p.parents or Path.home() / entry == p for p in python)
    # System folders, and the top folder of the way down to Python and the course's venv
    # (wherever the course was cloned: /work here, elsewhere on another machine).
    tops = {Path(p).resolve().parts[1] for p in (sys.prefix, sys.base_prefix, sys.executable)}
    assert set(files["root"]) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                                  "root", "sbin", "tmp", "usr", "home", "opt"} | tops


def test_notebook_folder_holds_only_assignment_files(probes: dict[str, Any]) -> None:
    """The released data file is there; the submitted link (to a solution) and the notebook
    file itself are not: nbgrader would copy the link's target for the grader."""
    assert probes["files"]["cwd"] == ["data.csv"]
    assert probes["files"]["data"] == "x,y\n"
    assert (probes["work"] / "link.txt").read_text() == "secret"  # outside, it is readable


def test_environment_rebuilt(probes: dict[str, Any]) -> None:
    env = probes["env"]
    assert not set(SECRET_ENV) & set(env)
    assert "hunter2" not in json.dumps(env)
    assert env["HOME"] == "/tmp" and env["OPENBLAS_NUM_THREADS"] == "1"


def test_no_network(probes: dict[str, Any]) -> None:
    assert probes["network"] == {"interfaces": ["lo"], "reach": []}


def test_writes_stay_in_small_scratch_space(probes: dict[str, Any]) -> None:
    writes = probes["writes"]
    assert writes["cwd"] == "ok" and writes["usr"] == "EROFS"
    assert writes["big"] == "EFBIG"  # 12 MiB file, 8 MiB limit
    assert writes["shm"] == "ENOSPC"
    assert writes["tmp_files_of_1MiB"] < 16  # the 16 MiB tmpfs fills up
    assert not (probes["work"] / "mine.txt").exists()  # nothing reached the host


def test_cannot_unmount_or_mount(probes: dict[str, Any]) -> None:
    assert all(code != 0 for code in probes["escape"]["runs"].values())
    assert probes["escape"]["course"] is False
    # In a nested user namespace (refused when grading unprivileged) unmounting reveals only
    # the sandbox's own empty root: the host file system was never mounted.
    assert "secret" not in probes["escape"]["nested"]


def test_rlimits_applied(probes: dict[str, Any]) -> None:
    limits = probes["limits"]
    assert limits["RLIMIT_AS"] == 256 * MiB and limits["RLIMIT_FSIZE"] == 8 * MiB
    assert limits["RLIMIT_NPROC"] == 64 and limits["RLIMIT_CORE"] == 0
    assert probes["memory"]["result"] == "MemoryError"


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
        assert km.ip.startswith(km.socket_dir) and km.connection_file.startswith(km.runtime_dir)


def test_no_debugger_is_loaded(probes: dict[str, Any]) -> None:
    # debugpy blocked (None in sys.modules), and none of pydevd loaded
    assert probes["debugger"] == {"blocked": True, "pydevd": []}


def test_kernel_uid_is_unique_per_grading_process() -> None:
    code = "from course.sandbox.limits import kernel_uid; print(kernel_uid())"
    uids = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout for _ in range(2)}
    if os.geteuid() == 0:
        assert len(uids) == 2 and kernel_uid() is not None
    else:
        assert uids == {"None\n"}


def test_tasks_of_counts_the_processes_of_a_uid() -> None:
    """What a restarted kernel waits on: the processes still running as its uid."""
    uid = kernel_uid()
    assert uid is not None  # the grader runs as root here, and kernels as uids of their own
    assert tasks_of(uid) == 0
    code = f"import os, time; os.setgid({uid}); os.setuid({uid}); time.sleep(60)"
    children = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
    try:
        deadline = time.monotonic() + 20
        while tasks_of(uid) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tasks_of(uid) == 3
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert tasks_of(uid) == 0
