"""Run a hidden test outside the student's kernel, on values read out of it.

Student code owns its kernel: it can replace ``course.checks.expect``, hook
imports, install an exception handler that hides every failure, or rewrite
cells before they run. So the grader never runs a test cell there. It asks
the kernel only for the plain values of the names the test reads (type name
and ``repr``, parsed back here as int or float, never ``eval``-ed), then runs
the test's source in the grading process, where no student code has run.

A kernel can lie about those values, but a lie only helps a student who
already knows the right number: the kernel never sees the hidden test, the
expected value or the list of wrong values.
"""

from __future__ import annotations

import ast
import builtins
import math
from collections.abc import Mapping
from dataclasses import dataclass

from course.checks import describe_type_problem

__all__ = [
    "Unreadable",
    "Verdict",
    "free_names",
    "rebuild_value",
    "run_hidden_test",
    "snapshot_expression",
]

_NUMPY_INT = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_NUMPY_FLOAT = ("float16", "float32", "float64", "longdouble")

# Evaluated in the student's kernel by IPython (user_expressions): the answer's
# type and its repr, for exact ints, floats and NumPy scalars only.
_SNAPSHOT = (
    "(lambda b, v: (b.type(v).__module__, b.type(v).__qualname__, "
    "b.repr(v.item() if b.type(v).__module__ == 'numpy' else v) "
    "if b.type(v) in (b.int, b.float) or b.type(v).__module__ == 'numpy' else ''))"
    "(__import__('builtins'), {name})"
)


@dataclass(frozen=True)
class Unreadable:
    """A name whose value is not a plain number (or is missing) in the kernel."""

    type_name: str
    missing: bool = False
    error: str = ""  # the exception reading it raised, if any


@dataclass(frozen=True)
class Verdict:
    """Outcome of one hidden test: passed, or the error name and message to show."""

    passed: bool
    ename: str = ""
    message: str = ""
    detail: str = ""  # for the grader's log only, never for the student


def free_names(source: str) -> list[str]:
    """Names ``source`` reads but neither assigns nor imports, builtins excluded, sorted."""
    tree = ast.parse(source)
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return sorted(loaded - bound - set(dir(builtins)))


def snapshot_expression(name: str) -> str:
    """The user expression that reports ``name``'s type and value from the kernel."""
    if not name.isidentifier():
        raise ValueError(f"not an identifier: {name!r}")
    return _SNAPSHOT.format(name=name)


def rebuild_value(reply: Mapping[str, object]) -> float | int | Unreadable:
    """Parse one ``user_expressions`` reply back into an int or float.

    Only ``builtins.int``, ``builtins.float`` and NumPy real scalars come back
    as numbers; anything else (an object with its own ``__eq__``, a subclass,
    a string) becomes ``Unreadable`` carrying its type name.
    """
    if reply.get("status") != "ok":
        ename = str(reply.get("ename", "error"))
        return Unreadable("", missing=ename == "NameError", error=ename)
    data = reply.get("data")
    text = data.get("text/plain") if isinstance(data, Mapping) else None
    try:
        module, qualname, value_repr = ast.literal_eval(str(text))
        kind = f"{module}.{qualname}"
        if kind in ("builtins.int",) + tuple(f"numpy.{t}" for t in _NUMPY_INT):
            return int(value_repr)
        if kind in ("builtins.float",) + tuple(f"numpy.{t}" for t in _NUMPY_FLOAT):
            return float(value_repr)
        return Unreadable(kind)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return Unreadable("unreadable value")


def _problem(name: str, value: Unreadable) -> Verdict:
    if value.missing:
        message = f"{name} is not defined: assign your answer to it in the answer cell above."
        return Verdict(False, "NameError", message)
    if value.error:
        message = f"{name} could not be read ({value.error}); give a plain int or float."
        return Verdict(False, "AssertionError", message)
    return Verdict(False, "AssertionError", describe_type_problem(value.type_name, name))


def run_hidden_test(source: str, values: Mapping[str, float | int | Unreadable]) -> Verdict:
    """Run a test cell's ``source`` with ``values`` bound, in a fresh namespace.

    Only the exception's type name and message are reported, never a
    traceback: a traceback quotes source lines, and those compute the
    expected value.
    """
    for name in sorted(values):
        value = values[name]
        if isinstance(value, Unreadable):
            return _problem(name, value)
        if isinstance(value, float) and not math.isfinite(value):
            return Verdict(False, "AssertionError", f"{name} is {value!r}; give a finite number.")
    namespace: dict[str, object] = {"__name__": "__hidden_test__", "__builtins__": builtins}
    namespace.update(values)
    try:
        exec(compile(source, "<hidden test>", "exec"), namespace)
    except AssertionError as err:
        return Verdict(False, "AssertionError", str(err) or "the answer is wrong.")
    except Exception as err:  # an error in the test itself: report its kind only
        return Verdict(
            False,
            type(err).__name__,
            "the hidden test could not check the answer.",
            detail=f"{type(err).__name__}: {err}",
        )
    return Verdict(True)
