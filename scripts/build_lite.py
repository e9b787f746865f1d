"""Build the exercise notebooks into a JupyterLite site that runs offline in the browser.

JupyterLite (``jupyterlite-core`` with ``jupyterlite-pyodide-kernel``, pinned in
constraints.txt) is JupyterLab without a server: the kernel is Pyodide in a web worker,
files live in the browser's storage. Its kernel would load Pyodide and its packages
from a CDN and PyPI; this build serves every file from the site instead:

1. The contents: the notebooks of ``exercises/`` (``NN_slug/name.ipynb``).
2. Pyodide: the same core the calculator page uses (``_vendor/pyodide``, the npm package
   pinned in package-lock.json), copied to ``lite/static/pyodide``.
3. The kernel's Python packages: the wheels of ``lite/kernel-wheels.txt`` (versions
   and PyPI hashes pinned; ``pip download --require-hashes``), served beside Pyodide,
   each module compiled to Pyodide's bytecode (scripts/pyodide_compile.py) so that the
   kernel does not compile IPython and its closure again at every start; Pyodide's
   standard library zip is served compiled the same way.
   Pyodide's ``pyodide-lock.json`` is cut down to those packages, each entry's
   ``sha256`` rewritten for the file served (Pyodide's lock names its own builds).
   The kernel's own wheels (piplite, pyodide-kernel, its ipykernel stand-in, shipped
   by jupyterlite-pyodide-kernel) and ``comm`` get lock entries too, so that
   ``loadPyodide`` loads all of them at once; ``comm`` is also in the piplite index.
4. kvlib as a pure-Python wheel built from this checkout, and ``kvlib_lite``
   (``lite/py``): the kernel's start-up (the learner's id, a one-line notice for cells
   that need numpy or torch), the browser's "Check your work" (``course.apps.selfcheck``
   with ``course.notebooks.hidden``, run on the assignment data of ``solutions/``, hidden tests
   included: readable in the site, as they are in the repository's ``solutions/``). Both are in
   the lock and loaded when the kernel starts.
5. ``jupyter-lite.json``: the kernel reads the local ``pyodide.mjs``, never falls back
   to PyPI, loads kvlib at start and runs ``kvlib_lite``'s start-up file.
6. The exercise page's own parts (``lite/``, added to ``lab/index.html``): a loading view
   on screen from the first paint that says what is loading and fetches the kernel's
   files (``preload.json``) while JupyterLab starts (``loading.html``, ``loading.js``);
   the student id asked in a dialog of the page and kept in the browser's file storage
   (``student-id.js``); a link opening its notebook and only it (``open-only.js``); old
   check results marked as old (``old-results.js``); the names and roles JupyterLab's
   notebook leaves out for screen readers (``a11y.js``). Each notebook's kernel metadata is
   written as the Pyodide kernel reports it, so that starting the kernel does not
   change the notebook (no unsaved mark at open).

The result is cached in ``_build/lite/site`` and rebuilt only when an input changed
(:func:`fingerprint`). ``python scripts/build_lite.py [OUTPUT] [--exercises DIR]`` builds it alone.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pack_kvlib  # scripts/pack_kvlib.py, beside this file
import pyodide_compile  # scripts/pyodide_compile.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
LITE_SOURCE = ROOT / "lite"
WHEELS_FILE = LITE_SOURCE / "kernel-wheels.txt"
LITE_PY = LITE_SOURCE / "py"
EXERCISES = ROOT / "exercises"
CACHE_DIR = ROOT / "_build" / "lite"
SITE_DIR = CACHE_DIR / "site"
PYODIDE_SOURCE = ROOT / "_vendor" / "pyodide"  # written by build_book.vendor_pyodide
PYODIDE_CORE = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip")
PYODIDE_SUBDIR = "static/pyodide"  # inside the lite site
KERNEL_PLUGIN = "@jupyterlite/pyodide-kernel-extension:kernel"
# Loaded by pip into the piplite index, not into Pyodide's lock: the kernel installs it
# with piplite (jupyterlite-pyodide-kernel's initKernel), whose index comes first.
PIPLITE_ONLY = frozenset({"comm"})
# Loaded with Pyodide itself (loadPyodide's ``packages``), in one parallel batch: the
# kernel's own packages (which it then need not install one by one with piplite), kvlib
# and the browser helpers, there before the first cell.
PRELOAD = ("micropip", "piplite", "ipykernel", "comm", "pyodide-kernel", "jedi", "ipython",
           "kvlib", "kvlib-lite")
APPS = ("lab",)
PAGE_DIR = "static/kvlib"  # the page's own files, inside the lite site
PAGE_STYLE = "page.css"
# Run as soon as read, before JupyterLab starts (see the file).
FIRST_SCRIPT = "open-only.js"
START_APP = "await import("  # how JupyterLite's lab/index.html starts the app
# Run once the page is parsed, in this order (each file says what it does).
PAGE_SCRIPTS = ("loading.js", "student-id.js", "old-results.js", "a11y.js")
LOADING_VIEW = LITE_SOURCE / "loading.html"  # shown from the first paint
PRELOAD_FILE = "preload.json"  # the kernel's files, fetched by loading.js
FINGERPRINT = ".fingerprint"
# Addresses a JupyterLite build must not name: the kernel's default Pyodide and PyPI.
REMOTE = re.compile(r"https?://(?!127\.0\.0\.1|localhost)[\w.-]+\.[a-z]{2,}/", re.IGNORECASE)
BROWSER_SELFCHECK = '''

# --- In the browser (JupyterLite on Pyodide), added by scripts/build_lite.py: nbgrader
# cannot run there, so the notebook's "Check your work" cell runs the same hidden tests
# on the same saved notebook with kvlib_lite.check, which prints with format_report.
from kvlib_lite.check import check_notebook  # noqa: E402,F811
'''


class LiteBuildError(Exception):
    """The lite site cannot be built; the message says what is missing and the fix."""


def _inputs() -> list[Path]:
    files = [Path(__file__), ROOT / "scripts" / "pack_kvlib.py",
             ROOT / "scripts" / "pyodide_compile.py", ROOT / "pyproject.toml",
             ROOT / "course" / "notebooks" / "hidden.py", ROOT / "course" / "apps" / "selfcheck.py",
             ROOT / "package-lock.json"]
    for folder in ("kvlib", "course/checks", "exercises", "solutions", "lite"):
        files += sorted(p for p in (ROOT / folder).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts
                        and ".ipynb_checkpoints" not in p.parts)
    return files


def fingerprint() -> str:
    """SHA-256 over every input's path and bytes, and the jupyterlite versions."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    for package in ("jupyterlite-core", "jupyterlite-pyodide-kernel"):
        digest.update(f"{package}=={version(package)}\n".encode())
    for path in _inputs():
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def pinned_wheels() -> dict[str, tuple[str, str]]:
    """Normalised name -> (version, sha256) from lite/kernel-wheels.txt."""
    pins: dict[str, tuple[str, str]] = {}
    for line in WHEELS_FILE.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([\w.-]+)==([\w.]+)\s+--hash=sha256:([0-9a-f]{64})", line)
        if match is None:
            raise LiteBuildError(f"{WHEELS_FILE.name}: cannot read {line!r}; write "
                                 "NAME==VERSION --hash=sha256:HEX")
        name, pinned_version, sha = match.groups()
        pins[_normalise(name)] = (pinned_version, sha)
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_name(path: Path) -> str:
    return _normalise(path.name.split("-")[0])


