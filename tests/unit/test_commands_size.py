"""kvlib size: the numbers it prints, the JSON of its report, and one-line errors."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvlib import bounds, sizing
from kvlib.cli import main
from kvlib.commands.size import SizeReport
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.paging import vllm_pool
from kvlib.units import GiB
from kvlib.weights import params


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["size", *args, "--json"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_json_is_the_report_fields(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "Gemma-2-9B", "--context", "8192", "--kv-dtype", "fp8")
    assert set(report) == {f.name for f in dataclasses.fields(SizeReport)}
    cfg = load_config("Gemma-2-9B")
    assert report["kv_bytes_per_token"] == sizing.kv_bytes_per_token(cfg, "fp8")
    assert report["kv_bytes"] == sizing.kv_bytes(cfg, 8192, "fp8")
    assert isinstance(report["kv_bytes"], int)
    assert report["weight_bytes"] == params.weight_bytes(cfg, None)
    assert report["seats"] is None and report["gpu"] is None


def test_seats_on_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "Llama-3.1-8B", "--gpu", "H100-SXM", "--context", "32768")
    cfg = load_config("Llama-3.1-8B")
    h100 = get_gpu("H100-SXM")
    assert report["gpu_memory_bytes"] == h100.memory_bytes == 81_559 * 2**20
    # vLLM's request_memory: ceil(0.92 x CUDA's total), 79.10 GiB on an H100.
    free = math.ceil(7_910 * 2**30 // 100 * 0.92) - params.weight_bytes(cfg)
    assert report["free_kv_bytes_per_gpu"] == free
    assert report["seats"] == free // sizing.kv_bytes(cfg, 32768)
    assert report["fits"] is True
    step = params.weight_bytes(cfg) - params.unread_weight_bytes(cfg) + sizing.kv_bytes(cfg, 32768)
    assert report["decode_tokens_per_s_bound"] == pytest.approx(3.35e12 / step)


def test_weights_ship_as_their_quantization_config_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shipped = run_json(capsys, "gpt-oss-20b")
    assert shipped["weight_dtype"] == "auto" and shipped["weight_format"] == "mxfp4"
    assert round(shipped["weight_bytes"] / GiB, 1) == 12.8
    forced = run_json(capsys, "gpt-oss-20b", "--weight-dtype", "bf16")
    assert forced["weight_bytes"] == 2 * forced["param_count"]


def test_tensor_parallel_deployment(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "Llama-3.1-70B", "--gpu", "H200", "--tp", "2", "--context", "8192")
    cfg = load_config("Llama-3.1-70B")
    assert report["kv_bytes_per_gpu"] == bounds.kv_bytes_per_gpu(cfg, 8192, tp=2)
    norms = 2 * (2 * 80 + 1) * 8_192  # kept whole on both GPUs; the rest is split
    assert report["weight_bytes_per_gpu"] == norms + -(-(params.weight_bytes(cfg) - norms) // 2)
    assert report["weight_bytes_per_gpu"] == bounds.weight_bytes_per_gpu(cfg, 2)
    assert report["min_gpus"] == 2 and report["valid_tp_degrees"] == [1, 2, 4, 8]


def test_kv_memory_reproduces_the_worked_example(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], example_config: dict[str, object]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(example_config))
    report = run_json(capsys, str(config), "--kv-memory", "9 GiB")
    assert report["kv_bytes_per_token"] == 163_840
    assert report["seats"] == 14


def test_weights_that_do_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM refuses to start ('No available memory for the cache blocks',
    check_enough_kv_cache_memory): no pool at all, and no concurrency is logged."""
    report = run_json(capsys, "Llama-3.1-70B", "--gpu", "L4")
    assert report["fits"] is False and report["seats"] == 0
    assert report["decode_tokens_per_s_bound"] is None
    assert report["pool_blocks"] is None and report["max_concurrency"] is None
    assert report["estimated_max_model_len"] is None
    assert report["block_bytes"] is not None  # the page itself does not depend on memory
    assert not any("GPU KV cache size" in note for note in report["notes"])
    assert any("No available memory for the cache blocks" in note for note in report["notes"])


