"""Write kvlib/data/config_defaults.json: transformers' defaults for the fields kvlib reads.

A config.json may omit a field its config class fills in (a Gemma 3 text_config
has no num_attention_heads; transformers uses Gemma3TextConfig's 8). kvlib must
use the same defaults without importing transformers, so they are extracted here
from the pinned transformers release; tests/unit/test_config.py checks the file is current.

``--check`` compares the file with a fresh extraction, which imports every config class
(half a minute). The file records a fingerprint of what the extraction reads (the
transformers version, its configuration sources, this script) and a digest of its own
table: while both still match, a fresh extraction would write the same bytes, so the
check stops there; ``--check --full`` always extracts.

Usage: python scripts/gen_config_defaults.py [--check [--full]] [--file PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "kvlib" / "data" / "config_defaults.json"

FIELDS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "n_routed_experts",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "moe_intermediate_size",
    "n_shared_experts",
    "num_local_experts",
    "num_experts",
    "moe_layer_freq",
    "multi_query",
    "new_decoder_architecture",
    "parallel_attn",
    "bias",
    "n_positions",
    "n_layer",
    "n_head",
    "n_embd",
    "n_inner",
    "use_bidirectional_attention",
    "experts_per_token",
    "num_kv_shared_layers",
    "attention_k_eq_v",
    "attention_chunk_size",
    "no_rope_layer_interval",
    "index_head_dim",
    "index_n_heads",
    "index_topk",
    "qk_layernorm",
    "decoder_sparse_step",
    "shared_expert_intermediate_size",
    "max_position_embeddings",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_num_value_heads",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "linear_num_heads",
    "linear_head_dim",
)


def _jsonable(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str))


def derives(cls: Any, field: str) -> str | None:
    """The text ``model_type`` of ``cls`` when its config, built with no arguments,
    fills in the per-layer list ``field`` itself (a rule kvlib must know or refuse to
    guess)."""
    try:
        text = cls().get_text_config()
        values = getattr(text, field, None)
    except Exception:  # a class that needs arguments, or an optional dependency
        return None
    if isinstance(values, list) and values and isinstance(text.model_type, str):
        return text.model_type
    return None


def defaults() -> dict[str, Any]:
    """``{"models": {model_type: {field: default}}, "text_model_type": {outer: inner},
    "derived_layer_types": [text model_type...], "derived_indexer_types": [...]}``."""
    from transformers import CONFIG_MAPPING

    models: dict[str, dict[str, Any]] = {}
    text_types: dict[str, str] = {}
    derived: set[str] = set()
    derived_indexers: set[str] = set()
    for model_type in sorted(CONFIG_MAPPING.keys()):
        try:
            cls = CONFIG_MAPPING[model_type]
        except Exception:  # a config class whose optional dependency is missing
            continue
        values = {f: getattr(cls, f) for f in FIELDS if _jsonable(getattr(cls, f, None))}
        if values:
            models[model_type] = values
        text_cls = (getattr(cls, "sub_configs", None) or {}).get("text_config")
        inner = getattr(text_cls, "model_type", None)
        if isinstance(inner, str) and inner and inner != model_type:
            text_types[model_type] = inner
        if (name := derives(cls, "layer_types")) is not None:
            derived.add(name)
        if (name := derives(cls, "indexer_types")) is not None:
            derived_indexers.add(name)
    return {
        "transformers": _version(),
        "models": models,
        "text_model_type": text_types,
        "derived_layer_types": sorted(derived),
        "derived_indexer_types": sorted(derived_indexers),
    }


def _version() -> str:
    import transformers

    return str(transformers.__version__)


def fingerprint() -> str:
    """sha256 of what :func:`defaults` reads: the installed transformers' version, every
    ``configuration_*.py`` in it, and this script (its field list and rules), found
    without importing transformers."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise SystemExit("transformers is not installed: pip install the project's [dev] set")
    root = Path(spec.origin).parent
    digest = hashlib.sha256(importlib.metadata.version("transformers").encode())
    for path in [Path(__file__).resolve(), *sorted(root.rglob("configuration_*.py"))]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def table_digest(table: dict[str, Any]) -> str:
    """sha256 of the table as written, without its two digests."""
    body = {k: v for k, v in table.items() if k not in ("fingerprint", "table_sha256")}
    return hashlib.sha256(json.dumps(body, indent=1, sort_keys=True).encode()).hexdigest()


def render(table: dict[str, Any]) -> str:
    """The file's text: the table with the fingerprint and its own digest."""
    table = {**table, "fingerprint": fingerprint()}
    table["table_sha256"] = table_digest(table)
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


def unchanged(path: Path) -> bool:
    """True when the file is as this script wrote it and what it was extracted from is
    unchanged: a fresh extraction would give the same file."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return (table.get("fingerprint") == fingerprint()
            and table.get("table_sha256") == table_digest(table))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--full", action="store_true", help="with --check: always extract")
    parser.add_argument("--file", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.check and not args.full and unchanged(args.file):
        print(f"{args.file} is current (fingerprint {fingerprint()[:12]} unchanged)")
        return 0
    text = render(defaults())
    if args.check:
        if not args.file.is_file() or args.file.read_text() != text:
            print(f"{args.file} is out of date: run python scripts/gen_config_defaults.py")
            return 1
        print(f"{args.file} is current (extracted afresh)")
        return 0
    args.file.write_text(text)
    print(f"wrote {args.file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
