"""A Hugging Face model id (``OWNER/NAME[@revision]``) to the path of its ``config.json``.

The command line accepts a model id wherever it takes a config file. The local Hugging
Face cache is read first, so a model seen once sizes offline; otherwise ``config.json``
alone is downloaded (never weights), unless ``HF_HUB_OFFLINE`` forbids it.
``huggingface_hub`` is imported inside :func:`fetch_config` only: the arithmetic the
calculator runs in the browser never needs it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

from kvlib.config import ConfigError, ModelConfig, bundled_models, load_config

__all__ = ["fetch_config", "is_model_id", "load_model"]

# The Hub's repo id: an owner and a name of letters, digits, '-', '_' and '.'; an optional
# @revision (a branch, a tag or a commit hash).
_MODEL_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}(@[\w./-]+)?")

_LOCAL = "pass a local path to its config.json"


def is_model_id(text: str) -> bool:
    """Whether ``text`` has the form ``OWNER/NAME`` or ``OWNER/NAME@REVISION`` (a name
    ending in ``.json`` is a mistyped path, not a model)."""
    return _MODEL_ID.fullmatch(text) is not None and not text.lower().endswith(".json")


def fetch_config(model_id: str) -> Path:
    """The cached or downloaded ``config.json`` of ``model_id``; ConfigError in one line
    naming the id and the fix when the model is gated, private, missing or unreachable."""
    try:
        from huggingface_hub import constants, hf_hub_download, try_to_load_from_cache
        from huggingface_hub import errors as hub
    except ImportError:  # e.g. the calculator's Pyodide, which has no network client
        raise ConfigError(
            f"{model_id} reads as a Hugging Face model id, but huggingface_hub is not "
            f"installed here: `pip install huggingface_hub`, or {_LOCAL}"
        ) from None

    repo, _, revision = model_id.partition("@")
    quiet = logging.getLogger("huggingface_hub")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its retry warnings would add lines to the one error
    try:
        cached = try_to_load_from_cache(repo, "config.json", revision=revision or None)
        if isinstance(cached, str):
            return Path(cached)
        if constants.HF_HUB_OFFLINE:
            raise ConfigError(
                f"{model_id}: config.json is not in the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set: fetch it once "
                f"online, or {_LOCAL}"
            )
        return Path(hf_hub_download(repo, "config.json", revision=revision or None))
    except hub.GatedRepoError:
        raise ConfigError(
            f"{model_id} is gated: accept its terms on https://huggingface.co/{repo}, then "
            f"log in with `huggingface-cli login` (or set HF_TOKEN), or {_LOCAL}"
        ) from None
    except hub.RevisionNotFoundError:
        raise ConfigError(
            f"{model_id}: no revision {revision!r} of {repo}: check the branch, tag or "
            f"commit, or {_LOCAL}"
        ) from None
    except hub.RepositoryNotFoundError:
        raise ConfigError(
            f"{model_id}: no such model on the Hugging Face Hub, or a private one: check "
            f"the spelling, log in with `huggingface-cli login` if it is private, or {_LOCAL}"
        ) from None
    except hub.LocalEntryNotFoundError:
        raise ConfigError(
            f"{model_id}: config.json is not cached and the Hugging Face Hub cannot be "
            f"reached: check the network, or {_LOCAL}"
        ) from None
    except hub.EntryNotFoundError:
        raise ConfigError(
            f"{model_id} has no config.json (not a transformers model?): {_LOCAL}"
        ) from None
    except hub.HFValidationError:
        raise ConfigError(
            f"{model_id!r} is not a valid Hugging Face model id (OWNER/NAME[@revision]): "
            f"check the spelling, or {_LOCAL}"
        ) from None
    except (hub.HfHubHTTPError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{model_id}: cannot fetch config.json ({reason}): {_LOCAL}") from None
    finally:
        quiet.setLevel(level)


def load_model(source: str) -> ModelConfig:
    """MODEL as every command reads it: a local config.json or its folder, a bundled name,
    or else a Hugging Face model id (its cached or downloaded config.json, the model then
    named by the id rather than by the cache folder). ConfigError in one line otherwise."""
    local = Path(source).exists() or source.lower() in {m.lower() for m in bundled_models()}
    if local or not is_model_id(source):
        return load_config(source)  # load_config names the bundled models and the fix
    return dataclasses.replace(load_config(fetch_config(source)), name=source)
