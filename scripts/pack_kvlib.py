"""Pack the part of kvlib that ``kvlib size`` runs on into one zip, for Python in the browser.

The calculator page (``book/calculator.md``) runs ``kvlib size`` itself on Pyodide, so
its numbers cannot drift from the CLI's, the book's or the grader's. Pyodide's core
holds CPython and its standard library, nothing else; this script packs the kvlib
modules the command needs, and the data files they read, into a zip the page unpacks
into Pyodide's file system.

The module set is computed, never listed by hand: starting from
``kvlib.commands.size``, every ``import`` of a kvlib module is followed, at module level
and inside functions (both run when the command runs), but not under
``if TYPE_CHECKING:`` (never runs). Each module brings the packages that hold it (their
``__init__`` runs first). A module-level import of anything outside kvlib and the
standard library, or of a standard-library module Pyodide's core leaves out (its
``pyodide-lock.json`` lists them as separate packages), fails the pack: the page could
not import it. Everything under ``kvlib/data`` is packed too (configs, defaults).

The JupyterLite build (scripts/build_lite.py) installs kvlib whole in the browser's
kernel instead: :func:`write_wheel` writes a pure-Python wheel (``py3-none-any``) of a
package folder, with the same fixed time stamps, so equal sources give equal bytes.

Usage: ``python scripts/pack_kvlib.py OUTPUT.zip [--add FILE ...] [--pyodide-lock PATH]``.
"""

from __future__ import annotations

import argparse
import ast
import base64
import hashlib
import json
import sys
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DATA_DIR",
    "PACKAGE",
    "START",
    "ImportSite",
    "PackError",
    "import_closure",
    "imports_of",
    "pack",
    "pack_members",
    "package_files",
    "pyodide_missing_modules",
    "write_wheel",
]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "kvlib"
START = "kvlib.commands.size"
DATA_DIR = "data"  # under the package: read at run time through Path(__file__)
# A fixed time stamp makes the zip depend on the file contents only.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


class PackError(Exception):
    """The command needs something the browser's Python cannot import."""


@dataclass(frozen=True)
class ImportSite:
    """One imported module name, where it was imported and whether at module level."""

    name: str
    importer: str
    line: int
    module_level: bool


def module_file(root: Path, name: str) -> Path | None:
    """Source of module ``name`` (dotted) under ``root``: ``a/b.py`` or ``a/b/__init__.py``."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, module_level: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every node under ``node`` with whether it runs at import time; skips TYPE_CHECKING."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield sub, module_level
                yield from _walk(sub, module_level)
            continue
        inner = module_level and not isinstance(
            child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
        )
        yield child, inner
        yield from _walk(child, inner)


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str:
    """The absolute name of ``from <level dots><module> import ...`` inside ``importer``."""
    if level == 0:
        return module or ""
    parts = importer.split(".")
    keep = len(parts) - level + (1 if is_package else 0)
    if keep < 1:
        raise PackError(f"{importer}: relative import beyond the top-level package")
    return ".".join(parts[:keep] + ([module] if module else []))


def imports_of(root: Path, name: str) -> list[ImportSite]:
    """Every module module ``name`` imports (``from p import m`` counts ``p.m`` when it is a
    module under ``root``), in source order."""
    path = module_file(root, name)
    if path is None:
        raise PackError(f"no module {name} under {root}")
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    sites: list[ImportSite] = []
    for node, module_level in _walk(tree, True):
        if isinstance(node, ast.Import):
            for alias in node.names:
                sites.append(ImportSite(alias.name, name, node.lineno, module_level))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, name, is_package)
            sites.append(ImportSite(base, name, node.lineno, module_level))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                if module_file(root, child) is not None:
                    sites.append(ImportSite(child, name, node.lineno, module_level))
    return sites


def _parents(name: str) -> Iterator[str]:
    parts = name.split(".")
    for i in range(1, len(parts)):
        yield ".".join(parts[:i])


def import_closure(
    root: Path = ROOT,
    start: str = START,
    package: str = PACKAGE,
    missing: Iterable[str] = (),
) -> dict[str, Path]:
    """Module name -> source file of every ``package`` module that ``start`` imports.

    ``missing``: top-level module names the target Python lacks although they are in
    CPython's standard library. Raises :class:`PackError` naming the importer and line
    of a module-level import the target cannot satisfy.
    """
    unavailable = set(missing)
    found: dict[str, Path] = {}
    todo = [start, *_parents(start)]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = module_file(root, name)
        if path is None:
            raise PackError(f"no module {name} under {root}")
        found[name] = path
        for site in imports_of(root, name):
            top = site.name.split(".")[0]
            if top == package:
                if module_file(root, site.name) is None:
                    continue  # `from kvlib.x import name`: the name, not a module
                todo += [site.name, *_parents(site.name)]
            elif site.module_level and (
                top not in sys.stdlib_module_names and top != "__future__" or top in unavailable
            ):
                raise PackError(
                    f"{site.importer} (line {site.line}) imports {site.name} at module level: "
                    "the in-browser calculator has only the standard library; import it "
                    "inside the function that needs it, or keep it out of this command"
                )
    return dict(sorted(found.items()))


def pyodide_missing_modules(lock_file: Path) -> set[str]:
    """Standard-library modules that Pyodide ships as separate packages (not in its core)."""
    lock = json.loads(lock_file.read_text(encoding="utf-8"))
    return {
        module
        for entry in lock["packages"].values()
        if entry.get("package_type") == "cpython_module"
        for module in entry.get("imports", [])
    }


def pack_members(
    root: Path = ROOT, start: str = START, package: str = PACKAGE, missing: Iterable[str] = ()
) -> dict[str, Path]:
    """Name inside the zip -> file on disk: the import closure and the package's data."""
    members = {
        path.relative_to(root).as_posix(): path
        for path in import_closure(root, start, package, missing).values()
    }
    data = root / package / DATA_DIR
    for path in sorted(data.rglob("*")) if data.is_dir() else []:
        if path.is_file() and "__pycache__" not in path.parts:
            members[path.relative_to(root).as_posix()] = path
    return dict(sorted(members.items()))


