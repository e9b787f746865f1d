"""Build the course site into _build/html, offline, with every warning an error.

Steps:
1. Copy MathJax 3 (the ``es5`` bundle and its woff-v2 fonts) from the installed
   ``django-static-mathjax`` package into ``_vendor/mathjax`` (git-ignored). The
   book's ``_config.yml`` adds ``_vendor`` to ``html_static_path`` and points
   ``mathjax_path`` at ``mathjax/tex-mml-chtml.js``, so pages load
   ``_static/mathjax/tex-mml-chtml.js`` instead of a CDN.
2. The calculator page runs kvlib in the browser on Pyodide: install the npm package
   ``pyodide`` pinned in package.json / package-lock.json (``npm ci``, only when the
   lock changed), copy its core (loader, wasm, standard library, lock file) into
   ``_vendor/pyodide``, the page's script and style into ``_vendor/calculator``, and
   pack the kvlib modules ``kvlib size`` imports (scripts/pack_kvlib.py) into
   ``_vendor/calculator/kvlib.zip``. Nothing is fetched from a CDN at run time.
   Then build the exercise notebooks into a JupyterLite site (scripts/build_lite.py,
   cached in ``_build/lite/site``), copied to ``lite/`` of the built site after Sphinx.
3. If the code or data the pages run changed since the last build (kvlib, course,
   ``book/**/data/``: :func:`code_fingerprint`), drop the execution cache and rebuild
   every page: the cache is keyed on a notebook's code only, and a number printed by
   the book must never come from an old kvlib.
4. Run ``jupyter-book build . --builder html -W -n --keep-going``: any Sphinx
   warning, broken reference or failing cell makes the build fail. Each page runs in
   its own kernel, forked from a server that imported ipykernel, and numpy, matplotlib
   and torch where the pages import them, once (``course.book.kernel_server``; the
   build's ``python3`` kernel spec).
5. Name the sidebar's section toggles (:func:`label_section_toggles`), then scan the
   HTML for remote script, stylesheet or font addresses: the site must
   read offline; check that every file the calculator page loads was built.

Usage: ``python scripts/build_book.py [--all] [--source DIR] [--chapter NN_slug]``.
``--chapter`` builds the front pages, chapter 1 and that one chapter into
``_build/chapters/NN_slug`` (its own execution cache), to check a chapter
without building the whole site. Exit status 0 on success, non-zero on any
warning, failing cell or remote asset.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import build_lite  # scripts/build_lite.py, beside this file
import pack_kvlib  # scripts/pack_kvlib.py, beside this file
from measure_pages import toc_docnames  # scripts/measure_pages.py, beside this file

from course.book import kernel_server

ROOT = Path(__file__).resolve().parent.parent
VENDOR_DIR = ROOT / "_vendor"
MATHJAX_DIR = VENDOR_DIR / "mathjax"
KVLIB_STAMP_NAME = ".kvlib_sources.sha256"
MATHJAX_ENTRY = "tex-mml-chtml.js"
NODE_MODULES = ROOT / "node_modules"
PYODIDE_PACKAGE = NODE_MODULES / "pyodide"
PYODIDE_DIR = VENDOR_DIR / "pyodide"
# Pyodide's core as the page loads it: the ES-module loader, the Emscripten glue, the
# interpreter, the standard library, and the lock file the loader reads at start.
PYODIDE_CORE = (
    "pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json",
)
# The loader's default package address for Node.js (a CDN); browsers use packageBaseUrl.
PYODIDE_NODE_CDN = re.compile(r"https://cdn\.jsdelivr\.net/pyodide/v\$\{[\w$]+\}/full/")
CALCULATOR_SOURCE = ROOT / "book" / "calculator_assets"
CALCULATOR_DIR = VENDOR_DIR / "calculator"
CALCULATOR_GLUE = "kvcalc.py"  # packed into kvlib.zip beside kvlib
CALCULATOR_PAGE = "book/calculator.html"
LITE_DIR_NAME = "lite"  # the exercises in JupyterLite: _build/html/lite (build_lite.py)
MPL_STYLE = ROOT / "book" / "course.mplstyle"  # the figures' palette: every kernel reads it

# Hosts the default Sphinx/Jupyter Book templates would load assets from.
CDN_PATTERN = re.compile(
    r"cdn\.jsdelivr\.net|unpkg\.com|cdnjs\.cloudflare\.com|fonts\.googleapis\.com"
    r"|fonts\.gstatic\.com|polyfill\.io|mathjax\.org"
)
# A remote address in an attribute that makes the browser fetch it (not a plain link).
REMOTE_ASSET_PATTERN = re.compile(
    r"<(?:script|img|iframe|source)\b[^>]*\bsrc=[\"']?(?:https?:)?//"
    r"|<link\b[^>]*\brel=[\"']?(?:stylesheet|preload|modulepreload|icon)[^>]*"
    r"\bhref=[\"']?(?:https?:)?//",
    re.IGNORECASE,
)


def mathjax_source() -> Path:
    """Directory of the MathJax 3 ``es5`` bundle shipped by django-static-mathjax."""
    try:
        import mathjax  # the module installed by django-static-mathjax
    except ImportError as exc:
        raise SystemExit(
            "build_book: the 'django-static-mathjax' package is not installed in this "
            "Python; run `make book` (it installs requirements.txt) or "
            "`pip install -c constraints.txt django-static-mathjax`."
        ) from exc
    source = Path(mathjax.__file__).resolve().parent / "static" / "mathjax" / "es5"
    if not (source / MATHJAX_ENTRY).is_file():
        raise SystemExit(f"build_book: {source / MATHJAX_ENTRY} is missing; reinstall "
                         "django-static-mathjax.")
    return source


def vendor_mathjax() -> None:
    """Copy MathJax into _vendor/mathjax unless the same version is already there."""
    source = mathjax_source()
    stamp = MATHJAX_DIR / ".source"
    wanted = f"{source}\n{(source / MATHJAX_ENTRY).stat().st_size}\n"
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    if MATHJAX_DIR.exists():
        shutil.rmtree(MATHJAX_DIR)
    # The whole bundle is copied: the page loads tex-mml-chtml.js, which fetches its
    # fonts and, from the accessibility menu, further components on demand.
    shutil.copytree(source, MATHJAX_DIR)
    stamp.write_text(wanted)
    print(f"build_book: copied MathJax from {source} to {MATHJAX_DIR.relative_to(ROOT)}")


@contextmanager
def vendor_lock() -> Iterator[None]:
    """Serialise the npm install and copies between builds running at the same time."""
    VENDOR_DIR.mkdir(exist_ok=True)
    with open(VENDOR_DIR / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def npm_install() -> None:
    """``npm ci`` the packages of package-lock.json unless exactly those are installed."""
    lock = ROOT / "package-lock.json"
    stamp = NODE_MODULES / ".installed-lock.sha256"
    wanted = hashlib.sha256(lock.read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text() == wanted and PYODIDE_PACKAGE.is_dir():
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit(
            "build_book: npm is not installed. The calculator page runs kvlib on Pyodide, "
            "which comes from the npm package pinned in package.json; install Node.js and "
            "npm (Debian: apt-get install nodejs npm), then build again."
        )
    # --ignore-scripts: nothing needed here runs install scripts, so none may run.
    command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
    if subprocess.run(command, cwd=ROOT, check=False).returncode != 0:
        raise SystemExit("build_book: `npm ci` failed (see above); the site needs Pyodide")
    stamp.write_text(wanted)


def vendor_pyodide() -> None:
    """Copy Pyodide's core into _vendor/pyodide unless the same version is already there.

    The loader names a CDN as its default package address under Node.js (it fetches no
    package in a browser, where the page passes its own ``packageBaseUrl``); that
    address is blanked in the copy so the built site names no CDN anywhere.
    """
    version = json.loads((PYODIDE_PACKAGE / "package.json").read_text())["version"]
    sizes = [(PYODIDE_PACKAGE / name).stat().st_size for name in PYODIDE_CORE]
    wanted = f"pyodide {version}\n{sizes}\n"
    stamp = PYODIDE_DIR / ".source"
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    staging = VENDOR_DIR / ".pyodide.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in PYODIDE_CORE:
        shutil.copyfile(PYODIDE_PACKAGE / name, staging / name)
    loader = staging / "pyodide.mjs"
    text, count = PYODIDE_NODE_CDN.subn("", loader.read_text(encoding="utf-8"))
    if count != 1:
        raise SystemExit(f"build_book: expected one CDN default in {loader.name} of Pyodide "
                         f"{version}, found {count}; check the copy before changing the pin")
    loader.write_text(text, encoding="utf-8")
    for name in PYODIDE_CORE:
        if name.endswith((".js", ".mjs", ".json")):
            found = CDN_PATTERN.search((staging / name).read_text(encoding="utf-8"))
            if found:
                raise SystemExit(f"build_book: Pyodide's {name} names {found.group(0)}")
    (staging / ".source").write_text(wanted)
    shutil.rmtree(PYODIDE_DIR, ignore_errors=True)
    staging.rename(PYODIDE_DIR)
    print(f"build_book: copied Pyodide {version} core to {PYODIDE_DIR.relative_to(ROOT)}")


def vendor_calculator() -> None:
    """Pyodide, the calculator page's script and style, and kvlib packed for the page."""
    with vendor_lock():
        npm_install()
        vendor_pyodide()
        CALCULATOR_DIR.mkdir(parents=True, exist_ok=True)
        for source in sorted(CALCULATOR_SOURCE.glob("*")):
            if source.suffix in {".js", ".css"}:
                shutil.copyfile(source, CALCULATOR_DIR / source.name)
        missing = pack_kvlib.pyodide_missing_modules(PYODIDE_DIR / "pyodide-lock.json")
        glue = CALCULATOR_SOURCE / CALCULATOR_GLUE
        try:
            pack_kvlib.pack(CALCULATOR_DIR / "kvlib.zip", extra=[glue], missing=missing)
        except pack_kvlib.PackError as exc:
            raise SystemExit(f"build_book: cannot pack kvlib for the calculator: {exc}") from None


