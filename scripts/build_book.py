"""Build the course site into _build/html, offline, with every warning an error.

Steps:
1. Copy MathJax 3 (the ``es5`` bundle and its woff-v2 fonts) from the installed
   ``django-static-mathjax`` package into ``_vendor/mathjax`` (git-ignored). The
   book's ``_config.yml`` adds ``_vendor`` to ``html_static_path`` and points
   ``mathjax_path`` at ``mathjax/tex-mml-chtml.js``, so pages load
   ``_static/mathjax/tex-mml-chtml.js`` instead of a CDN.
2. If the kvlib sources or bundled configs changed since the last build, drop the
   execution cache and rebuild every page: the cache is keyed on a notebook's
   code only, and a number printed by the book must never come from an old kvlib.
3. Run ``jupyter-book build . --builder html -W -n --keep-going``: any Sphinx
   warning, broken reference or failing cell makes the build fail.
4. Scan the HTML for remote script, stylesheet or font addresses: the site must
   read offline.

Usage: ``python scripts/build_book.py [--all] [--source DIR] [--chapter NN_slug]``.
``--chapter`` builds the front pages, chapter 1 and that one chapter into
``_build/chapters/NN_slug`` (its own execution cache), to check a chapter
without building the whole site. Exit status 0 on success, non-zero on any
warning, failing cell or remote asset.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR_DIR = ROOT / "_vendor"
MATHJAX_DIR = VENDOR_DIR / "mathjax"
KVLIB_STAMP_NAME = ".kvlib_sources.sha256"
MATHJAX_ENTRY = "tex-mml-chtml.js"

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


def warm_matplotlib() -> None:
    """Build matplotlib's font cache now, not inside a page: its first-run notice goes to
    stderr, which the book treats as a warning (execute.stderr_output: warn)."""
    subprocess.run([sys.executable, "-c", "import matplotlib.font_manager"], check=True)


def kvlib_fingerprint() -> str:
    """SHA-256 over kvlib's Python sources and bundled configs (paths and contents)."""
    digest = hashlib.sha256()
    kvlib_dir = ROOT / "kvlib"
    files = sorted(p for p in kvlib_dir.rglob("*") if p.suffix in {".py", ".json"})
    for path in files:
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def kvlib_changed(stamp: Path) -> bool:
    """True when kvlib differs from the one the cached notebook outputs came from."""
    return not stamp.is_file() or stamp.read_text() != kvlib_fingerprint()


def remote_assets(html_dir: Path) -> list[str]:
    """Every `file: match` where built HTML names a CDN or loads a remote asset."""
    problems = []
    for page in sorted(html_dir.rglob("*.html")):
        text = page.read_text(encoding="utf-8", errors="replace")
        for pattern in (CDN_PATTERN, REMOTE_ASSET_PATTERN):
            for match in pattern.finditer(text):
                problems.append(f"{page.relative_to(html_dir)}: {match.group(0)[:120]}")
    return problems


def jupyter_book_command(
    source: Path, rebuild_all: bool, output: Path | None = None, toc: Path | None = None
) -> list[str]:
    """The jupyter-book CLI of this Python environment, with warnings as errors."""
    executable = Path(sys.executable).parent / "jupyter-book"
    command = [str(executable)] if executable.is_file() else [
        sys.executable, "-c", "from jupyter_book.cli.main import main; main()"]
    command += ["build", str(source), "--builder", "html", "-W", "-n", "--keep-going"]
    if output is not None:
        command += ["--path-output", str(output)]
    if toc is not None:
        command += ["--toc", str(toc)]
    if rebuild_all:
        command.append("--all")
    return command


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
    build_dir = source / "_build"
    if args.chapter:
        output = source / "_build" / "chapters" / args.chapter
        toc = chapter_toc(source, args.chapter, output)
        build_dir = output / "_build"
    html_dir = build_dir / "html"
    stamp = build_dir / KVLIB_STAMP_NAME

    start = time.perf_counter()
    vendor_mathjax()
    warm_matplotlib()
    rebuild_all = args.all
    if kvlib_changed(stamp):
        jupyter_cache = build_dir / ".jupyter_cache"
        if jupyter_cache.exists():
            print("build_book: kvlib changed since the last build; re-executing every page")
            shutil.rmtree(jupyter_cache)
        rebuild_all = True

    # Pages import kvlib from this checkout even where it is not pip-installed.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(jupyter_book_command(source, rebuild_all, output, toc), cwd=source,
                            env=env, check=False)
    if result.returncode != 0:
        print(f"build_book: jupyter-book failed with exit status {result.returncode}",
              file=sys.stderr)
        return result.returncode or 1

    problems = remote_assets(html_dir)
    if problems:
        print("build_book: the site would load remote assets:", *problems, sep="\n  ",
              file=sys.stderr)
        return 1
    # Written last: its presence tells callers that _build/html is complete and current.
    stamp.write_text(kvlib_fingerprint())
    print(f"build_book: built {html_dir} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
