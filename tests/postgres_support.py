"""A throwaway PostgreSQL server for tests: Debian's PostgreSQL, on loopback, in a temp dir.

``postgres_server()`` runs ``initdb`` and ``pg_ctl start`` under a fresh
folder, listening on 127.0.0.1 at a free port with a Unix socket in that
folder, trusts local connections (nothing else can reach it), creates a
database and yields its URL; ``pg_ctl stop`` and the folder's removal follow.
PostgreSQL refuses to run as root, so as root the server runs as the
``postgres`` user Debian's package creates (or ``nobody``) through ``runuser``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PG_BIN", "postgres_available", "postgres_server", "restart"]

# url -> (server account, data folder, server options, log file) of each running server
_RUNNING: dict[str, tuple[str | None, Path, str, Path]] = {}


def _newest_server_bin() -> Path:
    """The newest major version's programs: Debian installs each under its own number
    (15 on bookworm, 17 on trixie)."""
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    digits = [p for p in found if p.parent.name.isdigit()]
    return max(digits, key=lambda p: int(p.parent.name), default=Path("/usr/lib/postgresql/15/bin"))


PG_BIN = Path(os.environ.get("KVLIB_PG_BIN") or _newest_server_bin())


def postgres_available() -> bool:
    """Whether Debian's PostgreSQL server programs are installed (``make test`` installs)."""
    return all((PG_BIN / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres"))


def _server_user() -> str | None:
    """The account to run the server as: None (this one) unless this one is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root, and no 'postgres' or 'nobody' account to run a server")


def _run(user: str | None, argv: list[str]) -> None:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def postgres_server(database: str = "course") -> Iterator[str]:
    """Start a server, create ``database``; yield ``postgresql://grader@127.0.0.1:PORT/DB``."""
    user = _server_user()
    folder = Path(tempfile.mkdtemp(prefix="kvlib-pg-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    data, port = folder / "data", _free_port()
    try:
        _run(user, [str(PG_BIN / "initdb"), "-D", str(data), "-U", "grader", "--auth=trust",
                    "--encoding=UTF8", "--no-sync"])
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off"
        _run(user, [str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l",
                    str(folder / "log"), "-w", "-t", "60", "start"])
        try:
            _run(user, [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port),
                        "-U", "grader", database])
            url = f"postgresql://grader@127.0.0.1:{port}/{database}"
            _RUNNING[url] = (user, data, options, folder / "log")
            yield url
        finally:
            _RUNNING.pop(f"postgresql://grader@127.0.0.1:{port}/{database}", None)
            _run(user, [str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                        "stop"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def restart(url: str) -> None:
    """Restart the server of ``url`` (started by :func:`postgres_server`), cutting every
    connection; returns once it accepts connections again."""
    user, data, options, log = _RUNNING[url]
    _run(user, [str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log),
                "-m", "fast", "-w", "-t", "60", "restart"])
