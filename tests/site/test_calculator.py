"""The calculator page (book/calculator.md) in headless Chromium against the CLI.

The page runs ``kvlib size`` on Pyodide in the browser. Each case here sets the page's
inputs (by its address or through its form), reads the JSON it writes into
``#kv-result`` or the error line it shows next to a field, and compares that with what
``kvlib size --json`` prints when run as a subprocess: the whole object, whatever fields
the report has. One browser and one page serve every case; a second load checks an
address with a bad value. Every request the browser makes is recorded: none may leave
127.0.0.1. The time from navigation to the first result and the bytes the page loads
are printed (the target is under 5 s on the course's 2-core machine; not asserted).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from site_helpers import (
    ROOT,
    ensure_site,
    serve_directory,
)

from course.book.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    OFFLINE_ARGS,
    browser_cpu_seconds,
    leaves_the_machine,
)

pytestmark = pytest.mark.site

sys.path.insert(0, str(ROOT / "book" / "calculator_assets"))
import kvcalc  # noqa: E402  (the page's Python side, run here in CPython)

PAGE = "book/calculator.html"
PASTE = "__paste__"  # the model list's "Paste a config.json" entry (calculator.js)
WAIT_MS = 180_000  # Pyodide's first start on a busy 2-core machine
STATE = "(document.getElementById('kv-calculator') || {dataset: {}}).dataset"


@pytest.fixture(scope="module")
def html_dir() -> Path:
    """The built site (scripts/build_book.py), built first when it is not current."""
    html = ensure_site()
    assert (html / PAGE).is_file(), f"the build wrote no {PAGE}"
    return html


def cli(args: list[str], cwd: Path = ROOT) -> tuple[int, dict[str, Any] | None, str]:
    """``kvlib size ARGS --json`` in a subprocess: (status, report or None, last stderr line)."""
    done = subprocess.run(
        [sys.executable, "-m", "kvlib", "size", *args, "--json"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = done.stderr.strip().splitlines()
    report = json.loads(done.stdout) if done.returncode == 0 else None
    return done.returncode, report, lines[-1] if lines else ""


@dataclass
class Calculator:
    """The page in the browser, and what the browser did."""

    page: Any
    base_url: str
    requests: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    first_load_bytes: dict[str, int] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)

    def url(self, params: dict[str, str]) -> str:
        return f"{self.base_url}{PAGE}?{urlencode(params)}"

    def wait(self, before: int) -> str:
        """Wait for run number ``before + 1`` to finish (or Python to fail to start);
        return the page's state."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            self.page.wait_for_function(
                f"([before]) => {STATE}.state === 'failed' || Number({STATE}.seq || 0) > before"
                f" && ['ready', 'error'].includes({STATE}.state)",
                arg=[before],
                timeout=WAIT_MS,
            )
        except PlaywrightTimeout:
            state = self.page.evaluate(f"JSON.stringify({STATE})")
            pytest.fail(f"no result in {WAIT_MS / 1000:.0f} s; page state {state}; "
                        f"console: {self.console[-10:]}")
        result: str = self.page.evaluate(f"{STATE}.state")
        return result

    def seq(self) -> int:
        return int(self.page.evaluate(f"Number({STATE}.seq || 0)"))

    def submit(self, params: dict[str, str], pasted: str | None = None) -> str:
        """Set every input (those not in ``params`` to their defaults) and submit."""
        before = self.seq()
        self.page.evaluate(_FILL_FORM, [params, pasted, PASTE])
        return self.wait(before)

    def result(self) -> dict[str, Any] | None:
        text = self.page.text_content("#kv-result") or ""
        return json.loads(text) if text.strip() else None

    def shown_errors(self) -> dict[str, str]:
        """Visible error lines by element id."""
        found: dict[str, str] = self.page.evaluate(
            "() => Object.fromEntries([...document.querySelectorAll('.kv-error')]"
            ".filter(e => !e.hidden).map(e => [e.id, e.textContent]))"
        )
        return found