def fetch_wheels(python_version: str) -> dict[str, Path]:
    """The pinned wheels, downloaded once into _build/lite/wheels (hashes checked by pip
    on download and here on reuse); normalised name -> file."""
    pins = pinned_wheels()
    folder = CACHE_DIR / "wheels"
    folder.mkdir(parents=True, exist_ok=True)

    def have() -> dict[str, Path]:
        found = {}
        for path in folder.glob("*.whl"):
            name = _wheel_name(path)
            if name in pins and _sha256(path) == pins[name][1]:
                found[name] = path
        return found

    if set(have()) != set(pins):
        # The wheels are pure Python for any interpreter; pip filters by this machine's
        # Python unless told the kernel's (Pyodide's CPython).
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                   "--only-binary=:all:", "--python-version", python_version,
                   "--require-hashes", "-r", str(WHEELS_FILE), "-d", str(folder)]
        if subprocess.run(command, check=False).returncode != 0:
            raise LiteBuildError("pip could not download the kernel's wheels from PyPI "
                                 f"({WHEELS_FILE.relative_to(ROOT)}); check the network "
                                 "and the pinned hashes")
    found = have()
    missing = sorted(set(pins) - set(found))
    if missing:
        raise LiteBuildError(f"wheels missing or with a wrong sha256: {', '.join(missing)}")
    return found


