"""The chapters' links to the calculator: valid parameters, and the page's own numbers.

Each link is ``<a href="../calculator.html?...">`` in a chapter page. The calculator runs
``kvlib size`` on the link's parameters (``kvcalc.compute``, the code the page runs in
Pyodide); the figure the page's example states must come out of it, recomputed here the
way the page computes it. A link whose example drifts from the calculator fails here.
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest

from kvlib.bounds import decode_bytes_per_gpu, decode_tokens_per_s
from kvlib.capacity.assessment import assess
from kvlib.capacity.examples import document_assistant
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.paging.vllm_pool import kv_memory_range, kv_pool
from kvlib.sizing import kv_bytes, seats_for_context
from kvlib.weights.params import weight_bytes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "book" / "calculator_assets"))
import kvcalc  # noqa: E402  (the calculator's Python side, beside its script)

LINK = re.compile(r'<a href="\.\./calculator\.html\?([^"]+)">')


def links() -> list[tuple[str, dict[str, str]]]:
    found = []
    for page in sorted((ROOT / "book").glob("0*/*.md")):
        for query in LINK.findall(page.read_text()):
            params = dict(parse_qsl(html.unescape(query), strict_parsing=True))
            found.append((page.relative_to(ROOT / "book").as_posix(), params))
    return found


def _ch1() -> dict[str, Any]:
    llama, h100 = load_config("Llama-3.1-8B"), get_gpu("H100-SXM")
    free = int(h100.memory_bytes * 0.9) - weight_bytes(llama, None)
    return {"seats": seats_for_context(llama, free, 8_192)}


def _ch2() -> dict[str, Any]:
    qwen = load_config("Qwen3-4B")
    bf16 = kv_memory_range(qwen, 83_488, 16, "bf16")
    fp8 = kv_memory_range(qwen, 166_992, 16, "fp8")
    low = max(bf16[0], fp8[0])
    pool = kv_pool(qwen, low, max_model_len=32_768, kv_dtype="bf16")
    return {"free_kv_bytes_per_gpu": low, "pool_tokens": pool.pool_tokens,
            "max_concurrency": pool.max_concurrency}


def _ch4() -> dict[str, Any]:
    qwen, l4 = load_config("Qwen3-4B"), get_gpu("L4")
    step = weight_bytes(qwen, "bf16") + kv_bytes(qwen, 2_048, "bf16")
    bound = decode_tokens_per_s(step, l4.hbm_bandwidth_bytes_per_s)
    assert step == decode_bytes_per_gpu(qwen, 1, 2_048, "bf16", "bf16")
    return {"decode_bytes_per_gpu": step, "decode_tokens_per_s_bound": bound}


def _ch7() -> dict[str, Any]:
    base = assess(document_assistant())
    pool = base.pool
    return {"free_kv_bytes_per_gpu": pool.kv_memory_bytes, "seats": base.guaranteed_seats,
            "pool_tokens": pool.pool_tokens, "max_concurrency": pool.max_concurrency}


# What each page's example states, computed as the page computes it.
EXPECTED: dict[str, Callable[[], dict[str, Any]]] = {
    "01_kv_cache/04_seats_and_context.md": _ch1,
    "02_paging/07_vllm_startup.md": _ch2,
    "04_quantization/05_measured.md": _ch4,
    "07_capstone/03_remedies.md": _ch7,
}
LINKS = links()


def test_every_linked_page_is_checked_and_every_check_has_its_link() -> None:
    assert sorted({page for page, _ in LINKS}) == sorted(EXPECTED)


@pytest.mark.parametrize(("page", "params"), LINKS, ids=[page for page, _ in LINKS])
def test_link_opens_the_pages_example(page: str, params: dict[str, str]) -> None:
    known = {field.param for field in kvcalc.fields()}
    assert set(params) <= known, f"{page}: unknown calculator parameters {set(params) - known}"
    result = kvcalc.compute(params)
    assert result["status"] == 0, result
    report = json.loads(result["json"])
    for field, value in EXPECTED[page]().items():
        assert report[field] == pytest.approx(value, rel=1e-12), (page, field)