_FILL_FORM = """
([params, pasted, pasteValue]) => {
  const form = document.getElementById('kv-form');
  for (const el of form.querySelectorAll('[name]')) {
    let value = el.name in params ? params[el.name] : el.dataset.default;
    if (el.name === 'model' && pasted !== null) { value = pasteValue; }
    if (el.type === 'checkbox') { el.checked = value === '1'; continue; }
    el.value = value;
    if (el.value !== value) { throw new Error(`no option ${value} for ${el.name}`); }
  }
  const paste = document.getElementById('kv-paste');
  paste.hidden = pasted === null;
  paste.value = pasted === null ? '' : pasted;
  form.requestSubmit();
}
"""

# The deep link of the issue: Llama-3.1-70B (GQA) at 32K on one H100.
DEEP_LINK = {
    "model": "Llama-3.1-70B",
    "context": "32768",
    "kv_dtype": "bf16",
    "gpu": "H100-SXM",
    "tp": "1",
    "batch": "1",
}
DEEP_LINK_ARGS = [
    "Llama-3.1-70B",
    "--context",
    "32768",
    "--kv-dtype",
    "bf16",
    "--gpu",
    "H100-SXM",
    "--tp",
    "1",
    "--batch",
    "1",
]


@pytest.fixture(scope="module")
def calculator(html_dir: Path) -> Iterator[Calculator]:
    """One Chromium, one page, opened on the deep link; the first load is measured."""
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: run `make browser` (Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with serve_directory(html_dir) as base_url, sync_playwright() as playwright:
        # Every host but 127.0.0.1 unresolvable, every request recorded: not Playwright's
        # request routing, which turns the HTTP cache off (the second load would fetch and
        # compile Pyodide's WebAssembly again).
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, *OFFLINE_ARGS], headless=True
        )
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        calc = Calculator(page, base_url)

        def on_response(response: Any) -> None:
            if response.status >= 400:
                calc.failures.append(f"{response.status} {response.url}")
            if "loadMs" not in calc.timing:
                size = int(response.headers.get("content-length", 0))
                calc.first_load_bytes[response.url] = size

        context.on("request", lambda request: calc.requests.append(request.url))
        context.on("response", on_response)
        context.on("requestfailed", lambda r: calc.failures.append(f"{r.url}: {r.failure}"))
        page.on("pageerror", lambda exc: calc.errors.append(str(exc)))
        page.on("console", lambda message: calc.console.append(f"{message.type}: {message.text}"))
        try:
            cpu = browser_cpu_seconds()
            start = time.perf_counter()
            page.goto(calc.url(DEEP_LINK), wait_until="commit")
            calc.wait(0)
            calc.timing["wall_s"] = time.perf_counter() - start
            calc.timing["cpu_s"] = browser_cpu_seconds() - cpu
            marks = page.evaluate(
                "() => Object.fromEntries(performance.getEntriesByType('mark')"
                ".map(m => [m.name, m.startTime]))"
            )
            calc.timing.update({k: v / 1000 for k, v in marks.items()})
            calc.timing["loadMs"] = float(page.evaluate(f"{STATE}.loadMs"))
            yield calc
        finally:
            context.close()
            browser.close()


def test_deep_link_equals_the_cli(
    calculator: Calculator, capsys: pytest.CaptureFixture[str]
) -> None:
    status, expected, _ = cli(DEEP_LINK_ARGS)
    assert status == 0
    assert calculator.page.evaluate(f"{STATE}.state") == "ready"
    assert calculator.result() == expected
    assert calculator.shown_errors() == {}
    t = calculator.timing
    weight = sum(calculator.first_load_bytes.values())
    pyodide = sum(n for url, n in calculator.first_load_bytes.items() if "/_static/pyodide/" in url)
    with capsys.disabled():
        print(
            f"\ncalculator: first result {t['loadMs'] / 1000:.2f} s after navigation "
            f"(Python started {t.get('kv-python-started', 0):.2f} s, kvlib imported "
            f"{t.get('kv-kvlib-imported', 0):.2f} s); {t['wall_s']:.2f} s wall in the test, "
            f"{t['cpu_s']:.2f} s CPU in Chromium; target < 5 s\n"
            f"calculator: page weight {weight:,} bytes in {len(calculator.first_load_bytes)} "
            f"files ({pyodide:,} of them Pyodide's core)"
        )