def test_a_pool_smaller_than_one_request_is_refused_as_vllm_refuses_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """vLLM starts only if one request of max_model_len fits: ``cdiv(T, B)`` pages of
    ``2 L H_kv d b B`` bytes no more than the KV memory (check_enough_kv_cache_memory).
    Llama-3.1-8B on an L4: the longest context that fits is the last whole block."""
    first = run_json(capsys, "Llama-3.1-8B", "--gpu", "L4", "--context", "1024")
    page = 32 * 2 * 8 * 128 * 2 * 16  # bytes of one 16-token block, every layer
    longest = first["free_kv_bytes_per_gpu"] // page * 16
    fits = run_json(capsys, "Llama-3.1-8B", "--gpu", "L4", "--context", str(longest))
    assert fits["max_concurrency"] >= 1 and fits["pool_blocks"] == longest // 16
    assert any("GPU KV cache size" in note for note in fits["notes"])
    over = run_json(capsys, "Llama-3.1-8B", "--gpu", "L4", "--context", str(longest + 1))
    # The pool is known before vLLM's check: kept, with vLLM's message and its estimate.
    assert over["pool_blocks"] == fits["pool_blocks"] and over["max_concurrency"] is None
    assert over["estimated_max_model_len"] == longest
    assert fits["estimated_max_model_len"] is None
    assert any(
        "would not start" in note and "To serve at least one request" in note
        and f"the estimated maximum model length is {longest}." in note
        for note in over["notes"]
    )
    # Where not one sequence fits, even counted to the byte, no decode step runs: no bound.
    long = run_json(capsys, "Llama-3.1-8B", "--gpu", "L4", "--context", str(8 * longest))
    assert long["seats"] == 0 and long["decode_tokens_per_s_bound"] is None
    assert fits["decode_tokens_per_s_bound"] is not None