def compiled_python(wheels: dict[str, Path], pyodide_dir: Path) -> tuple[dict[str, Path], Path]:
    """The wheels and Pyodide's standard library zip with their modules compiled by
    Pyodide's CPython (scripts/pyodide_compile.py): name -> compiled wheel, and the
    compiled zip. Kept in _build/lite/compiled/KEY, compiled again only when a wheel,
    Pyodide or the compiler changed."""
    digest = hashlib.sha256()
    inputs = [*sorted(wheels.values()), pyodide_dir / "pyodide.asm.wasm",
              pyodide_dir / pyodide_compile.STDLIB_ZIP, Path(pyodide_compile.__file__)]
    for path in inputs:
        digest.update(path.name.encode() + b"\0" + _sha256(path).encode() + b"\n")
    folder = CACHE_DIR / "compiled" / digest.hexdigest()[:16]
    if not folder.is_dir():
        shutil.rmtree(CACHE_DIR / "compiled", ignore_errors=True)
        partial = folder.with_name(folder.name + ".partial")
        try:
            pyodide_compile.compile_wheels(sorted(wheels.values()), pyodide_dir, partial,
                                           stdlib=True)
        except pyodide_compile.CompileError as exc:
            raise LiteBuildError(str(exc)) from None
        partial.rename(folder)  # whole or absent: a build stopped half-way compiles again
    compiled = {name: folder / path.name for name, path in wheels.items()}
    return compiled, folder / pyodide_compile.STDLIB_ZIP


def kvlib_version() -> str:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return str(project["version"])


def build_wheels(folder: Path) -> dict[str, Path]:
    """kvlib and kvlib_lite as wheels in ``folder``; name -> file."""
    version = kvlib_version()
    kvlib = pack_kvlib.write_wheel(
        folder, "kvlib", version, dict(pack_kvlib.package_files(ROOT / "kvlib")),
        "kvlib for the course's exercises in the browser (pure Python)",
    )
    members: dict[str, Path | bytes] = dict(pack_kvlib.package_files(LITE_PY / "kvlib_lite"))
    from kvlib_lite.check import assignment_data  # lite/py, on sys.path during build()

    data = json.dumps(assignment_data(ROOT), indent=1, sort_keys=True).encode()
    members["kvlib_lite/assignments.json"] = data
    # The course package as the browser has it: the answer checks, the hidden tests'
    # reader and the self-check, each subpackage's __init__ as in the checkout
    # (docstrings only), so an import resolves as it does in Lab.
    for sub in ("", "checks/", "notebooks/", "apps/"):
        members[f"course/{sub}__init__.py"] = ROOT / "course" / sub / "__init__.py"
    for name in ("configs", "draw", "slips"):
        members[f"course/checks/{name}.py"] = ROOT / "course" / "checks" / f"{name}.py"
    members["course/notebooks/hidden.py"] = ROOT / "course" / "notebooks" / "hidden.py"
    members["course/apps/selfcheck.py"] = (
        (ROOT / "course" / "apps" / "selfcheck.py").read_bytes() + BROWSER_SELFCHECK.encode()
    )
    lite = pack_kvlib.write_wheel(folder, "kvlib-lite", version, members,
                                  "kvlib's exercise notebooks in JupyterLite")
    return {"kvlib": kvlib, "kvlib-lite": lite}