def test_seats_plot_equals_the_cli_at_each_context(calculator: Calculator) -> None:
    calculator.submit(DEEP_LINK)
    calculator.page.wait_for_function(f"{STATE}.plot === 'done'", timeout=WAIT_MS)
    points = calculator.page.evaluate(
        "() => [...document.querySelectorAll('#kv-plot circle')]"
        ".map(c => [Number(c.dataset.context), JSON.parse(c.dataset.seats)])"
    )
    contexts = [tokens for tokens, _ in points]
    assert len(points) >= 5 and contexts == sorted(contexts)
    assert 32768 in contexts and max(contexts) >= 131072  # the model's trained context
    base = list(DEEP_LINK_ARGS)
    at = base.index("--context")
    for tokens, seats in points:
        base[at + 1] = str(tokens)
        status, report, _ = cli(base)
        assert status == 0 and report is not None
        assert seats == report["seats"], tokens


# (id, page inputs, the same as kvlib size arguments): MHA, MQA, GQA, MLA, sliding
# windows, mixtures of experts; KV and weight dtypes; GPUs; TP; explicit KV memory;
# vLLM's block size.
FORM_CASES = [
    ("mha-gpt2-fp32-l4", {"model": "GPT-2", "context": "1024", "kv_dtype": "fp32", "gpu": "L4"},
     ["GPT-2", "--context", "1024", "--kv-dtype", "fp32", "--gpu", "L4"]),
    ("mqa-falcon-no-gpu", {"model": "Falcon-7B", "context": "2048", "batch": "8"},
     ["Falcon-7B", "--context", "2048", "--batch", "8"]),
    ("mla-moe-deepseek-v3-fp8-h200-tp8",
     {"model": "DeepSeek-V3", "context": "65536", "kv_dtype": "fp8", "gpu": "H200", "tp": "8",
      "batch": "4"},
     ["DeepSeek-V3", "--context", "65536", "--kv-dtype", "fp8", "--gpu", "H200", "--tp", "8",
      "--batch", "4"]),
    ("sliding-gemma2-int4-weights-a100",
     {"model": "Gemma-2-9B", "context": "8192", "weight_dtype": "int4", "gpu": "A100-80GB",
      "gpu_memory_utilization": "0.85"},
     ["Gemma-2-9B", "--context", "8192", "--weight-dtype", "int4", "--gpu", "A100-80GB",
      "--gpu-memory-utilization", "0.85"]),
    ("sliding-moe-gpt-oss-fp8-4090",
     {"model": "gpt-oss-20b", "context": "131072", "kv_dtype": "fp8", "gpu": "RTX-4090"},
     ["gpt-oss-20b", "--context", "131072", "--kv-dtype", "fp8", "--gpu", "RTX-4090"]),
    ("moe-mixtral-mi300x-tp2-kv-memory",
     {"model": "Mixtral-8x7B", "context": "16384", "gpu": "MI300X", "tp": "2",
      "kv_memory": "20 GiB"},
     ["Mixtral-8x7B", "--context", "16384", "--gpu", "MI300X", "--tp", "2",
      "--kv-memory", "20 GiB"]),
    ("vllm-pool-qwen3-4b-fp8-l4-block-32",
     {"model": "Qwen3-4B", "context": "40960", "kv_dtype": "fp8", "gpu": "L4",
      "block_size": "32"},
     ["Qwen3-4B", "--context", "40960", "--kv-dtype", "fp8", "--gpu", "L4",
      "--block-size", "32"]),
    ("sliding-mistral-fp32-weights-do-not-fit",
     {"model": "Mistral-7B-v0.1", "weight_dtype": "fp32", "gpu": "L4"},
     ["Mistral-7B-v0.1", "--weight-dtype", "fp32", "--gpu", "L4"]),
    ("engines-both-llama-h100",
     {"model": "Llama-3.1-8B", "gpu": "H100-SXM", "engine": "both"},
     ["Llama-3.1-8B", "--gpu", "H100-SXM", "--engine", "both"]),
    ("engine-sglang-deepseek-v3-old-vllm",
     {"model": "DeepSeek-V3", "kv_dtype": "fp8", "kv_memory": "40 GiB", "engine": "sglang",
      "mem_fraction_static": "0.8", "vllm_version": "0.19.0"},
     ["DeepSeek-V3", "--kv-dtype", "fp8", "--kv-memory", "40 GiB", "--engine", "sglang",
      "--mem-fraction-static", "0.8", "--vllm-version", "0.19.0"]),
]


