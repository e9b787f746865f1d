"""scripts/pyodide_compile.py: the lite kernel's Python compiled by Pyodide's own CPython.

A wheel made here is compiled in Node.js by the Pyodide that ``make book`` vendors: each
module becomes a sourceless ``.pyc`` of that interpreter's bytecode, carrying the path
it has in the kernel; a module that does not compile stays source; RECORD matches the
files. The built site serves the pinned third-party wheels and Pyodide's standard library
compiled that way.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from site_helpers import ROOT, ensure_site

sys.path.insert(0, str(ROOT / "scripts"))

from build_lite import PYODIDE_SOURCE, pinned_wheels  # noqa: E402
from pyodide_compile import STDLIB_ZIP, compile_wheels, run_in_pyodide  # noqa: E402

pytestmark = pytest.mark.site

# CPython's pyc header: magic (4 bytes), flags (4: bit 0 hash-based, bit 1 checked), then
# the source hash (8) and the marshalled code.
UNCHECKED_HASH = (1).to_bytes(4, "little")


def pyodide_magic(tmp: Path) -> bytes:
    """importlib's MAGIC_NUMBER as the vendored Pyodide's CPython reports it."""
    out = run_in_pyodide(PYODIDE_SOURCE, tmp,
                         "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())")
    return bytes.fromhex(out.strip().splitlines()[-1])


def record_problems(wheel: zipfile.ZipFile) -> list[str]:
    """Members RECORD lists with a wrong hash or size, and members it leaves out."""
    record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
    listed = {}
    for line in wheel.read(record).decode().splitlines():
        name, digest, size = line.rsplit(",", 2)
        listed[name] = (digest, size)
    problems = [f"{name} not in RECORD" for name in wheel.namelist() if name not in listed]
    for name, (digest, size) in listed.items():
        if name == record:
            continue
        data = wheel.read(name)
        want = "sha256=" + base64.urlsafe_b64encode(
            hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if (digest, size) != (want, str(len(data))):
            problems.append(f"{name}: RECORD says {digest},{size}")
    return problems


@pytest.fixture(scope="module")
def magic(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    ensure_site()  # vendors Pyodide
    return pyodide_magic(tmp_path_factory.mktemp("pyodide"))


def _wheel(folder: Path) -> Path:
    path = folder / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        # A set constant (a frozenset in the bytecode): its bytes must not vary either.
        wheel.writestr("demo/__init__.py", "ANSWER = 6 * 7\n"
                       "def named(x):\n    return x in {'alpha', 'beta', 'gamma', 'delta'}\n")
        wheel.writestr("demo/py2_data.py", "print 'a Python 2 statement'\n")
        wheel.writestr("demo/grammar.txt", "not Python\n")
        wheel.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
        wheel.writestr("demo-1.0.dist-info/RECORD", "")
    return path


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory, magic: bytes) -> tuple[Path, Path, Any]:
    """The demo wheel, and what one Pyodide run made of it (each run boots Pyodide in
    Node.js: seconds of CPU): the source, the compiled wheel and the modules kept as source."""
    folder = tmp_path_factory.mktemp("demo")
    source = _wheel(folder)
    kept = compile_wheels([source], PYODIDE_SOURCE, folder / "one")
    return source, folder / "one" / source.name, kept


def test_a_wheel_is_compiled_by_pyodides_python(compiled: tuple[Path, Path, Any],
                                                 magic: bytes) -> None:
    _, path, kept = compiled
    assert kept == {"demo-1.0-py3-none-any.whl": 1}  # the Python 2 file
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        assert {"demo/__init__.pyc", "demo/py2_data.py", "demo/grammar.txt"} <= names
        assert "demo/__init__.py" not in names
        compiled = wheel.read("demo/__init__.pyc")
        assert compiled[:4] == magic and compiled[4:8] == UNCHECKED_HASH
        # Tracebacks name the module where the kernel unpacks it.
        assert b"/site-packages/demo/__init__.py" in compiled
        assert record_problems(wheel) == []


def test_compiling_twice_gives_the_same_bytes(tmp_path: Path,
                                             compiled: tuple[Path, Path, Any]) -> None:
    # Two Node.js processes: a set constant's order follows each one's string hashing.
    source, first, _ = compiled
    compile_wheels([source], PYODIDE_SOURCE, tmp_path / "two")
    assert first.read_bytes() == (tmp_path / "two" / source.name).read_bytes()


def test_the_site_serves_the_pinned_wheels_compiled(magic: bytes) -> None:
    served = ROOT / "_build" / "html" / "lite" / "static" / "pyodide"
    lock = json.loads((served / "pyodide-lock.json").read_text())["packages"]
    files = {entry["file_name"]: entry["sha256"] for entry in lock.values()}
    pins = pinned_wheels()
    checked = 0
    for path in sorted(served.glob("*.whl")):
        name = path.name.split("-")[0].replace("_", "-").lower()
        if name not in pins:
            continue  # kvlib, kvlib-lite and the kernel's own wheels: served as source
        checked += 1
        assert files[path.name] == hashlib.sha256(path.read_bytes()).hexdigest()
        with zipfile.ZipFile(path) as wheel:
            modules = [n for n in wheel.namelist() if n.endswith((".py", ".pyc"))]
            source = [n for n in modules if n.endswith(".py")]
            assert modules and not source, (path.name, source[:5])
            for member in modules:
                assert wheel.read(member)[:8] == magic + UNCHECKED_HASH, (path.name, member)
            assert record_problems(wheel) == [], path.name
    assert checked == len(pins)  # every pinned wheel, comm (also in piplite's index) too


def test_the_site_serves_the_standard_library_compiled(magic: bytes) -> None:
    served = ROOT / "_build" / "html" / "lite" / "static" / "pyodide" / STDLIB_ZIP
    with zipfile.ZipFile(served) as stdlib, zipfile.ZipFile(PYODIDE_SOURCE / STDLIB_ZIP) as raw:
        names = stdlib.namelist()
        source = [n for n in raw.namelist() if n.endswith(".py")]
        assert [n for n in names if n.endswith(".py")] == []
        assert sorted(n[:-1] for n in names if n.endswith(".pyc")) == sorted(source)
        for member in ("json/__init__.pyc", "asyncio/__init__.pyc", "_pyodide/__init__.pyc"):
            compiled = stdlib.read(member)
            assert compiled[:8] == magic + UNCHECKED_HASH, member
            # zipimport's path for it, as a traceback in the kernel names it
            assert f"/lib/python314.zip/{member[:-1]}".encode() in compiled, member