def lock_entry(path: Path, imports: list[str], depends: list[str]) -> dict[str, Any]:
    """A pyodide-lock.json entry for a pure-Python wheel served beside the lock."""
    name, version = path.name.split("-")[:2]
    return {
        "name": _normalise(name), "version": version, "file_name": path.name,
        "install_dir": "site", "sha256": _sha256(path), "package_type": "package",
        "imports": imports, "depends": depends, "unvendored_tests": False,
    }


def write_lock(source_lock: Path, served: dict[str, Path],
               extra: dict[str, tuple[Path, list[str], list[str]]], output: Path
               ) -> list[str]:
    """Pyodide's lock cut down to the served packages, each sha256 the served file's,
    plus ``extra`` packages (name -> wheel, imports, dependencies)."""
    lock = json.loads(source_lock.read_text(encoding="utf-8"))
    packages = {}
    for key, entry in lock["packages"].items():
        name = _normalise(key)
        if name not in served:
            continue
        path = served[name]
        if _wheel_name(path) != name or f"-{entry['version']}-" not in path.name:
            raise LiteBuildError(f"Pyodide's lock names {key} {entry['version']} but "
                                 f"{WHEELS_FILE.name} pins {path.name}: pin the lock's version")
        packages[key] = {**entry, "file_name": path.name, "sha256": _sha256(path)}
    missing = sorted(set(served) - {_normalise(k) for k in packages})
    if missing:
        raise LiteBuildError(f"Pyodide's lock has no entry for {', '.join(missing)}")
    for name, (path, imports, depends) in extra.items():
        packages[name] = lock_entry(path, imports, depends)
    known = {_normalise(k) for k in packages}
    for key, entry in packages.items():
        for dep in entry["depends"]:
            if _normalise(dep) not in known:
                raise LiteBuildError(f"{key} depends on {dep}, which the site does not serve")
    lock["packages"] = packages
    output.write_text(json.dumps(lock, indent=1, sort_keys=True), encoding="utf-8")
    return sorted(packages)


def kernel_settings(python: str) -> dict[str, Any]:
    """The kernel's settings in jupyter-lite.json (relative to the lite site's root)."""
    startup = f"/lib/python{python}/site-packages/kvlib_lite/ipython_startup.py"
    return {
        "pyodideUrl": f"./{PYODIDE_SUBDIR}/pyodide.mjs",
        "disablePyPIFallback": True,
        "loadPyodideOptions": {"packages": list(PRELOAD), "env": {"PYTHONSTARTUP": startup}},
    }


def _extension_dir() -> Path:
    base = Path(sys.prefix) / "share" / "jupyter" / "labextensions"
    path = base / "@jupyterlite" / "pyodide-kernel-extension"
    if not (path / "package.json").is_file():
        raise LiteBuildError(f"{path} is missing: install jupyterlite-pyodide-kernel "
                             "(make book installs requirements.txt)")
    return path


def preload_list(site: Path, lock: Path) -> list[dict[str, Any]]:
    """The files the kernel's worker fetches, in the order it needs them, with their
    sizes: Pyodide's core, its lock, then every package of the lock (all are loaded at
    start, :data:`PRELOAD`). Addresses relative to the page's folder (:data:`PAGE_DIR`)."""
    pyodide = site / PYODIDE_SUBDIR
    names = [*PYODIDE_CORE, lock.name]
    packages = json.loads(lock.read_text(encoding="utf-8"))["packages"]
    names += sorted((entry["file_name"] for entry in packages.values()),
                    key=lambda name: -(pyodide / name).stat().st_size)
    prefix = Path(PYODIDE_SUBDIR).relative_to(Path(PAGE_DIR).parent).as_posix()
    return [{"url": f"../{prefix}/{name}", "bytes": (pyodide / name).stat().st_size}
            for name in names]