@pytest.mark.parametrize(
    ("params", "args"), [c[1:] for c in FORM_CASES], ids=[c[0] for c in FORM_CASES]
)
def test_form_result_equals_the_cli(
    calculator: Calculator, params: dict[str, str], args: list[str]
) -> None:
    status, expected, _ = cli(args)
    assert status == 0
    assert calculator.submit(params) == "ready"
    assert calculator.result() == expected
    assert calculator.shown_errors() == {}


def test_typing_reruns_and_writes_the_address(calculator: Calculator) -> None:
    calculator.submit({"model": "Qwen3-8B", "kv_dtype": "fp8", "gpu": "L4"})
    before = calculator.seq()
    calculator.page.fill("#kv-in-context", "16384")  # an input event, as a keystroke
    calculator.wait(before)
    status, expected, _ = cli(
        ["Qwen3-8B", "--kv-dtype", "fp8", "--gpu", "L4", "--context", "16384"]
    )
    assert status == 0
    assert calculator.result() == expected
    query = dict(parse_qsl(urlsplit(calculator.page.url).query))
    assert query == {"model": "Qwen3-8B", "kv_dtype": "fp8", "gpu": "L4", "context": "16384"}


# A config.json as Hugging Face publishes it (Llama-style, chapter 1's example).
PASTED = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
    "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_size": 5120, "intermediate_size": 13824, "vocab_size": 32000,
    "max_position_embeddings": 16384,
}


def _pasted_cli(text: str, args: list[str], tmp_path: Path) -> tuple[int, Any, str]:
    """The CLI on the same text saved as pasted/config.json, the path the page uses."""
    (tmp_path / "pasted").mkdir(exist_ok=True)
    (tmp_path / "pasted" / "config.json").write_text(text)
    return cli(["pasted/config.json", *args], cwd=tmp_path)


def test_pasted_config_equals_the_cli(calculator: Calculator, tmp_path: Path) -> None:
    text = json.dumps(PASTED, indent=2)
    status, expected, _ = _pasted_cli(text, ["--gpu", "H100-PCIe", "--context", "8192"], tmp_path)
    assert status == 0
    assert calculator.submit({"gpu": "H100-PCIe", "context": "8192"}, pasted=text) == "ready"
    assert calculator.result() == expected



# The element that has the keyboard's focus: its id, or its tag and text.
FOCUSED = ("() => { const e = document.activeElement;"
           " return e ? (e.id || e.tagName.toLowerCase() + ':' + e.textContent.trim()) : ''; }")
KEYBOARD_CASE = {"model": "Mistral-7B-v0.1", "context": "12288", "gpu": "A100-80GB",
                 "kv_dtype": "fp8"}


def _tab_to(page: Any, target: str, limit: int = 400) -> int:
    """Press Tab until ``target`` (an id, or "button:Compute") has the focus; presses."""
    for presses in range(1, limit + 1):
        page.keyboard.press("Tab")
        if page.evaluate(FOCUSED) == target:
            return presses
    pytest.fail(f"{target} never took the focus in {limit} presses of Tab")


def _choose(page: Any, select_id: str, value: str) -> None:
    """Pick an option of the focused closed <select> with the arrow keys."""
    values = page.evaluate(f"() => [...document.getElementById('{select_id}').options]"
                           ".map(o => o.value)")
    now = values.index(page.evaluate(f"() => document.getElementById('{select_id}').value"))
    step = values.index(value) - now
    for _ in range(abs(step)):
        page.keyboard.press("ArrowDown" if step > 0 else "ArrowUp")
    assert page.evaluate(f"() => document.getElementById('{select_id}').value") == value


