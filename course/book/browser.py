"""Debian's Chromium as the course's browser checks and benchmarks run it, headless.

- :data:`CHROMIUM`: the Debian package's binary (``make browser`` installs it);
- :data:`CHROMIUM_ARGS`: its flags in a container, with no network traffic of its own;
- :data:`OFFLINE_ARGS`: the flag that leaves 127.0.0.1 the only address it resolves, and
  :func:`leaves_the_machine`, which says whether a request it recorded was for another;
- :func:`browser_cpu_seconds`: the CPU time of the Chromium processes this process
  started, the figure a benchmark reports beside wall time.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

__all__ = [
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "LOCAL_HOST",
    "OFFLINE_ARGS",
    "browser_cpu_seconds",
    "leaves_the_machine",
]

CHROMIUM = Path("/usr/bin/chromium")
# No GPU, and no GPU process either: with software compositing in the browser process, a
# page's frames are not handed to a GPU process that emulates one (a tenth of the site
# tour's CPU time, measured: 187 to 165 CPU s).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-gpu-compositing",
    "--in-process-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Nothing but the local server resolves: a request to any other host fails at once, in
# the page, a worker or a service worker alike (a listener on the context records it).
# Unlike Playwright's request routing, it leaves the browser's HTTP cache on.
LOCAL_HOST = "127.0.0.1"  # where the course's checks serve the site
OFFLINE_ARGS = [f"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE {LOCAL_HOST}"]


def leaves_the_machine(url: str) -> bool:
    """Whether a request for ``url`` is for another host than :data:`LOCAL_HOST` (``data:``,
    ``blob:`` and ``about:`` addresses never leave the browser)."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.hostname != LOCAL_HOST


def browser_cpu_seconds() -> float:
    """CPU time used so far by the live Chromium processes this process started: a figure
    that depends less than wall time on what else the machine runs."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        rest = text[text.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(rest[1])
        if name.startswith(("chromium", "chrome")):
            stats[int(entry.name)] = rest

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 1)
        return False

    # Fields 14 and 15 of /proc/PID/stat: user and system time, in clock ticks.
    ticks = sum(int(rest[11]) + int(rest[12]) for pid, rest in stats.items() if ours(pid))
    return ticks / os.sysconf("SC_CLK_TCK")
