"""kvlib's import rules (ARCHITECTURE.md, "Import rules"), each module imported alone in a
fresh interpreter.

- The arithmetic the book, the grader and the calculator share imports the standard
  library only; numpy (and SimPy) only under ``kvlib.serving``; torch only under
  ``kvlib.nn``, ``kvlib.engine.core`` and inside ``kvlib.timing``'s functions; redis only
  in ``kvlib.serving.ratelimit``; nbgrader, nbconvert, jupyter_client and dask never
  (they run the course, in the top-level ``course`` package).
- Imports point down the layers below, and no module imports another's private names.
- No import cycle among kvlib's and course's modules, counting imports under
  ``TYPE_CHECKING`` and inside functions.
- No kvlib module imports the course (the course adds ``kvlib grade`` through an entry point).
- The answer checks (``course.checks``) import the standard library alone, and the
  ``__init__`` files JupyterLite packs with them import nothing.
- Every module declares ``__all__`` and every name in it exists.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import pkgutil
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

import kvlib

ROOT = Path(kvlib.__file__).resolve().parent
# kvlib.__main__ runs the command line when imported: it is checked by its source only.
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(kvlib.__path__, prefix="kvlib.")
    if info.name != "kvlib.__main__"
) + ["kvlib"]

# Third-party top-level packages a module may bring in when imported (prefix match).
# Nothing under kvlib may bring in nbgrader, nbconvert, jupyter_client or dask: the
# course's machinery lives in the top-level ``course`` package.
ALLOWED = {
    "kvlib.serving": {"numpy", "simpy"},
    "kvlib.serving.ratelimit": {"numpy", "simpy", "redis"},
    "kvlib.nn": {"torch", "numpy"},
    "kvlib.engine.core": {"torch", "numpy"},
    "kvlib.engine.host_tier": {"torch", "numpy"},
    "kvlib.engine.disagg": {"torch", "numpy"},
}

# Layers, lowest first: a module may import from its own layer or below.
LAYERS = [
    ("kvlib._validate", "kvlib.units", "kvlib.dtypes"),
    ("kvlib.hardware",),
    ("kvlib.specs",),
    ("kvlib.config",),
    ("kvlib.sizing",),
    ("kvlib.weights", "kvlib.view"),
    ("kvlib.bounds",),
    ("kvlib.step",),
    ("kvlib.tiers",),
    ("kvlib.paging", "kvlib.mla", "kvlib.timing.roofline"),
    ("kvlib.capacity",),
    ("kvlib.serving",),
    ("kvlib.nn",),
    ("kvlib.timing",),
    ("kvlib.engine",),
    ("kvlib.commands", "kvlib.cli", "kvlib.__main__"),
]

# Each module is imported in a process forked for it alone, from a parent that has
# imported only what the module is allowed (so torch is imported once for all the
# modules allowed torch, not once per module); what the fork adds that lives in
# site-packages is the module's third-party imports beyond those allowed ones. What the
# parent's own imports loaded (torch brings typing_extensions...) is reported too, under
# ``PRELOADED`` and the names: what a module allowed those packages may bring along.
_PROBE = """
import importlib, json, os, sys, sysconfig
PATHS = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}

def third(before):
    found = set()
    for name in set(sys.modules) - before:
        origin = getattr(sys.modules[name], "__file__", None) or ""
        if name.split(".")[0] != "kvlib" and any(origin.startswith(p) for p in PATHS):
            found.add(name.split(".")[0])
    return sorted(found)

def forked(work):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = json.dumps(work())
        except BaseException as err:
            out = json.dumps({"error": repr(err)})
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))

def group(preload, modules):
    before = set(sys.modules)
    for name in preload:
        importlib.import_module(name)
    loaded = {PRELOADED + " ".join(preload): third(before)}
    def probe(module):
        before = set(sys.modules)
        importlib.import_module(module)
        return third(before)
    return {**loaded, **{m: forked(lambda m=m: probe(m)) for m in modules}}