def test_the_form_works_from_the_keyboard_alone(calculator: Calculator) -> None:
    """From the top of the page, Tab reaches each field in order, the arrow keys pick a
    model, a GPU and a KV dtype, typing sets the context, and Enter on "Compute" runs the
    command: its result is what the command the page shows prints in a terminal."""
    page = calculator.page
    # Start where a keyboard user starts: the top of the page, nothing focused.
    page.evaluate("() => { document.activeElement?.blur(); window.scrollTo(0, 0); }")
    _tab_to(page, "kv-in-model")
    _choose(page, "kv-in-model", KEYBOARD_CASE["model"])
    _tab_to(page, "kv-in-context", 5)
    page.keyboard.press("Control+A")
    page.keyboard.type(KEYBOARD_CASE["context"])
    for param in ("kv_dtype", "gpu"):
        _tab_to(page, f"kv-in-{param}", 20)
        _choose(page, f"kv-in-{param}", KEYBOARD_CASE[param])
    _tab_to(page, "button:Compute", 40)
    before = calculator.seq()
    page.keyboard.press("Enter")
    assert calculator.wait(before) == "ready"
    # Typing and choosing run the command too (after a pause): wait until runs stop.
    while True:
        seen = calculator.seq()
        page.wait_for_timeout(700)
        if calculator.seq() == seen and page.evaluate(f"{STATE}.state") == "ready":
            break
    command = page.text_content("#kv-command") or ""
    for flag, value in (("--context", "context"), ("--gpu", "gpu"), ("--kv-dtype", "kv_dtype")):
        assert f"{flag} {KEYBOARD_CASE[value]}" in command, command
    words = shlex.split(command)
    assert words[:3] == ["kvlib", "size", KEYBOARD_CASE["model"]], command
    status, expected, _ = cli(words[2:])
    assert status == 0
    assert calculator.result() == expected
    assert calculator.shown_errors() == {}

BAD_FORM_CASES = [
    ("context-not-a-number", {"model": "Llama-3.1-8B", "context": "32k"}, None, "context"),
    ("context-below-one", {"model": "Llama-3.1-8B", "context": "0"}, None, "context"),
    ("tp-does-not-divide-heads", {"model": "Llama-3.1-8B", "gpu": "H100-SXM", "tp": "3"}, None,
     "tp"),
    ("utilization-above-one", {"model": "Qwen3-8B", "gpu": "L4",
                               "gpu_memory_utilization": "1.5"}, None, "gpu_memory_utilization"),
    ("kv-memory-without-unit", {"model": "Qwen3-8B", "kv_memory": "lots"}, None, "kv_memory"),
    ("pasted-malformed-json", {}, '{"model_type": "llama", "num_hidden_layers": 40', "model"),
    ("pasted-unknown-family", {}, '{"model_type": "no-such-family"}', "model"),
]


@pytest.mark.parametrize(
    ("params", "pasted", "field_name"),
    [c[1:] for c in BAD_FORM_CASES],
    ids=[c[0] for c in BAD_FORM_CASES],
)
def test_bad_input_shows_the_cli_error_next_to_its_field(
    calculator: Calculator,
    tmp_path: Path,
    params: dict[str, str],
    pasted: str | None,
    field_name: str,
) -> None:
    args = [a for k, v in params.items() if k != "model" for a in (f"--{k.replace('_', '-')}", v)]
    if pasted is None:
        status, _, line = cli([params["model"], *args])
    else:
        status, _, line = _pasted_cli(pasted, args, tmp_path)
    assert status == 2 and line.startswith("kvlib size: error: ")
    assert calculator.submit(params, pasted) == "error"
    assert calculator.shown_errors() == {f"kv-error-{field_name}": line}
    assert calculator.result() is None
    body = calculator.page.inner_text("body")
    assert "Traceback" not in body and 'File "' not in body


def test_deep_link_with_a_bad_value_shows_the_cli_error(calculator: Calculator) -> None:
    """A second load: an address naming a GPU that does not exist."""
    status, _, line = cli(["Llama-3.1-8B", "--gpu", "Z100"])
    assert status == 2
    calculator.page.goto(calculator.url({"model": "Llama-3.1-8B", "gpu": "Z100"}))
    assert calculator.wait(0) == "error"
    assert calculator.shown_errors() == {"kv-error-gpu": line}


def test_no_request_leaves_the_site(calculator: Calculator) -> None:
    """Runs last: every request of every case above went to 127.0.0.1 and succeeded."""
    assert calculator.requests, "no request recorded"
    outside = [u for u in calculator.requests if leaves_the_machine(u)]
    assert not outside, f"requests outside the site: {outside}"
    assert any(u.endswith("/_static/pyodide/pyodide.asm.wasm") for u in calculator.requests)
    assert any(u.endswith("/_static/calculator/kvlib.zip") for u in calculator.requests)
    assert not calculator.failures, calculator.failures
    assert not calculator.errors, f"JavaScript errors: {calculator.errors}"