def calculator_problems(html_dir: Path) -> list[str]:
    """Files the calculator page loads that the built site lacks (none if no such page)."""
    if not (html_dir / CALCULATOR_PAGE).is_file():
        return []
    static = html_dir / "_static"
    wanted = [static / "pyodide" / name for name in PYODIDE_CORE] + [
        static / "calculator" / name for name in ("calculator.js", "calculator.css", "kvlib.zip")
    ]
    return [str(path.relative_to(html_dir)) for path in wanted if not path.is_file()]


def warm_matplotlib() -> None:
    """Build matplotlib's font cache now, not inside a page: its first-run notice goes to
    stderr, which the book treats as a warning (execute.stderr_output: warn)."""
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True)


def code_fingerprint() -> str:
    """SHA-256 over what the pages run and read, paths and contents: the Python sources of
    kvlib and course (pages import both) with kvlib's bundled JSON, every data file under
    ``book/`` (a chapter's ``data/``, the GPU runs in ``book/data/``) and the GPU check the
    runs page reads its plan from, and the figures' style. Sphinx tracks only the pages."""
    digest = hashlib.sha256()
    code = (p for name in ("kvlib", "course") for p in (ROOT / name).rglob("*"))
    files = sorted(p for p in code if p.suffix in {".py", ".json"})
    files += sorted(p for p in (ROOT / "book").rglob("*")
                    if p.is_file() and "data" in p.relative_to(ROOT / "book").parts[:-1])
    files.append(ROOT / "scripts" / "gpu_check.py")
    files.append(MPL_STYLE)
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def code_changed(stamp: Path) -> bool:
    """True when that code differs from the code the cached notebook outputs came from."""
    return not stamp.is_file() or stamp.read_text() != code_fingerprint()