def pack(
    output: Path,
    root: Path = ROOT,
    start: str = START,
    extra: Sequence[Path] = (),
    missing: Iterable[str] = (),
) -> list[str]:
    """Write the zip (``extra`` files go at its top level); return the names it holds.

    The file is written beside ``output`` and renamed over it, so a reader never sees
    half a zip.
    """
    members = pack_members(root, start, PACKAGE, missing)
    for path in extra:
        if path.name in members:
            raise PackError(f"{path}: a file named {path.name} is already packed")
        members[path.name] = path
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for arcname, path in members.items():
            info = zipfile.ZipInfo(arcname, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, path.read_bytes())
    partial.replace(output)
    return list(members)


def package_files(folder: Path, arc_prefix: str = "") -> dict[str, Path]:
    """Name inside an archive -> file, for every file under ``folder`` but caches."""
    prefix = arc_prefix or folder.name
    return {
        f"{prefix}/{path.relative_to(folder).as_posix()}": path
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def _record_hash(data: bytes) -> str:
    """A RECORD hash: ``sha256=`` and the urlsafe base64 digest without padding (PEP 376)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def write_wheel(
    output_dir: Path, name: str, version: str, members: dict[str, Path | bytes], summary: str
) -> Path:
    """Write ``{name}-{version}-py3-none-any.whl`` holding ``members`` (archive name ->
    file or bytes); return its path.

    The wheel layout is the binary distribution format's (PyPA specification): the
    files, then ``{name}-{version}.dist-info/`` with METADATA (core metadata 2.1),
    WHEEL (``Root-Is-Purelib: true``) and RECORD (each file's sha256 and size).
    """
    dist = f"{name.replace('-', '_')}-{version}"
    contents: dict[str, bytes] = {
        arc: value if isinstance(value, bytes) else value.read_bytes()
        for arc, value in sorted(members.items())
    }
    contents[f"{dist}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n"
    ).encode()
    contents[f"{dist}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: scripts/pack_kvlib.py\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n"
    )
    record = f"{dist}.dist-info/RECORD"
    lines = [f"{arc},{_record_hash(data)},{len(data)}" for arc, data in contents.items()]
    contents[record] = ("\n".join([*lines, f"{record},,"]) + "\n").encode()
    output_dir.mkdir(parents=True, exist_ok=True)
    output = output_dir / f"{dist}-py3-none-any.whl"
    partial = output.with_name(f".{output.name}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for arcname, data in contents.items():
            info = zipfile.ZipInfo(arcname, _ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    partial.replace(output)
    return output


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("output", type=Path, help="the zip to write")
    parser.add_argument(
        "--add",
        type=Path,
        action="append",
        default=[],
        help="a file to put at the top of the zip (repeatable)",
    )
    parser.add_argument(
        "--pyodide-lock",
        type=Path,
        help="Pyodide's pyodide-lock.json: standard-library modules it "
        "leaves out of its core may not be imported",
    )
    args = parser.parse_args(argv)
    missing = pyodide_missing_modules(args.pyodide_lock) if args.pyodide_lock else set()
    try:
        names = pack(args.output, extra=args.add, missing=missing)
    except PackError as exc:
        print(f"pack_kvlib: {exc}", file=sys.stderr)
        return 1
    print(f"pack_kvlib: {len(names)} files, {args.output.stat().st_size:,} bytes -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