def add_page_parts(site: Path, preload: list[dict[str, Any]]) -> None:
    """Serve the page's own files and add them to each app's page (JupyterLab's): the
    style sheet and the first script right after ``<head>``, the loading view right
    after ``<body ...>``, the other scripts deferred."""
    folder = site / PAGE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name in (PAGE_STYLE, FIRST_SCRIPT, *PAGE_SCRIPTS):
        shutil.copyfile(LITE_SOURCE / name, folder / name)
    (folder / PRELOAD_FILE).write_text(json.dumps(preload, indent=1), encoding="utf-8")
    download_mib = sum(item["bytes"] for item in preload) / 2**20
    view = LOADING_VIEW.read_text(encoding="utf-8").replace(
        "{download_mib}", f"{download_mib:.0f}")
    href = f"../{PAGE_DIR}"
    head = "".join([
        f'<head>\n<link rel="stylesheet" href="{href}/{PAGE_STYLE}">\n',
        f'<script src="{href}/{FIRST_SCRIPT}"></script>\n',
        *(f'<script defer src="{href}/{name}"></script>\n' for name in PAGE_SCRIPTS),
    ])
    for app in APPS:
        page = site / app / "index.html"
        html = page.read_text(encoding="utf-8")
        body = re.search(r"<body[^>]*>", html)
        if html.count("<head>") != 1 or body is None:
            raise LiteBuildError(f"{page}: expected one <head> and a <body> to add the "
                                 "page's loading view and scripts")
        html = html[:body.end()] + "\n" + view + html[body.end():]
        # The page's language, for screen readers (JupyterLite's page names none).
        html = re.sub(r"<html(?![^>]*\blang=)", '<html lang="en"', html, count=1)
        # JupyterLite's page starts the app with one dynamic import: it waits for
        # open-only.js first (see the file).
        if html.count(START_APP) != 1:
            raise LiteBuildError(f"{page}: expected one {START_APP.strip()!r} to make the "
                                 "app's start wait for open-only.js")
        html = html.replace(START_APP, f"await window.kvlibOpenOnly;\n        {START_APP}")
        page.write_text(html.replace("<head>", head), encoding="utf-8")


# The kernel's metadata as the Pyodide kernel extension reports it (its kernelspec, and
# its kernel_info reply's language_info): JupyterLab writes both into a notebook when its
# kernel starts, and a notebook that held other values is then modified before any edit.
KERNEL_SPEC = re.compile(r'spec:\{(name:"[^"]+",display_name:"[^"]+",language:"[^"]+")')
LANGUAGE_INFO = re.compile(r"language_info:(\{codemirror_mode:\{[^{}]*\}[^{}]*\})")


def _js_object(literal: str) -> dict[str, Any]:
    """A flat JavaScript object literal of strings and numbers as a dict."""
    value: dict[str, Any] = json.loads(re.sub(r"([{,])(\w+):", r'\1"\2":', literal))
    return value


def kernel_metadata() -> dict[str, Any]:
    """``kernelspec`` and ``language_info`` as the site's kernel sets them."""
    found: dict[str, Any] = {}
    for path in sorted((_extension_dir() / "static").glob("*.js")):
        text = path.read_text(encoding="utf-8")
        if (spec := KERNEL_SPEC.search(text)) and "kernelspec" not in found:
            found["kernelspec"] = _js_object("{" + spec.group(1) + "}")
        if (info := LANGUAGE_INFO.search(text)) and "language_info" not in found:
            found["language_info"] = _js_object(info.group(1))
    if set(found) != {"kernelspec", "language_info"}:
        raise LiteBuildError("the Pyodide kernel extension no longer names its kernelspec "
                             "and language_info where build_lite.py looks for them: check "
                             "the extension's version")
    return found


