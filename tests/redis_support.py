"""A real Redis for the tests: Debian's ``redis-server`` on 127.0.0.1, on a free port.

``running_redis()`` (the body of the test modules' ``redis_server`` fixtures)
starts the server in a temporary directory with persistence off, waits until
it answers PING, yields its ``redis://`` URL and stops it afterwards. No fakeredis, no
mocks: the rate limiter's lesson (an atomic Lua script against a racy
GET-then-SET) only holds against the real server. ``make test`` installs the
package (``make system-deps``) where it is missing.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
START_TIMEOUT_S = 10.0
MIN_ATTEMPTS = 100  # per writer in `hammer`


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (right now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_for_ping(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited ({process.returncode}): {log.read_text()}")
        try:
            if client.ping():
                client.close()
                return
        except redis.ConnectionError:
            time.sleep(0.02)
    raise RuntimeError(f"redis-server did not answer PING within {START_TIMEOUT_S} s")


@contextmanager
def running_redis() -> Iterator[str]:
    """Start ``redis-server`` on a free loopback port; yield its URL; stop it after."""
    if not Path(REDIS_SERVER).is_file():
        pytest.fail(
            "redis-server is missing: the rate-limiter tests need Debian's redis-server. "
            "Run `make system-deps` (apt-get install redis-server)."
        )
    with tempfile.TemporaryDirectory(prefix="kvlib-redis-") as tmp:
        port = free_port()
        log = Path(tmp) / "redis.log"
        process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp,
             "--save", "", "--appendonly", "no", "--logfile", str(log),
             "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            url = f"redis://127.0.0.1:{port}/0"
            _wait_for_ping(url, process, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def hammer(
    kind: str,
    url: str,
    key: str,
    capacity: float,
    refill_per_s: float,
    duration_s: float,
    ready: object,
    start: object,
    results: object,
) -> None:
    """One writer process: try to take a token from ``key`` as fast as possible.

    ``kind`` is "lua" (:class:`RedisTokenBucket`) or "naive" (GET then SET).
    Connects, then waits at the ``ready`` and ``start`` barriers with the other
    writers, hammers for ``duration_s`` (and at least ``MIN_ATTEMPTS`` times), then
    puts ``(admitted, attempts, first, last)`` on ``results``: ``first`` and ``last``
    are ``time.monotonic()`` (one clock for every process on the machine) before the
    first attempt and after the last.
    """
    from kvlib.serving.ratelimit import NaiveRedisTokenBucket, RedisTokenBucket

    bucket: RedisTokenBucket | NaiveRedisTokenBucket
    if kind == "lua":
        bucket = RedisTokenBucket(url, key, capacity, refill_per_s, timeout_s=5.0)
    else:
        bucket = NaiveRedisTokenBucket(url, key, capacity, refill_per_s, timeout_s=5.0)
    bucket.try_acquire(0.0)  # connect (and load the script) before the start
    ready.wait()  # type: ignore[attr-defined]
    start.wait()  # type: ignore[attr-defined]
    admitted = attempts = 0
    first = time.monotonic()
    stop = first + duration_s
    # At least MIN_ATTEMPTS each, however loaded the machine: demand must exceed the limit.
    while time.monotonic() < stop or attempts < MIN_ATTEMPTS:
        admitted += bucket.try_acquire().admitted
        attempts += 1
    results.put((admitted, attempts, first, time.monotonic()))  # type: ignore[attr-defined]


def contend(
    kind: str,
    url: str,
    *,
    writers: int,
    capacity: float,
    refill_per_s: float,
    duration_s: float,
    hold_writes: bool = False,
) -> tuple[int, int, float]:
    """Run ``writers`` processes of :func:`hammer` on one fresh key.

    Returns (tokens admitted in total, attempts in total, seconds from the
    first writer's first attempt to the last writer's last): no correct bucket
    admits more than ``capacity + refill_per_s * seconds``.

    ``hold_writes``: before the writers start, Redis is told to hold every write
    (``CLIENT PAUSE ... WRITE``: reads are served, writes and scripts wait), and it
    is released only once every writer's first attempt is waiting on it
    (``blocked_clients``). A GET-then-SET writer has then done its GET and waits on
    its SET; a Lua writer waits with its whole script. The interleaving that a
    racy bucket loses is thereby forced, not left to the scheduler.
    """
    import multiprocessing

    # fork, not spawn: a forked writer starts in milliseconds (spawn re-imports everything,
    # seconds for eight), and each writer opens its own connection after the fork.
    ctx = multiprocessing.get_context("fork")
    ready, start = ctx.Barrier(writers + 1), ctx.Barrier(writers + 1)
    results = ctx.Queue()
    key = f"contend:{kind}:{time.monotonic_ns()}"
    args = (kind, url, key, capacity, refill_per_s, duration_s, ready, start, results)
    processes = [ctx.Process(target=hammer, args=args) for _ in range(writers)]
    admin = redis.Redis.from_url(url, socket_timeout=30)
    for process in processes:
        process.start()
    ready.wait(timeout=60)  # every writer connected, its bucket in Redis
    if hold_writes:
        admin.execute_command("CLIENT", "PAUSE", 120_000, "WRITE")
    start.wait(timeout=60)
    if hold_writes:
        try:
            deadline = time.monotonic() + 60
            while admin.info("clients")["blocked_clients"] < writers:
                assert time.monotonic() < deadline, "the writers never reached Redis"
                time.sleep(0.005)
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
    outcomes = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0, f"a {kind} writer exited with {process.exitcode}"
    admin.close()
    span_s = max(o[3] for o in outcomes) - min(o[2] for o in outcomes)
    return sum(o[0] for o in outcomes), sum(o[1] for o in outcomes), span_s