@pytest.mark.parametrize("name", ["DeepSeek-V2", "DeepSeek-V3"])
def test_an_mla_model_shows_its_latent_not_heads(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An MLA layer caches ``kv_lora_rank + qk_rope_head_dim`` elements, read from the file."""
    configs = Path(__file__).parents[2] / "kvlib" / "data" / "configs"
    raw = json.loads((configs / f"{name}.json").read_text())
    report = run_json(capsys, name)
    assert report["latent_dims"] == [raw["kv_lora_rank"], raw["qk_rope_head_dim"]]
    width = raw["kv_lora_rank"] + raw["qk_rope_head_dim"]
    assert report["kv_bytes_per_token"] == raw["num_hidden_layers"] * width * 2
    assert main(["size", name]) == 0
    table = capsys.readouterr().out
    latent = f"{raw['kv_lora_rank']} + {raw['qk_rope_head_dim']} a layer"
    assert latent in table and "KV heads x head dim" not in table
    assert run_json(capsys, "Llama-3.1-8B")["latent_dims"] is None
    # vLLM forces 64-token blocks for FlashMLA (vllm/platforms/cuda.py); 16 is not what it logs.
    assert any("--block-size 64" in note for note in report["notes"])
    at_64 = run_json(capsys, name, "--block-size", "64")
    assert not any("MLA kernels" in note for note in at_64["notes"])


def test_unknown_parameter_layout_is_null_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"model_type": "cohere2", "hidden_size": 4096, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 256000,
             "sliding_window": 4096}
        )
    )
    report = run_json(capsys, str(config), "--gpu", "H100-SXM")
    assert report["param_count"] is None and "cohere2" in report["param_count_note"]
    assert report["weight_bytes"] is None and report["seats"] is None
    assert report["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2
    assert main(["size", str(config)]) == 0
    assert "unknown" in capsys.readouterr().out


def test_v32_fp8_layout_is_stated(capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.loads(Path(sizing.__file__).parent.joinpath(
        "data/configs/DeepSeek-V3.json").read_text())
    v32 = {**raw, "model_type": "deepseek_v32", "index_head_dim": 128, "index_n_heads": 64,
           "index_topk": 2048}
    cfg = load_config(v32)
    assert sizing.kv_bytes_per_token(cfg, "fp8") == 61 * (656 + 132)
    assert any("656" in n for n in cfg.layers[0].layout_note("fp8").split("\n"))  # type: ignore[union-attr]


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "Llama-3.1-8B", "--gpu", "H100-SXM"]) == 0
    out = capsys.readouterr().out
    assert "128 KiB" in out and "512 MiB" in out and "seats at 4,096 tokens" in out
    assert "79.65 GiB" in out and "(driver)" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["no-such-model"], "bundled"),
        (["Llama-3.1-8B", "--kv-dtype", "fp9"], "--kv-dtype"),
        (["Llama-3.1-8B", "--weight-dtype", "fp9"], "--weight-dtype"),
        (["Llama-3.1-8B", "--context", "0"], "--context"),
        (["Llama-3.1-8B", "--batch", "0"], "--batch"),
        (["Llama-3.1-8B", "--gpu", "V100"], "V100"),
        (["Falcon-7B", "--gpu", "L4", "--tp", "2"], "tp=2"),
        (["Llama-3.1-8B", "--vllm-version", "latest"], "--vllm-version"),
        (["Llama-3.1-8B", "--tp", str(10**12)], "more GPUs than the 32 attention heads"),
        (["Llama-3.1-8B", "--kv-memory", "nine gigs"], "--kv-memory"),
        (["Llama-3.1-8B", "--gpu", "H100", "--gpu-memory-utilization", "1.5"], "utilization"),
    ],
)
def test_bad_input_is_one_line(args: list[str], needle: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvlib", "size", *args], capture_output=True, text=True
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in result.stderr


def test_a_programming_error_is_not_reported_as_bad_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only ConfigError and UsageError become one-line errors; a bug stays a bug."""

    def broken(*args: object, **kwargs: object) -> int:
        raise KeyError("internal")

    monkeypatch.setattr(sizing, "kv_bytes_per_token", broken)
    with pytest.raises(KeyError, match="internal"):
        main(["size", "Llama-3.1-8B"])


def test_pool_is_what_vllm_would_log(capsys: pytest.CaptureFixture[str]) -> None:
    """The pool fields follow kvlib.paging.vllm_pool, checked against vLLM's start-up lines."""
    from kvlib.paging import vllm_pool

    report = run_json(capsys, "Llama-3.1-8B", "--gpu", "L4", "--context", "32768")
    cfg = load_config("Llama-3.1-8B")
    pool = vllm_pool.kv_pool(cfg, report["free_kv_bytes_per_gpu"], max_model_len=32768)
    assert report["block_size"] == 16
    assert report["block_bytes"] == 32 * 2 * 16 * 8 * 128 * 2
    assert report["pool_blocks"] == report["free_kv_bytes_per_gpu"] // report["block_bytes"]
    assert report["pool_tokens"] == pool.pool_tokens == 16 * report["pool_blocks"]
    assert report["blocks_per_request"] == 32768 // 16
    assert report["max_concurrency"] == pytest.approx(report["pool_blocks"] / 2048)
    assert any("GPU KV cache size: " in note for note in report["notes"])
    small = run_json(capsys, "Llama-3.1-8B", "--block-size", "32")
    assert small["block_bytes"] == 2 * report["block_bytes"] and small["pool_blocks"] is None


def test_vllm_version_picks_the_start_up_line(capsys: pytest.CaptureFixture[str]) -> None:
    """gpt-oss-20b, 40 GiB, 131,072 tokens: 873,808 on 0.19, 1,643,116 since (vLLM
    PRs #38364, #40694); the release is in the JSON beside the figures it decides."""
    args = ("gpt-oss-20b", "--kv-memory", "40 GiB", "--context", "131072")
    now = run_json(capsys, *args)
    old = run_json(capsys, *args, "--vllm-version", "0.19.0")
    assert (old["pool_tokens"], now["pool_tokens"]) == (873_808, 1_643_116)
    assert now["vllm_version"] == vllm_pool.DEFAULT_VLLM_VERSION
    assert old["vllm_version"] == "0.19.0" and old["pool_blocks"] == now["pool_blocks"]
    assert any("GPU KV cache size: 1,643,116 tokens" in n for n in now["notes"])


def test_linear_attention_pool_is_not_modelled_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"model_type": "qwen3_next", "hidden_size": 256, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "vocab_size": 1000, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32,
             "linear_value_head_dim": 32, "linear_num_key_heads": 2,
             "linear_num_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
             "moe_intermediate_size": 64}
        )
    )
    report = run_json(capsys, str(config), "--kv-memory", "1 GiB")
    assert report["block_bytes"] is None and report["seats"] is not None
    assert any("linear attention" in note for note in report["notes"])