def remote_assets(html_dir: Path) -> list[str]:
    """Every `file: match` where built HTML names a CDN or loads a remote asset."""
    problems = []
    for page in sorted(html_dir.rglob("*.html")):
        text = page.read_text(encoding="utf-8", errors="replace")
        for pattern in (CDN_PATTERN, REMOTE_ASSET_PATTERN):
            for match in pattern.finditer(text):
                problems.append(f"{page.relative_to(html_dir)}: {match.group(0)[:120]}")
    return problems


# jupyter-book's CLI has no --jobs; Sphinx reads (and myst-nb executes) pages in
# parallel processes when build_sphinx is given jobs > 1. The parallel readers are
# forked from this process, so the kernels they start get provision_curve_keys
# (course.book.kernel_keys) too.
_PARALLEL_CLI = """
import sys
import jupyter_book.sphinx as sphinx_module
jobs = int(sys.argv.pop(1))
from course.book.kernel_keys import provision_curve_keys
provision_curve_keys()
original = sphinx_module.build_sphinx
def build_sphinx(*args, **kwargs):
    kwargs["jobs"] = jobs
    return original(*args, **kwargs)
sphinx_module.build_sphinx = build_sphinx
# Two extensions jupyter-book loads do not declare parallel safety, which would make
# Sphinx read serially (and warn): sphinx_multitoc_numbering renumbers sections
# after reading, in the main process; sphinx_jupyterbook_latex acts on LaTeX builds.
from sphinx.application import Sphinx
is_parallel_allowed = Sphinx.is_parallel_allowed
def allowed(self, typ):
    for name in ("sphinx_multitoc_numbering", "sphinx_jupyterbook_latex"):
        extension = self.extensions.get(name)
        if extension is not None and extension.parallel_read_safe is None:
            extension.parallel_read_safe = True
            extension.parallel_write_safe = True
    return is_parallel_allowed(self, typ)
Sphinx.is_parallel_allowed = allowed
sys.argv[0] = "jupyter-book"
from jupyter_book.cli.main import main
main()
"""