PRELOADED = sys.argv[2]
results = {}
for preload, modules in json.loads(sys.argv[1]):
    results.update(forked(lambda: group(preload, modules)))
print(json.dumps(results))
"""


def _layer(module: str) -> int:
    for index, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return index
    raise AssertionError(
        f"{module} is in no layer of ARCHITECTURE.md's import rules: add it to LAYERS and there"
    )


def _allowed(module: str) -> set[str] | None:
    matching = [p for p in ALLOWED if module == p or module.startswith(p + ".")]
    return ALLOWED[max(matching, key=len)] if matching else set()


PRELOADED = "preloaded: "  # the key of what a group's preloading loaded, before its names


def _probe(groups: list[tuple[list[str], list[str]]]) -> dict[str, Any]:
    """Run the probe on ``[(allowed packages to preload, modules)]``."""
    result = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(groups), PRELOADED],
                            capture_output=True, text=True, check=True)
    found: dict[str, Any] = json.loads(result.stdout)
    return found


@functools.cache
def _imports_beyond_allowed() -> dict[str, Any]:
    """Each module -> the third-party packages importing it loads beyond those it is
    allowed (the probe: one fork per module, from a parent holding the allowed ones)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for module in MODULES:
        groups.setdefault(tuple(sorted(_allowed(module) or ())), []).append(module)
    return _probe([(list(preload), modules) for preload, modules in groups.items()])


def _third_party(module: str) -> set[str]:
    """Top-level third-party packages importing ``module`` alone loads."""
    found = _probe([([], [module])])[module]
    assert isinstance(found, list), found
    return set(found)


def _with_dependencies(packages: set[str]) -> set[str]:
    """``packages`` and what importing them brings along (torch loads typing_extensions...),
    as the probe's parent of the modules allowed them found."""
    return set(_imports_beyond_allowed()[PRELOADED + " ".join(sorted(packages))]) | packages


@pytest.mark.parametrize("module", [m for m in MODULES if _allowed(m) is not None])
def test_third_party_imports_follow_the_rules(module: str) -> None:
    found = _imports_beyond_allowed()[module]
    assert isinstance(found, list), f"importing {module} failed: {found}"
    imported = set(found)
    allowed = _allowed(module)
    assert allowed is not None
    closure = _with_dependencies(allowed)
    assert imported <= closure, f"{module} imports {sorted(imported - closure)}"


def _kvlib_imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for each ``import kvlib...`` / ``from kvlib... import`` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "kvlib":
                found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] == "kvlib"]
    return found


def _source(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin)