def test_sglang_pool_in_kv_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """--engine sglang: the cell and pool of kvlib.paging.sglang_pool, the lines SGLang
    logs; an MLA pool has one KV buffer, so K and V are null."""
    from kvlib.paging import sglang_pool

    report = run_json(capsys, "DeepSeek-V3", "--kv-memory", "40 GiB", "--kv-dtype", "fp8",
                      "--engine", "sglang")
    s = report["sglang"]
    cell = 576 * 61
    assert report["engine"] == "sglang" and s["cell_size_bytes"] == cell
    assert s["max_total_num_tokens"] == 40 * GiB // cell
    assert s["k_size_bytes"] is None and s["v_size_bytes"] is None
    assert s["kv_size_bytes"] == (s["max_total_num_tokens"] + 1) * cell
    pool = sglang_pool.sglang_pool(load_config("DeepSeek-V3"), 40 * GiB, kv_dtype="fp8")
    assert s["startup_lines"] == list(pool.startup_lines)
    assert not any("vLLM" in note for note in report["notes"])


def test_sglang_pool_on_a_gpu_uses_its_fraction(capsys: pytest.CaptureFixture[str]) -> None:
    from kvlib.paging import sglang_pool

    h100 = get_gpu("H100-SXM")
    mine = run_json(capsys, "Llama-3.1-8B", "--gpu", "H100-SXM", "--engine", "sglang")
    s = mine["sglang"]
    fraction = sglang_pool.default_mem_fraction_static(h100.vllm_total_bytes, 1)
    rest = int(h100.vllm_total_bytes * fraction) - mine["weight_bytes_per_gpu"]
    assert s["mem_fraction_static"] == fraction and s["rest_memory_bytes"] == rest
    assert s["max_total_num_tokens"] == rest // (8 * 256 * 32 * 2)
    assert s["k_size_bytes"] == s["v_size_bytes"] and s["kv_size_bytes"] is None
    given = run_json(capsys, "Llama-3.1-8B", "--gpu", "H100-SXM", "--engine", "sglang",
                     "--mem-fraction-static", "0.7", "--page-size", "64")
    assert given["sglang"]["mem_fraction_static"] == 0.7
    assert given["sglang"]["max_total_num_tokens"] % 64 == 0
    assert given["sglang"]["max_total_num_tokens"] < s["max_total_num_tokens"]


def test_both_engines_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "Qwen3-8B", "--gpu", "H100-SXM", "--engine", "both"]) == 0
    table = capsys.readouterr().out
    assert "pool (vLLM)" in table and "pool (SGLang)" in table
    assert "KV Cache is allocated. #tokens: " in table and "GPU KV cache size" in table
    assert "share: vLLM gives the cache" in table and "granularity: vLLM counts whole" in table
    vllm_only = run_json(capsys, "Qwen3-8B", "--gpu", "H100-SXM")
    assert vllm_only["engine"] == "vllm" and vllm_only["sglang"] is None


def test_sglang_without_a_page_of_memory_would_not_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = run_json(capsys, "Llama-3.1-8B", "--kv-memory", "1 GiB", "--engine", "sglang",
                      "--page-size", str(2**20))
    assert report["sglang"]["max_total_num_tokens"] == 0
    assert report["sglang"]["startup_lines"] is None
    assert any("SGLang would not start: 'Not enough memory." in n for n in report["notes"])


def test_sglang_refuses_what_it_sizes_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "gpt-oss-20b", "--kv-memory", "40 GiB", "--engine", "both")
    assert report["sglang"] is None and report["pool_tokens"] is not None
    assert any("no SGLang pool figures" in n and "swa-full-tokens-ratio" in n
               for n in report["notes"])


@pytest.mark.parametrize("args", [["--mem-fraction-static", "1.2"], ["--engine", "tgi"],
                                  ["--page-size", "0"]])
def test_bad_sglang_flags_are_one_line(args: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "kvlib", "size", "Llama-3.1-8B", *args],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1].startswith("kvlib size: error:")