def build_jobs() -> int:
    """Parallel Sphinx readers: ``$KVLIB_BOOK_JOBS``, else one per CPU core."""
    value = os.environ.get("KVLIB_BOOK_JOBS", "")
    return int(value) if value.isdecimal() and int(value) > 0 else (os.cpu_count() or 1)


def jupyter_book_command(
    source: Path,
    rebuild_all: bool,
    output: Path | None = None,
    toc: Path | None = None,
    config: Path | None = None,
) -> list[str]:
    """The jupyter-book CLI of this Python environment, with warnings as errors."""
    command = [sys.executable, "-c", _PARALLEL_CLI, str(build_jobs())]
    command += ["build", str(source), "--builder", "html", "-W", "-n", "--keep-going"]
    if output is not None:
        command += ["--path-output", str(output)]
    if toc is not None:
        command += ["--toc", str(toc)]
    if config is not None:
        command += ["--config", str(config)]
    if rebuild_all:
        command.append("--all")
    return command


def chapter_config(source: Path, output: Path) -> Path:
    """The book's _config.yml, where a link to a page this build leaves out is no warning.

    Pages link across chapters; a one-chapter build omits the others, so only the
    full build (which keeps every warning) checks those links.
    """
    import yaml

    config = yaml.safe_load((source / "_config.yml").read_text(encoding="utf-8"))
    sphinx = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx["suppress_warnings"] = [*sphinx.get("suppress_warnings", []), "myst.xref_missing",
                                   "ref.doc"]
    output.mkdir(parents=True, exist_ok=True)
    path = output / "_config.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def page_sources(source: Path, toc: Path) -> list[str]:
    """The MyST text of every page ``toc`` names (a page it names that is missing is
    Sphinx's to report)."""
    pages = [source / f"{name}.md" for name in toc_docnames(toc.read_text(encoding="utf-8"))]
    return [page.read_text(encoding="utf-8") for page in pages if page.is_file()]


def chapter_toc(source: Path, chapter: str, output: Path) -> Path:
    """A table of contents with the front pages, chapter 1 and ``chapter`` only."""
    import yaml

    toc = yaml.safe_load((source / "_toc.yml").read_text(encoding="utf-8"))
    wanted = {"book/01_kv_cache/overview", f"book/{chapter}/overview"}
    for part in toc.get("parts", []):
        part["chapters"] = [
            entry for entry in part.get("chapters", [])
            if "/overview" not in str(entry.get("file", "")) or entry["file"] in wanted
        ]
    if not any(e.get("file") == f"book/{chapter}/overview"
               for part in toc["parts"] for e in part["chapters"]):
        raise SystemExit(f"build_book: _toc.yml has no chapter book/{chapter}/overview")
    toc["parts"] = [part for part in toc["parts"] if part["chapters"]]
    output.mkdir(parents=True, exist_ok=True)
    path = output / "_toc.yml"
    path.write_text(yaml.safe_dump(toc, sort_keys=False), encoding="utf-8")
    return path


# The theme's sidebar opens a chapter's sections with a <summary> that holds only an
# icon, which a screen reader announces with no name (axe-core's "summary-name", serious).
SECTION_TOGGLE = re.compile(
    r'(<a class="(?:current )?reference internal" href="[^"]*">)([^<]+)'
    r'(</a><details(?: open="open")?>)<summary>'
)