# The page's Python side in CPython: what the browser cases above do not reach.


def test_the_form_has_every_flag_of_the_command() -> None:
    """Each option ``kvlib size --help`` lists (but --help and --json) is a field."""
    done = subprocess.run(
        [sys.executable, "-m", "kvlib", "size", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    flags = set(re.findall(r"^\s+(--[a-z][a-z-]*)", done.stdout, re.MULTILINE))
    assert flags - {"--help", "--json"} == {f.flag for f in kvcalc.fields() if f.flag}
    assert [f.param for f in kvcalc.fields() if f.flag is None] == ["model"]


def test_a_misspelt_link_parameter_is_named_not_ignored() -> None:
    result = kvcalc.compute({"model": "GPT-2", "kv-dtype": "fp8"})
    assert result["status"] == 2
    assert "'kv-dtype'" in result["error"] and "kv_dtype" in result["error"]


def test_the_command_shows_the_model_and_the_values_off_their_defaults() -> None:
    result = kvcalc.compute({"model": "GPT-2", "context": "4096", "kv_dtype": "fp8", "gpu": ""})
    assert result["status"] == 0
    assert result["command"] == "kvlib size GPT-2 --kv-dtype fp8"
    status, expected, _ = cli(["GPT-2", "--kv-dtype", "fp8"])
    assert status == 0 and json.loads(result["json"]) == expected


def test_the_build_stops_with_a_clear_message_without_npm(tmp_path: Path) -> None:
    """Pyodide comes from npm at build time: with no npm on PATH the build says so."""
    script = (
        "import sys, pathlib; sys.path.insert(0, 'scripts'); import build_book\n"
        f"build_book.NODE_MODULES = pathlib.Path({str(tmp_path)!r})\n"
        "build_book.PYODIDE_PACKAGE = build_book.NODE_MODULES / 'pyodide'\n"
        "build_book.npm_install()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": str(tmp_path)},
    )
    assert done.returncode != 0
    assert "npm is not installed" in done.stderr and "Traceback" not in done.stderr


def _hostile_config() -> st.SearchStrategy[str]:
    """A pasted config.json as a careless or hostile hand leaves it: a field made huge,
    negative, zero, a string, NaN, a list or an object; a key given twice; or nesting far
    deeper than any config (the same shapes the CLI's own fuzz test draws)."""
    fields = st.sampled_from(sorted(k for k, v in PASTED.items() if isinstance(v, int)))
    values = st.one_of(
        st.integers(min_value=-(10**40), max_value=10**40),
        st.sampled_from(["0", "-1", '"40"', "NaN", "Infinity", "[40]", '{"n": 40}', "null"]),
    )

    def replaced(field: str, value: Any) -> str:
        text = json.dumps(PASTED)
        raw = value if isinstance(value, str) else str(value)
        return text.replace(f'"{field}": {PASTED[field]}', f'"{field}": {raw}')

    def doubled(field: str, value: int) -> str:
        return json.dumps(PASTED)[:-1] + f', "{field}": {value}}}'

    def nested(depth: int) -> str:
        return json.dumps(PASTED)[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}"

    return st.one_of(
        st.builds(replaced, fields, values),
        st.builds(doubled, fields, st.integers(min_value=1, max_value=64)),
        st.builds(nested, st.integers(min_value=500, max_value=100_000)),
    )


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_hostile_config())
def test_hostile_pasted_config_gets_what_the_cli_gives(
    calculator: Calculator, tmp_path: Path, text: str
) -> None:
    """Differential fuzz: the page on Pyodide and the CLI agree on every drawn config,
    a report both, or one line naming the field and the fix both, never a traceback."""
    status, expected, line = _pasted_cli(text, [], tmp_path)
    assert status in (0, 2) and "Traceback" not in line
    state = calculator.submit({}, pasted=text)
    if status == 0:
        assert state == "ready" and calculator.result() == expected
    else:
        assert line.startswith("kvlib size: error: ") and "\n" not in line
        assert state == "error" and list(calculator.shown_errors().values()) == [line]
    body = calculator.page.inner_text("body")
    assert "Traceback" not in body and 'File "' not in body
