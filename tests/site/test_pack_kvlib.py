"""scripts/pack_kvlib.py: the kvlib modules the in-browser calculator needs, found by
walking imports, packed into a zip that runs on the standard library alone."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import pack_kvlib  # noqa: E402

from kvlib.cli import main as kvlib_main  # noqa: E402
from kvlib.config import bundled_models  # noqa: E402

GLUE = ROOT / "book" / "calculator_assets" / "kvcalc.py"


def _cli_json(args: list[str]) -> dict[str, object]:
    """``kvlib size ARGS --json`` through the CLI's entry point."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert kvlib_main(["size", *args, "--json"]) == 0
    result: dict[str, object] = json.loads(out.getvalue())
    return result


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zip as the site build writes it, unpacked into a folder."""
    folder = tmp_path_factory.mktemp("packed")
    archive = folder / "kvlib.zip"
    pack_kvlib.pack(archive, extra=[GLUE])
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(folder / "site")
    return folder / "site"


def test_pack_holds_every_kvlib_module_the_size_command_loads() -> None:
    # Oracle: the modules a real interpreter has loaded after running the command on
    # every bundled model with a GPU (so the weights, seats and decode paths all run).
    script = textwrap.dedent(
        """
        import argparse, contextlib, io, sys
        from kvlib.commands import size
        from kvlib.config import bundled_models
        parser = argparse.ArgumentParser(prog="kvlib")
        size.register(parser.add_subparsers())
        for name in bundled_models():
            args = parser.parse_args(["size", name, "--gpu", "H100-SXM", "--json"])
            with contextlib.redirect_stdout(io.StringIO()):
                assert args.handler(args) == 0
        print("\\n".join(m for m in sys.modules if m == "kvlib" or m.startswith("kvlib.")))
        """
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    closure = pack_kvlib.import_closure()
    assert set(loaded) <= set(closure), sorted(set(loaded) - set(closure))
    assert "kvlib.commands.size" in closure
    # Nothing from the torch zone or the grader rides along.
    assert not any(m.startswith(("kvlib.nn", "kvlib.serving")) for m in closure)


def test_pack_holds_the_data_files_and_the_extra_file(packed: Path) -> None:
    configs = sorted(p.stem for p in (packed / "kvlib" / "data" / "configs").glob("*.json"))
    assert configs == bundled_models()
    assert (packed / "kvlib" / "data" / "config_defaults.json").is_file()
    assert (packed / GLUE.name).read_bytes() == GLUE.read_bytes()


def test_pack_is_reproducible(tmp_path: Path) -> None:
    first, second = tmp_path / "a.zip", tmp_path / "b.zip"
    names = pack_kvlib.pack(first, extra=[GLUE])
    pack_kvlib.pack(second, extra=[GLUE])
    assert first.read_bytes() == second.read_bytes()
    assert names == sorted(names[:-1]) + [GLUE.name]


def test_packed_kvlib_runs_on_the_standard_library_alone(packed: Path) -> None:
    """The unpacked zip, on a Python without site-packages (-I -S), gives the CLI's
    report for every bundled model: what Pyodide's core will run."""
    models = bundled_models()
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(packed)!r})
        import kvcalc
        out = {{}}
        for name in {models!r}:
            result = kvcalc.compute({{"model": name, "gpu": "H100-SXM", "context": "8192"}})
            assert result["status"] == 0, result
            out[name] = json.loads(result["json"])
        third_party = sorted(
            m for m in sys.modules
            if m.split(".")[0] not in sys.stdlib_module_names
            and m.split(".")[0] not in ("kvlib", "kvcalc", "__main__")
        )
        print(json.dumps({{"reports": out, "third_party": third_party}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script],
        cwd=packed,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["third_party"] == []
    for name in models:
        expected = _cli_json([name, "--gpu", "H100-SXM", "--context", "8192"])
        assert result["reports"][name] == expected, name


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_closure_follows_function_imports_and_skips_type_checking(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from pkg.sub import leaf\n",
            "pkg/sub/leaf.py": "import json\n",
            "pkg/a.py": """
                from __future__ import annotations
                from typing import TYPE_CHECKING
                from . import b
                from .sub.leaf import loads
                if TYPE_CHECKING:
                    from pkg import typing_only
                def later():
                    from pkg import lazy
                    import numpy  # inside a function: the page must not call it
                """,
            "pkg/b.py": "import math\n",
            "pkg/lazy.py": "import re\n",
            "pkg/typing_only.py": "import torch\n",
            "pkg/unused.py": "",
        },
    )
    closure = pack_kvlib.import_closure(root, "pkg.a", "pkg")
    assert list(closure) == ["pkg", "pkg.a", "pkg.b", "pkg.lazy", "pkg.sub", "pkg.sub.leaf"]


def test_closure_refuses_a_module_level_third_party_import(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": "\n\nimport numpy\n"},
    )
    with pytest.raises(pack_kvlib.PackError, match=r"pkg\.b \(line 3\) imports numpy"):
        pack_kvlib.import_closure(root, "pkg.a", "pkg")


def test_closure_refuses_a_standard_module_pyodide_leaves_out(tmp_path: Path) -> None:
    lock = tmp_path / "pyodide-lock.json"
    lock.write_text(
        json.dumps(
            {
                "packages": {
                    "sqlite3": {"package_type": "cpython_module", "imports": ["sqlite3"]},
                    "numpy": {"package_type": "package", "imports": ["numpy"]},
                }
            }
        )
    )
    missing = pack_kvlib.pyodide_missing_modules(lock)
    assert missing == {"sqlite3"}
    root = _package(tmp_path / "src", {"pkg/__init__.py": "", "pkg/a.py": "import sqlite3\n"})
    assert list(pack_kvlib.import_closure(root, "pkg.a", "pkg")) == ["pkg", "pkg.a"]
    with pytest.raises(pack_kvlib.PackError, match="imports sqlite3"):
        pack_kvlib.import_closure(root, "pkg.a", "pkg", missing)


def test_kvlib_needs_nothing_pyodide_leaves_out() -> None:
    """Every standard-library module Pyodide ships apart from its core, by the names in
    its lock file's 'cpython_module' entries (checked against the pinned copy when the
    site has been built)."""
    lock = ROOT / "node_modules" / "pyodide" / "pyodide-lock.json"
    if not lock.is_file():
        lock = ROOT / "_vendor" / "pyodide" / "pyodide-lock.json"
    missing = pack_kvlib.pyodide_missing_modules(lock) if lock.is_file() else set()
    modules = {"sqlite3", "ssl", "lzma", "_hashlib", "_pydecimal", "pydoc_data", "test"}
    pack_kvlib.import_closure(missing=missing | modules)  # raises when kvlib imports one


def test_main_writes_the_zip_and_fails_clearly(tmp_path: Path) -> None:
    out = tmp_path / "kvlib.zip"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "pack_kvlib.py"), str(out), "--add", str(GLUE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "kvcalc.py" in zipfile.ZipFile(out).namelist()
    with pytest.raises(pack_kvlib.PackError, match="already packed"):
        pack_kvlib.pack(tmp_path / "twice.zip", extra=[GLUE, GLUE])


def test_write_wheel_is_a_wheel_pip_installs(tmp_path: Path) -> None:
    # Oracle: pip itself installs the wheel (it checks the name, tags and RECORD), and the
    # installed module imports; two writes of the same files give the same bytes.
    package = _package(tmp_path / "src", {"tinypkg/__init__.py": "ANSWER = 42\n",
                                           "tinypkg/data/x.json": "{}\n"})
    members = pack_kvlib.package_files(package / "tinypkg")
    first = pack_kvlib.write_wheel(tmp_path / "a", "tiny-pkg", "1.2.3", dict(members), "t")
    second = pack_kvlib.write_wheel(tmp_path / "b", "tiny-pkg", "1.2.3", dict(members), "t")
    assert first.name == "tiny_pkg-1.2.3-py3-none-any.whl"
    assert first.read_bytes() == second.read_bytes()
    target = tmp_path / "installed"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", str(target), str(first)],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    imported = subprocess.run(
        [sys.executable, "-c", "import tinypkg; print(tinypkg.ANSWER)"],
        cwd=tmp_path, env={"PYTHONPATH": str(target)}, capture_output=True, text=True,
        check=False,
    )
    assert imported.stdout.strip() == "42", imported.stderr
    assert (target / "tinypkg" / "data" / "x.json").is_file()