def copy_notebook(source: Path, target: Path, metadata: dict[str, Any]) -> None:
    """Copy a released notebook, its kernel metadata the site's kernel's."""
    nb = json.loads(source.read_text(encoding="utf-8"))
    nb["metadata"] = {**nb.get("metadata", {}), **metadata}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# The kernel extension falls back to Pyodide on a CDN when the settings name no
# pyodideUrl. The settings always name the site's copy; the fallback is rewritten to the
# same address too, so that no file the site serves names a host beyond it.
CDN_PYODIDE = re.compile(r"https://cdn\.jsdelivr\.net/pyodide/v[\w.]+/full/pyodide\.mjs")


def localise_fallbacks(site: Path) -> int:
    """Replace the kernel extension's CDN Pyodide address by the site's; files changed."""
    changed = 0
    for path in sorted((site / "extensions").rglob("*")):
        if path.suffix not in {".js", ".json"} or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        local, count = CDN_PYODIDE.subn(f"./{PYODIDE_SUBDIR}/pyodide.mjs", text)
        if count:
            path.write_text(local, encoding="utf-8")
            changed += 1
    return changed


def remote_addresses(site: Path) -> list[str]:
    """Remote addresses in the settings the site's pages read (jupyter-lite.json files)."""
    found = []
    for path in sorted(site.rglob("jupyter-lite.json")):
        for match in REMOTE.finditer(path.read_text(encoding="utf-8")):
            found.append(f"{path.relative_to(site)}: {match.group(0)}")
    return found


