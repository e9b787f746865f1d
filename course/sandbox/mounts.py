"""What a student's sandbox is built from: bubblewrap mount options, in order.

The sandbox starts from an empty root. :func:`system_argv` adds the namespaces
and the system folders, read-only; :func:`python_paths` finds what the
interpreter runs from; :class:`Mounts` lays out the rest (Python, kvlib, size-
limited scratch space) with the folders leading to each mount point made
traversable by the kernel's unprivileged uid.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["SYSTEM_DIRS", "Mounts", "outermost", "python_paths", "system_argv"]

SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def system_argv(unprivileged: bool | None = None) -> list[str]:
    """Namespaces, and the system directories mounted read-only (links kept as links).

    ``unprivileged`` (default: not running as root) adds a user namespace, in which
    nested user namespaces are refused; as root bubblewrap needs none.
    """
    argv = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += ["--die-with-parent", "--new-session"]
    if os.geteuid() != 0 if unprivileged is None else unprivileged:
        argv += ["--unshare-user", "--disable-userns"]
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            argv += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            argv += ["--ro-bind", name, name]
    return argv


def python_paths() -> list[Path]:
    """What the interpreter runs from: its prefixes (and what links in them point to) and
    the package folders on ``sys.path``; never a script's folder (it may be the course)."""
    prefixes = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).parent]
    paths = [*prefixes, *(p.resolve() for p in prefixes)]
    for prefix in prefixes:
        if prefix.is_dir():
            paths += [e.resolve() for e in prefix.iterdir() if e.is_symlink() and e.exists()]
    roots = {p.resolve() for p in prefixes}
    for entry in sys.path:
        path = Path(entry).resolve() if entry else None
        if path is None or not path.is_dir():
            continue
        if path.name in ("site-packages", "dist-packages") or any(
            path.is_relative_to(r) for r in roots
        ):
            paths.append(path)
    return paths


def outermost(paths: list[Path]) -> list[Path]:
    """Drop paths inside another listed path (or inside /usr); shallowest first."""
    kept: list[Path] = [Path(p) for p in SYSTEM_DIRS if os.path.isdir(p) and not os.path.islink(p)]
    base = len(kept)
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept[base:]


class Mounts:
    """bubblewrap mount options in order, each preceded by its missing parent folders.

    bubblewrap creates missing parents with the host folder's mode (``/root`` is
    0700), which would lock the kernel's uid out: they are created 0755 here.
    """

    def __init__(self) -> None:
        self.argv: list[str] = []
        self._made = {Path("/"), Path("/proc"), Path("/dev"), *(Path(p) for p in SYSTEM_DIRS)}
        self._read_only: list[Path] = []

    def add(self, option: list[str], target: Path) -> None:
        for parent in reversed(target.parents):
            inside = any(parent.is_relative_to(m) for m in self._read_only)
            if parent not in self._made and not inside:
                self.argv += ["--perms", "0755", "--dir", str(parent)]
                self._made.add(parent)
        self.argv += [*option, str(target)]
        self._made.add(target)
        if option[0] == "--ro-bind":
            self._read_only.append(target)
