"""Compile Python for the exercises' JupyterLite kernel with Pyodide's own CPython.

The kernel imports the standard library and IPython's closure (jedi, parso, pygments,
prompt_toolkit, traitlets, ...) every time it starts. Pyodide ships its standard library
as source (``python_stdlib.zip``, read by zipimport) and the wheels are source too, and
in the browser nothing compiled is kept (the file system is in memory, and
``sys.dont_write_bytecode`` is set): CPython compiled every imported module again at
every start. Measured in Node.js with Pyodide 314.0.6 (Python 3.14) on the course's
2-core machine: Pyodide's start 2.1 s and ``import IPython, jedi, pygments, prompt_toolkit,
traitlets`` 3.1-3.5 s from source; 0.7 s and 0.5 s compiled.

So the lite build compiles them once, with Pyodide's interpreter run in Node.js
(bytecode is specific to one CPython version, so this interpreter cannot): each module
of a zip becomes a sourceless ``.pyc`` in place of its ``.py`` (an unchecked hash-based
pyc, as ``py_compile`` writes it: with no source beside it, nothing is checked), named
in tracebacks by the path it has in the kernel. A wheel gets a new ``RECORD``. A module
that does not compile (test data, say) stays source. Entries keep their order and
timestamps, so the same inputs give the same bytes. Docstrings are kept: IPython reads
them (help, ``?``, magics' arguments).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["CompileError", "compile_wheels", "run_in_pyodide"]

NODE_TIMEOUT_S = 600
STDLIB_ZIP = "python_stdlib.zip"
# Run by Node.js (``node -e``: the arguments start at ``argv[1]``): Pyodide from the first,
# the host folder of the second mounted at /work, then the Python program of the third.
_NODE_SCRIPT = r"""
const path = require("node:path");
const { pathToFileURL } = require("node:url");
(async () => {
  const [pyodideDir, work, program] = process.argv.slice(1);
  const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")));
  const pyodide = await loadPyodide({ indexURL: pyodideDir + path.sep, stdout: console.log,
                                      stderr: console.error });
  pyodide.FS.mkdirTree("/work");
  pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: work }, "/work");
  pyodide.runPython(program);
})().catch((error) => { console.error(error); process.exit(1); });
"""
# Run by Pyodide's CPython on /work/jobs.json: [[zip in, zip out, kind]], kind "wheel"
# (unpacked into site-packages, has a RECORD) or "stdlib" (read in place by zipimport).
_PYTHON_PROGRAM = r"""
import base64, hashlib, json, os, py_compile, sys, sysconfig, zipfile

PLACES = {"wheel": sysconfig.get_paths()["purelib"],
          "stdlib": next(p for p in sys.path if p.endswith(".zip"))}
SCRATCH = "/tmp/pyodide_compile"
os.makedirs(SCRATCH, exist_ok=True)


def compiled(path, source):
    with open(f"{SCRATCH}/module.py", "wb") as handle:
        handle.write(source)
    try:
        py_compile.compile(f"{SCRATCH}/module.py", cfile=f"{SCRATCH}/module.pyc", dfile=path,
                           doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    except py_compile.PyCompileError:
        return None
    with open(f"{SCRATCH}/module.pyc", "rb") as handle:
        return handle.read()


def record_line(member, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{member},sha256={digest},{len(data)}"


def add(target, member, info, data):
    entry = zipfile.ZipInfo(member, date_time=info.date_time)
    entry.external_attr = info.external_attr
    entry.compress_type = zipfile.ZIP_DEFLATED
    target.writestr(entry, data)


def compile_zip(source_path, target_path, kind):
    kept, records, record = 0, [], None
    with zipfile.ZipFile(source_path) as source, \
         zipfile.ZipFile(target_path, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            data, member = source.read(info), info.filename
            if kind == "wheel" and member.endswith(".dist-info/RECORD"):
                record = info
                continue
            if member.endswith(".py") and ".data/" not in member:
                code = compiled(f"{PLACES[kind]}/{member}", data)
                if code is None:
                    kept += 1
                else:
                    member, data = member[:-3] + ".pyc", code
            add(target, member, info, data)
            records.append(record_line(member, data))
        if kind == "wheel":
            if record is None:
                raise SystemExit(f"{source_path} has no RECORD: not a wheel")
            records.append(f"{record.filename},,")
            add(target, record.filename, record, "\n".join(records) + "\n")
    return kept


jobs = json.load(open("/work/jobs.json"))
report = {os.path.basename(out): compile_zip(src, out, kind) for src, out, kind in jobs}
with open("/work/report.json", "w") as handle:
    json.dump(report, handle)
"""


class CompileError(Exception):
    """Pyodide could not compile the files; the message says why and what to fix."""


def run_in_pyodide(pyodide_dir: Path, work: Path, program: str) -> str:
    """Run the Python ``program`` in the Pyodide of ``pyodide_dir`` under Node.js, with the
    host folder ``work`` mounted at /work; returns what it printed."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        raise CompileError("Node.js is not installed; it runs Pyodide to compile the kernel's "
                           "Python (Debian: apt-get install nodejs npm)")
    try:
        done = subprocess.run(
            [node, "-e", _NODE_SCRIPT, str(pyodide_dir.resolve()), str(work), program],
            capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired:
        raise CompileError(f"Pyodide in Node.js took over {NODE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise CompileError(f"Pyodide in Node.js failed:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return done.stdout


def _compile(jobs: list[tuple[Path, str]], pyodide_dir: Path, output: Path) -> dict[str, int]:
    """Each (zip, kind) of ``jobs`` written compiled into ``output`` under its own name;
    returns name -> modules kept as source."""
    with tempfile.TemporaryDirectory(prefix="kvlib-compile-") as tmp_name:
        work = Path(tmp_name)
        (work / "in").mkdir()
        (work / "out").mkdir()
        spec = []
        for path, kind in jobs:
            shutil.copyfile(path, work / "in" / path.name)
            spec.append([f"/work/in/{path.name}", f"/work/out/{path.name}", kind])
        (work / "jobs.json").write_text(json.dumps(spec), encoding="utf-8")
        run_in_pyodide(pyodide_dir, work, _PYTHON_PROGRAM)
        report = work / "report.json"
        if not report.is_file():
            raise CompileError("Pyodide in Node.js compiled nothing: it wrote no report")
        output.mkdir(parents=True, exist_ok=True)
        for path, _ in jobs:
            shutil.copyfile(work / "out" / path.name, output / path.name)
        kept: dict[str, int] = json.loads(report.read_text(encoding="utf-8"))
    return kept


def compile_wheels(
    wheels: list[Path], pyodide_dir: Path, output: Path, *, stdlib: bool = False
) -> dict[str, int]:
    """Each of ``wheels`` (pure Python), and with ``stdlib`` the standard library zip of
    ``pyodide_dir`` (under its own name, :data:`STDLIB_ZIP`), compiled by the Pyodide in
    ``pyodide_dir`` (its ``pyodide.mjs`` and core files) into ``output``; name -> modules
    left as source. One Node.js process does them all: Pyodide starts once (3 CPU s)."""
    jobs = [(wheel, "wheel") for wheel in wheels]
    if stdlib:
        jobs.append((pyodide_dir / STDLIB_ZIP, "stdlib"))
    return _compile(jobs, pyodide_dir, output)