def build(output: Path = SITE_DIR, pyodide_dir: Path = PYODIDE_SOURCE,
          exercises: Path = EXERCISES) -> Path:
    """Build the lite site into ``output`` unless it is current; return ``output``.

    ``exercises``: the released notebooks (``NN_slug/name.ipynb``) to serve.
    """
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # One build at a time (the book build and the site tests may ask at once).
    with open(CACHE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _build_locked(output, pyodide_dir, exercises)
    return output


def _build_locked(output: Path, pyodide_dir: Path, exercises: Path) -> None:
    wanted = fingerprint() + f"\n{exercises.resolve()}"
    stamp = output / FINGERPRINT
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    start = time.perf_counter()
    source_lock = pyodide_dir / "pyodide-lock.json"
    if not source_lock.is_file():
        raise LiteBuildError(f"{source_lock} is missing: build_book.py copies Pyodide first")
    info = json.loads(source_lock.read_text(encoding="utf-8"))["info"]
    python = ".".join(str(info["python"]).split(".")[:2])
    # Compiled once here, not at every start of the learner's kernel (pyodide_compile.py).
    wheels, stdlib = compiled_python(fetch_wheels(python), pyodide_dir)
    sys.path.insert(0, str(LITE_PY))
    try:
        with tempfile.TemporaryDirectory(prefix="kvlib-lite-") as tmp_name:
            tmp = Path(tmp_name)
            extra = build_wheels(tmp / "wheels")
            _build_site(tmp, wheels, extra, pyodide_dir, stdlib, python, exercises)
            site = tmp / "site"
            stale = output.with_name(f".{output.name}.old")
            shutil.rmtree(stale, ignore_errors=True)
            if output.exists():
                output.rename(stale)
            output.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(site, output)
            shutil.rmtree(stale, ignore_errors=True)
    finally:
        sys.path.remove(str(LITE_PY))
    stamp.write_text(wanted)
    print(f"build_lite: built {output.relative_to(ROOT) if output.is_relative_to(ROOT) else output}"
          f" in {time.perf_counter() - start:.1f} s")


def _build_site(tmp: Path, wheels: dict[str, Path], extra: dict[str, Path],
                pyodide_dir: Path, stdlib: Path, python: str, exercises: Path) -> None:
    contents = tmp / "contents"
    metadata = kernel_metadata()
    for notebook in sorted(exercises.glob("*/*.ipynb")):
        copy_notebook(notebook, contents / notebook.parent.name / notebook.name, metadata)
    if not contents.is_dir():
        raise LiteBuildError("exercises/ has no notebooks: run `make release` first")
    site = tmp / "site"
    lite_dir = tmp / "lite-dir"
    lite_dir.mkdir()
    piplite = [str(wheels[name]) for name in sorted(PIPLITE_ONLY)]
    command = [
        sys.executable, "-m", "jupyterlite_core", "build",
        "--lite-dir", str(lite_dir), "--contents", str(contents), "--output-dir", str(site),
        "--no-sourcemaps", "--no-unused-shared-packages", "--ignore-sys-prefix",
        f"--LiteBuildConfig.federated_extensions={_extension_dir()}",
        *[f"--apps={app}" for app in APPS],
        *[f"--piplite-wheels={path}" for path in piplite],
    ]
    done = subprocess.run(command, cwd=lite_dir, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LiteBuildError(
            f"jupyter lite build failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    pyodide = site / PYODIDE_SUBDIR
    pyodide.mkdir(parents=True)
    for name in PYODIDE_CORE:
        shutil.copyfile(stdlib if name == stdlib.name else pyodide_dir / name, pyodide / name)
    served = {name: path for name, path in wheels.items() if name not in PIPLITE_ONLY}
    kernel_pypi = site / "extensions" / "@jupyterlite" / "pyodide-kernel-extension" / "static"
    kernel_wheel = {_wheel_name(p): p for p in (kernel_pypi / "pypi").glob("*.whl")}
    # The kernel's own packages go in the lock too, so loadPyodide fetches everything in
    # one parallel batch instead of piplite installing them one after the other.
    packages = {
        "kvlib": (extra["kvlib"], ["kvlib"], []),
        "kvlib-lite": (extra["kvlib-lite"], ["kvlib_lite", "course"], ["kvlib"]),
        "comm": (wheels["comm"], ["comm"], []),
        "piplite": (kernel_wheel["piplite"], ["piplite"], ["micropip"]),
        "pyodide-kernel": (kernel_wheel["pyodide-kernel"], ["pyodide_kernel"],
                           ["comm", "ipython"]),
        "ipykernel": (kernel_wheel["ipykernel"], ["ipykernel"], ["pyodide-kernel"]),
    }
    for path in [*served.values(), *(path for path, _, _ in packages.values())]:
        shutil.copyfile(path, pyodide / path.name)
    write_lock(pyodide_dir / "pyodide-lock.json", served, packages,
               pyodide / "pyodide-lock.json")
    add_page_parts(site, preload_list(site, pyodide / "pyodide-lock.json"))
    if not localise_fallbacks(site):
        raise LiteBuildError("the Pyodide kernel no longer names its CDN fallback where "
                             "build_lite.py looks for it: check the extension's version")
    config_path = site / "jupyter-lite.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    # window.jupyterapp: the site's browser test and benchmark drive the app through it.
    config["jupyter-config-data"]["exposeAppInBrowser"] = True
    settings = config["jupyter-config-data"].setdefault("litePluginSettings", {})
    settings[KERNEL_PLUGIN] = {**settings.get(KERNEL_PLUGIN, {}), **kernel_settings(python)}
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    remote = remote_addresses(site)
    if remote:
        raise LiteBuildError("the lite site names remote addresses:\n  " + "\n  ".join(remote))


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("output", type=Path, nargs="?", default=SITE_DIR)
    parser.add_argument("--exercises", type=Path, default=EXERCISES,
                        help="released notebooks to serve (default: exercises/)")
    args = parser.parse_args(argv)
    try:
        build(args.output.resolve(), exercises=args.exercises)
    except LiteBuildError as err:
        print(f"build_lite: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
