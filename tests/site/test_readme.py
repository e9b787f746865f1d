"""The README's commands: the two set-up commands are real targets and CI runs the test
one; every kvlib command the Engineer paragraph shows runs as written."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# What `path/to/config.json` stands for when the commands run here.
EXAMPLE_CONFIG = ROOT / "kvlib" / "data" / "configs" / "Llama-3.1-8B.json"
# Commands that measure or simulate for a while: run with --help only.
SLOW = {"bench", "engine-bench"}


def _section(title: str) -> str:
    if title.startswith("## "):
        return README.split(f"\n{title}\n", 1)[1].split("\n## ", 1)[0]
    return README.split(f"**{title}.**", 1)[1].split("\n**", 1)[0]


def _commands(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_two_set_up_commands_and_ci_runs_the_test_one() -> None:
    assert [c.split("#")[0].strip() for c in _commands(_section("## Set up"))] == [
        "make book", "make test"
    ]
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert {"book", "test"} <= targets
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith("#")]
    assert ci[-1] == "make test"


ENGINEER = [c for c in _commands(_section("Engineer")) if c.startswith(".venv/bin/kvlib ")]


def test_engineer_paragraph_shows_the_commands() -> None:
    assert {shlex.split(c)[1] for c in ENGINEER} == {
        "size", "queue", "bench", "engine-bench", "step", "capacity", "reload", "handoff"
    }


@pytest.mark.parametrize("command", ENGINEER)
def test_engineer_command_runs(command: str) -> None:
    args = shlex.split(command.replace("path/to/config.json", str(EXAMPLE_CONFIG)))[1:]
    if args[0] in SLOW:
        args = [args[0], "--help"]
    done = subprocess.run([sys.executable, "-m", "kvlib", *args], capture_output=True,
                          text=True, timeout=120, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    if "--json" in args:
        report = json.loads(done.stdout)
        assert report["kv_bytes_per_token"] > 0
    elif args[0] == "size":
        assert "per token" in done.stdout
