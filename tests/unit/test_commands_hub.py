"""kvlib.commands.hub: ``kvlib size OWNER/NAME[@revision]`` reads config.json from the
Hugging Face cache (laid out as huggingface_hub lays it out: refs, snapshots), offline,
and names the id and the fix in one line when it cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvlib.commands import hub
from kvlib.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "kvlib" / "data" / "configs"
MAIN = "a" * 40  # the commit refs/main points at
TAGGED = "b" * 40  # the commit the tag v1 points at


def make_cache(folder: Path) -> Path:
    """A Hugging Face hub cache holding acme/tiny-llama: main is Llama-3.1-8B's config,
    tag v1 the same with 2 layers."""
    repo = folder / "models--acme--tiny-llama"
    config = json.loads((BUNDLED / "Llama-3.1-8B.json").read_text())
    for commit, layers in ((MAIN, 32), (TAGGED, 2)):
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (snapshot / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v1").write_text(TAGGED)
    return folder


def size(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "kvlib", "size", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env)


def report(cache: Path, *args: str) -> dict[str, Any]:
    result = size(cache, *args, "--json")
    assert result.returncode == 0, result.stderr
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def test_a_model_id_reads_the_cached_config_offline(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    main = report(cache, "acme/tiny-llama")
    bundled = report(cache, "Llama-3.1-8B")
    assert main["model"] == "acme/tiny-llama"
    assert main["kv_bytes_per_token"] == bundled["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2


def test_a_revision_is_a_ref_or_a_commit(tmp_path: Path) -> None:
    cache = make_cache(tmp_path)
    for revision in ("v1", TAGGED):
        tagged = report(cache, f"acme/tiny-llama@{revision}")
        assert tagged["num_hidden_layers"] == 2 and tagged["model"].endswith(revision)
    assert report(cache, f"acme/tiny-llama@{MAIN}")["num_hidden_layers"] == 32


@pytest.mark.parametrize("model_id", ["acme/other-model", "acme/tiny-llama@v2"])
def test_a_miss_offline_is_one_line_naming_the_id_and_the_fix(
    tmp_path: Path, model_id: str
) -> None:
    result = size(make_cache(tmp_path), model_id)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert model_id in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert "pass a local path" in result.stderr


def test_a_local_file_and_a_bundled_name_win_over_the_hub(tmp_path: Path) -> None:
    folder = tmp_path / "acme" / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text((BUNDLED / "Qwen3-4B.json").read_text())
    local = report(make_cache(tmp_path / "cache"), str(folder))
    assert local["num_hidden_layers"] == 36


@pytest.mark.parametrize(
    ("text", "expected"),
    [("Qwen/Qwen3-14B", True), ("meta-llama/Llama-3.1-8B@main", True),
     ("acme/x@0123abc", True), ("Llama-3.1-8B", False), ("./configs/x.json", False),
     ("/abs/path", False), ("a/b/c", False), ("configs/llama.json", False)],
)
def test_what_reads_as_a_model_id(text: str, expected: bool) -> None:
    assert hub.is_model_id(text) is expected


def _http_error(kind: type[Exception], status: int) -> Exception:
    import httpx2

    response = httpx2.Response(status, request=httpx2.Request("GET", "https://huggingface.co/x"))
    return kind("refused", response=response)


@pytest.mark.parametrize(
    ("error", "needle"),
    [("GatedRepoError", "huggingface-cli login"),
     ("RepositoryNotFoundError", "check the spelling"),
     ("RevisionNotFoundError", "no revision 'v9'"),
     ("RemoteEntryNotFoundError", "has no config.json")],
)
def test_gated_private_and_missing_models_name_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: str, needle: str
) -> None:
    """What the Hub answers (403 gated, 404 missing or private, a bad revision, no
    config.json), raised by hf_hub_download as huggingface_hub raises it."""
    import huggingface_hub
    from huggingface_hub import errors

    def refuse(*args: Any, **kwargs: Any) -> str:
        raise _http_error(getattr(errors, error), 404)

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    with pytest.raises(ConfigError) as raised:
        hub.fetch_config("acme/secret@v9")
    message = str(raised.value)
    assert message.startswith("acme/secret") and needle in message and "\n" not in message


def test_no_network_names_the_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub import errors

    def offline(*args: Any, **kwargs: Any) -> str:
        raise errors.LocalEntryNotFoundError("no connection")

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ConfigError, match="acme/x: config.json is not cached and the Hugging"):
        hub.fetch_config("acme/x")