def label_section_toggles(html_dir: Path) -> int:
    """Give each sidebar toggle its chapter's title as a name; returns the pages changed.
    Idempotent (a named toggle no longer matches), so a no-op rebuild changes nothing."""
    changed = 0
    for page in html_dir.rglob("*.html"):
        if page.relative_to(html_dir).parts[0] == LITE_DIR_NAME:
            continue  # JupyterLite's own pages
        text = page.read_text(encoding="utf-8")
        named = SECTION_TOGGLE.sub(
            lambda m: f'{m[1]}{m[2]}{m[3]}<summary aria-label="{m[2]}: show or hide its '
            'sections">', text)
        if named != text:
            page.write_text(named, encoding="utf-8")
            changed += 1
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="re-read every page")
    parser.add_argument("--source", type=Path, default=ROOT,
                        help="book folder holding _config.yml and _toc.yml (default: repo root)")
    parser.add_argument("--chapter", help="build only this chapter (e.g. 02_paging) "
                        "into _build/chapters/<chapter>")
    args = parser.parse_args(argv)
    source = args.source.resolve()
    output: Path | None = None
    toc: Path | None = None
    config: Path | None = None
    build_dir = source / "_build"
    if args.chapter:
        output = source / "_build" / "chapters" / args.chapter
        toc = chapter_toc(source, args.chapter, output)
        config = chapter_config(source, output)
        build_dir = output / "_build"
    html_dir = build_dir / "html"
    stamp = build_dir / KVLIB_STAMP_NAME

    start = time.perf_counter()
    vendor_mathjax()
    vendor_calculator()
    try:
        with vendor_lock():
            lite_site = build_lite.build()
    except build_lite.LiteBuildError as exc:
        raise SystemExit(f"build_book: cannot build the exercises' JupyterLite: {exc}") from None
    warm_matplotlib()
    rebuild_all = args.all
    if code_changed(stamp):
        jupyter_cache = build_dir / ".jupyter_cache"
        if jupyter_cache.exists():
            print("build_book: the code the pages run changed; re-executing every page")
            shutil.rmtree(jupyter_cache)
        rebuild_all = True

    # Pages import kvlib from this checkout even where it is not pip-installed.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # Every page's kernel draws with the book's accessible palette (book/course.mplstyle).
    env["MATPLOTLIBRC"] = str(MPL_STYLE)
    # The pages' kernels fork from one server that imported what they all import.
    kernel_spec = kernel_server.write_kernel_spec(build_dir / ".kernels")
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(kernel_spec),
                                                        env.get("JUPYTER_PATH")]))
    command = jupyter_book_command(source, rebuild_all, output, toc, config)
    pages = page_sources(source, toc or source / "_toc.yml")
    with kernel_server.running_server(env, kernel_server.preloads_for(pages)):
        result = subprocess.run(command, cwd=source, env=env, check=False)
    if result.returncode != 0:
        print(f"build_book: jupyter-book failed with exit status {result.returncode}",
              file=sys.stderr)
        return result.returncode or 1

    # The calculator's files are copied whole after Sphinx, which skips its static copy
    # when no page changed: a file left from an older build must not be served beside
    # the new ones, and a no-op rebuild must still ship the current kvlib.
    target = html_dir / "_static" / CALCULATOR_DIR.name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(CALCULATOR_DIR, target)
    # JupyterLite, copied the same way: its pages are not Sphinx's.
    lite_target = html_dir / LITE_DIR_NAME
    shutil.rmtree(lite_target, ignore_errors=True)
    with vendor_lock():
        shutil.copytree(lite_site, lite_target,
                        ignore=shutil.ignore_patterns(build_lite.FINGERPRINT))
    label_section_toggles(html_dir)
    problems = remote_assets(html_dir)
    if problems:
        print("build_book: the site would load remote assets:", *problems, sep="\n  ",
              file=sys.stderr)
        return 1
    missing = calculator_problems(html_dir)
    if missing:
        print("build_book: the calculator page would not load; missing:", *missing,
              sep="\n  ", file=sys.stderr)
        return 1
    # Written last: its presence tells callers that _build/html is complete and current.
    stamp.write_text(code_fingerprint())
    print(f"build_book: built {html_dir} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