def test_no_kvlib_module_imports_the_course() -> None:
    """The library a learner reads depends on nothing that runs the course: anywhere in a
    file (top level, a function, ``TYPE_CHECKING``), no ``import course...``."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            if any(name.split(".")[0] == "course" for name in names):
                offenders.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not offenders, f"kvlib imports the course at {offenders}"


@pytest.mark.parametrize("module", [m for m in MODULES if m != "kvlib"] + ["kvlib.__main__"])
def test_imports_point_down_and_skip_private_names(module: str) -> None:
    own = _layer(module)
    for target, names in _kvlib_imports(_source(module)):
        if target == "kvlib":
            target = f"kvlib.{names[0]}" if names else target
        assert _layer(target) <= own, f"{module} (layer {own}) imports {target}"
        private = [n for n in names if n.startswith("_") and n != "__version__"]
        assert not private, f"{module} imports private {private} from {target}"


@pytest.mark.parametrize("module", MODULES)
def test_every_module_declares_what_it_exports(module: str) -> None:
    imported = importlib.import_module(module)
    if module in ("kvlib", "kvlib.__main__") or Path(str(imported.__file__)).name == "__init__.py":
        names = getattr(imported, "__all__", [])
    else:
        assert hasattr(imported, "__all__"), f"{module} has no __all__"
        names = imported.__all__
    for name in names:
        assert hasattr(imported, name), f"{module}.__all__ lists missing {name!r}"


def test_every_module_is_checked() -> None:
    files = {p for p in ROOT.rglob("*.py")}
    # MODULES leaves out kvlib.__main__; kvlib itself is kvlib/__init__.py.
    assert len(MODULES) + 1 == len(files), "a module is missed by the walk (a missing __init__?)"


# The public names of the core modules, pinned: a change here is a change of the API
# the book, the grader and the calculator rely on.
PINNED = {
    "kvlib.paging.sglang_pool": [
        "DEFAULT_PAGE_SIZE", "GB", "SGLANG_COMMIT", "SGLangPool", "cell_size_bytes",
        "default_mem_fraction_static", "max_total_num_tokens", "rest_memory_bytes",
        "sglang_pool",
    ],
    "kvlib.sizing": [
        "MLALayout", "kv_bytes", "kv_bytes_by_layer", "kv_bytes_per_token",
        "kv_bytes_per_token_dense", "kv_bytes_per_token_per_layer", "layer_specs",
        "max_context_tokens", "summed_page_bytes", "seats", "seats_for_context", "tokens_held",
    ],
    "kvlib.bounds": [
        "PrefillFlops", "attention_pairs", "compute_bound_tokens", "matmul_params",
        "prefill_attention_flops", "prefill_flops", "prefill_lower_bound_s",
        "decode_bytes_per_gpu", "decode_tokens_per_s", "expected_experts_touched",
        "kv_bytes_per_gpu", "kv_exceeds_weights_at_tokens", "min_gpus", "prefill_rule_of_thumb_s",
        "tp_error", "valid_tp_degrees", "weight_bytes_per_gpu",
    ],
    "kvlib.weights.params": [
        "ParamCount", "active_param_count", "count_params", "expert_weight_bytes",
        "group_weight_bytes", "param_count", "shipped_weights", "unread_weight_bytes",
        "weight_bytes",
    ],
    "kvlib.specs": [
        "CacheSpec", "ChunkedLocal", "DS_MLA_FP8_BYTES_PER_TOKEN", "DecompressedMLA",
        "FullAttention", "INDEXER_FP8_SCALE_BLOCK", "LinearState", "MLALatent", "SharedKV",
        "SlidingWindow", "causal_pairs", "vllm_group_spec",
    ],
    "kvlib.config": [
        "ConfigError", "IndexerShape", "Layout", "MLAShape", "MoEConfig", "ModelConfig",
        "QuantizationConfig", "VisionTower", "bundled_config_path", "bundled_models",
        "from_dict", "load_config",
    ],
    "kvlib.hardware": [
        "GPUS", "GPUSpec", "VLLM_GPU_MEMORY_UTILIZATION", "get_gpu", "gpu_from_torch_name",
        "gpu_names", "vllm_budget_bytes",
    ],
    "kvlib.units": None,  # constants and formatters: pinned by tests/unit/test_units.py
}


@pytest.mark.parametrize("module", sorted(m for m, names in PINNED.items() if names))
def test_public_names_are_pinned(module: str) -> None:
    assert sorted(importlib.import_module(module).__all__) == sorted(PINNED[module] or [])


def test_the_probe_sees_what_is_loaded_beyond_the_preloaded() -> None:
    """A module importing numpy: seen from a clean parent, not from one holding numpy,
    and a failing import is reported, not taken as clean."""
    held = ["numpy", "numpy.typing"]  # what kvlib.serving.simulate imports
    found = _probe([([], ["kvlib.serving.simulate"]), (held, ["kvlib.serving.simulate"])])
    assert "numpy" in _third_party("kvlib.serving.simulate")
    assert found["kvlib.serving.simulate"] == []
    assert found[PRELOADED] == [] and found[PRELOADED + "numpy numpy.typing"] == ["numpy"]
    assert "error" in _probe([([], ["kvlib.no_such_module"])])["kvlib.no_such_module"]


def test_site_packages_are_where_the_probe_looks() -> None:
    """The probe would miss third-party imports if site-packages were elsewhere."""
    import numpy

    assert any(
        str(Path(numpy.__file__)).startswith(p)
        for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])
    )


def _module_files(package_root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module of the package at ``package_root``."""
    found = {}
    for path in package_root.rglob("*.py"):
        parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The known modules ``name`` imports anywhere in its file: at the top, inside a
    function, or under ``if TYPE_CHECKING:`` (a cycle there still ties the two modules)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known else target)
    return (found & known) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (the strongly
    connected components of more than one module, by Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _import_graph() -> dict[str, set[str]]:
    files = _module_files(ROOT) | _module_files(ROOT.parent / "course")
    return {name: _imported_modules(name, path, set(files)) for name, path in files.items()}


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_kvlib_or_course() -> None:
    graph = _import_graph()
    assert "kvlib.commands.size" in graph and "course.apps.selfcheck" in graph
    assert _cycles(graph) == []


def _chapter_map() -> list[str]:
    """The modules ``kvlib``'s docstring maps to chapters: ``kvlib.pkg (a, b)`` names the
    package and its modules ``a`` and ``b``; a bracket may run onto an indented line."""
    text = re.sub(r",\s*\n\s+", ", ", kvlib.__doc__ or "")
    named = []
    for package, members in re.findall(r"^ {4}(kvlib[\w.]*)(?: \(([\w, ]+)\))?$", text, re.M):
        named.append(package)
        named += [f"{package}.{m.strip()}" for m in members.split(",") if m.strip()]
    return named


def test_the_chapter_map_names_every_module_once() -> None:
    named = _chapter_map()
    every = {*MODULES, "kvlib.__main__"} - {"kvlib"}
    assert "kvlib.paging.fragmentation.paged" in named and "kvlib.commands.size" in named
    assert sorted(every - set(named)) == [], "modules missing from kvlib's chapter map"
    assert sorted(set(named) - every) == [], "kvlib's chapter map names modules that do not exist"
    assert len(named) == len(set(named)), "a module is mapped to two chapters"


COURSE = ROOT.parent / "course"
# What JupyterLite's kernel packs besides the checks (scripts/build_lite.py): these
# ``__init__`` files must load nothing, or importing course.checks would load more.
PACKED_INITS = ("__init__.py", "notebooks/__init__.py", "apps/__init__.py")


def _imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in a file, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno} uses a relative import"
            found.append((node.lineno, node.module or ""))
    return found


@pytest.mark.parametrize("path", sorted((COURSE / "checks").glob("*.py")), ids=lambda p: p.name)
def test_the_answer_checks_import_the_standard_library_alone(path: Path) -> None:
    """Notebooks, hidden tests and the browser's kernel import course.checks: nothing but
    the standard library and its own modules (no kvlib, no numpy, no nbgrader)."""
    for line, module in _imported_names(path):
        top = module.split(".")[0]
        own = module == "course.checks" or module.startswith("course.checks.")
        assert own or top == "__future__" or top in sys.stdlib_module_names, (
            f"course/checks/{path.name}:{line} imports {module}"
        )


@pytest.mark.parametrize("name", PACKED_INITS)
def test_the_course_packages_the_browser_packs_import_nothing(name: str) -> None:
    assert _imported_names(COURSE / name) == []


def test_the_answer_checks_load_no_third_party_package() -> None:
    """The same, as a real import tells it: importing course.checks in a fresh
    interpreter loads the standard library and course.checks alone."""
    script = (
        "import sys; before = set(sys.modules); import course.checks; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True).stdout.split()
    foreign = [m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names
               and m not in ("course", "course.checks") and not m.startswith("course.checks.")]
    assert "course.checks.slips" in loaded and not foreign, foreign
