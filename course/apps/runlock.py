"""One ``make grade`` per course at a time.

Two grading runs on one gradebook race: each puts the assignment in the
gradebook and writes the same students' rows, and one run's half-written
submission is the other's damaged record. So ``make grade`` holds two locks
while it grades:

- a **file lock** (``flock``) on ``.grading/lock`` in the course folder, for
  runs on this machine. The file says who holds it (host, pid, since when).
  The kernel drops an ``flock`` when its process ends, however it ends, so a
  killed run's lock is free at once; the file still names that run (a run
  that ends cleanly empties it), which is how the next run knows a run was
  killed: it says so, takes the lock over, and repairs what was left
  (:mod:`course.apps.records`);
- a **PostgreSQL advisory lock** on the gradebook's server when the gradebook
  is PostgreSQL, for runs from other machines. The server drops it when the
  holder's connection ends; the holder is named by its connection's
  ``application_name``, which ``pg_stat_activity`` shows to the other run.

A second run refuses at once with one line naming the running one and how to
wait (``WAIT=1``), or with ``wait=True`` waits for it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

__all__ = ["LOCK_FILE", "Busy", "Holder", "grading_lock"]

LOCK_FILE = Path(".grading") / "lock"
# NAMEDATALEN - 1: the longest application_name PostgreSQL keeps.
_PG_NAME_CHARS = 63
_WAIT_HINT = "wait for it (make grade ... WAIT=1) or run again when it ends"


class Busy(RuntimeError):
    """Another ``make grade`` holds the course; the message is one line for the instructor."""


@dataclass(frozen=True)
class Holder:
    """Who grades: a host, a process id and when it started (UTC)."""

    host: str
    pid: int
    since: str

    @classmethod
    def me(cls) -> Holder:
        now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return cls(socket.gethostname(), os.getpid(), now)

    def line(self) -> str:
        """The lock file's text, and how a message names the run."""
        return f"host {self.host}, pid {self.pid}, since {self.since}"

    def pg_name(self) -> str:
        """The run as a PostgreSQL ``application_name`` (at most 63 characters)."""
        since = self.since.replace("-", "").replace(":", "").replace(" UTC", "Z")
        return f"make grade {self.host[:24]} pid {self.pid} {since}"[:_PG_NAME_CHARS]


def _file_lock(root: Path, me: Holder, wait: bool, say: Callable[[str], None]) -> IO[str]:
    """``.grading/lock`` held by this process (the open file); :class:`Busy` when another
    run holds it and ``wait`` is false."""
    path = root / LOCK_FILE
    path.parent.mkdir(exist_ok=True)
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held past this function
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = _read(handle) or "a run that has not said who it is yet"
            if not wait:
                raise Busy(f"another make grade is grading this course ({other}); "
                           f"{_WAIT_HINT}") from None
            say(f"waiting for the make grade already grading this course ({other}) to end")
            fcntl.flock(handle, fcntl.LOCK_EX)
        if left := _read(handle):  # a run that ended cleanly leaves the file empty
            say(f"a make grade that did not finish ({left}) left its lock: taken over; "
                "what it left half-done is regraded")
        handle.seek(0)
        handle.truncate()
        handle.write(me.line() + "\n")
        handle.flush()
    except BaseException:
        handle.close()
        raise
    return handle


def _read(handle: IO[str]) -> str:
    handle.seek(0)
    return handle.read().strip()


def _release_file(handle: IO[str]) -> None:
    handle.seek(0)
    handle.truncate()  # empty: this run finished (or was stopped and said so)
    handle.flush()
    fcntl.flock(handle, fcntl.LOCK_UN)
    handle.close()


def advisory_key(course_id: str) -> tuple[int, int]:
    """The advisory lock's two 31-bit keys: a fixed one for ``make grade``, one for the
    course (PostgreSQL's two-key form, so ``pg_locks`` shows them as classid and objid)."""
    digest = hashlib.sha256(f"kvlib make grade\0{course_id}".encode()).digest()
    return 0x6B766C62 & 0x7FFFFFFF, int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def _pg_holder(cursor: Any, key: tuple[int, int]) -> str:
    cursor.execute(
        "SELECT a.application_name, a.client_addr, a.backend_start FROM pg_locks l "
        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
        "AND l.granted AND l.classid = %s AND l.objid = %s AND l.objsubid = 2",
        key,
    )
    row = cursor.fetchone()
    if row is None:
        return "a run that has just ended"
    name, address, start = row
    return (f"{name or 'another client'} from {address or 'this server'}, connected "
            f"{start:%Y-%m-%d %H:%M:%S %Z}")


def _pg_lock(url: str, course_id: str, me: Holder, wait: bool,
             say: Callable[[str], None]) -> Any:
    """A connection holding the course's advisory lock on the gradebook's server."""
    import psycopg2

    # SQLAlchemy's URL may name its driver (postgresql+psycopg2://); libpq's may not.
    dsn = "postgresql://" + url.split("://", 1)[1]
    connection = psycopg2.connect(dsn, application_name=me.pg_name())
    try:
        connection.autocommit = True
        key = advisory_key(course_id)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", key)
            if not cursor.fetchone()[0]:
                other = _pg_holder(cursor, key)
                if not wait:
                    raise Busy(f"another make grade is grading this course's gradebook "
                               f"({other}); {_WAIT_HINT}")
                say(f"waiting for the make grade already grading this course's gradebook "
                    f"({other}) to end")
                cursor.execute("SELECT pg_advisory_lock(%s, %s)", key)
    except BaseException:
        connection.close()
        raise
    return connection


def _release_pg(connection: Any, key: tuple[int, int], say: Callable[[str], None]) -> None:
    """Unlock, then close the lock's connection; say so if it was cut meanwhile (a restart
    or failover): for that while another run could have started. The unlock is explicit
    because closing alone is not synchronous: the server ends the session, and drops its
    locks, after the client has returned, so a run started at once could be refused."""
    import psycopg2

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", key)
            held = cursor.fetchone()[0]
    except psycopg2.Error:
        held = False
    if not held:
        say("the gradebook's server cut this run's lock connection during the run "
            "(restarted?): if another make grade began meanwhile, run make grade again "
            "once it ends")
    with contextlib.suppress(psycopg2.Error):
        connection.close()


@contextlib.contextmanager
def grading_lock(
    root: Path, db_url: str, course_id: str, *, wait: bool = False,
    say: Callable[[str], None] = print,
) -> Iterator[Holder]:
    """Hold the course (and a PostgreSQL gradebook) while the block runs; :class:`Busy`
    at once when another run holds it and ``wait`` is false."""
    me = Holder.me()
    handle = _file_lock(root, me, wait, say)
    try:
        connection = None
        if db_url.startswith("postgresql"):
            connection = _pg_lock(db_url, course_id, me, wait, say)
        try:
            yield me
        finally:
            if connection is not None:
                _release_pg(connection, advisory_key(course_id), say)
    finally:
        _release_file(handle)
