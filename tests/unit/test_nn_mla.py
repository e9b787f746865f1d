"""kvlib.nn.mla against transformers' DeepseekV3Attention, a float64 reference, kvlib's cache
sizes, and FLOPs and bytes counted while it runs.

Oracles: transformers 5.23 ``DeepseekV3Attention`` with the same weights (its cache
holds the latent, ``tests/refmodels.py``); the same layer in float64; kvlib.sizing for
the bytes the cache holds; ``torch.utils.flop_counter.FlopCounterMode`` and a dispatch
mode that marks every element each op reads, for :func:`kvlib.mla.mla_step_cost`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from transformers import DeepseekV3Config
from transformers.cache_utils import DynamicCache
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

from kvlib.config import load_config
from kvlib.mla import MLAShape, mla_step_cost
from kvlib.nn.mla import LatentCache, MLAAttention, rope_angles
from kvlib.sizing import kv_bytes, kv_bytes_by_layer, kv_bytes_per_token_per_layer

# Small shapes with every MLA feature: a query LoRA or none, d_n != d_v, RoPE on 8 dims.
SHAPES = {
    "q-lora": MLAShape(64, 4, 32, 8, 16, 12, q_lora_rank=24),
    "no-q-lora": MLAShape(48, 3, 24, 8, 16, 16, q_lora_rank=None),
}
# DeepSeek-V3's latent (512 + 64) on a layer small enough to build: the cache is the same.
V3_LATENT = MLAShape(64, 2, 512, 64, 16, 16, q_lora_rank=None)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def layer(shape: MLAShape, dtype: torch.dtype = torch.float32, seed: int = 0) -> MLAAttention:
    """Random weights large enough that attention is far from uniform."""
    module = MLAAttention(shape, dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return module.eval()


def hidden(shape: MLAShape, tokens: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, tokens, shape.hidden_size, generator=generator).to(dtype)


def as_dtype(module: MLAAttention, dtype: torch.dtype) -> MLAAttention:
    copy = MLAAttention(module.shape, dtype=dtype)
    copy.load_state_dict({k: v.to(dtype) for k, v in module.state_dict().items()})
    return copy.eval()


def prefill_then_decode(module: MLAAttention, x: torch.Tensor, path: str) -> torch.Tensor:
    """Outputs of a prefill of all but the last token, then one decode step, concatenated."""
    cache = LatentCache()
    with torch.no_grad():
        first = module(x[:, :-1], cache, path)  # type: ignore[arg-type]
        last = module(x[:, -1:], cache, path)  # type: ignore[arg-type]
    return torch.cat([first, last], dim=1)


def one_layer_config(shape: MLAShape) -> dict[str, object]:
    """A one-layer DeepSeek config.json with ``shape``'s attention, for kvlib.sizing."""
    return {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 1,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_heads,
        "kv_lora_rank": shape.kv_lora_rank,
        "qk_rope_head_dim": shape.qk_rope_head_dim,
        "qk_nope_head_dim": shape.qk_nope_head_dim,
        "v_head_dim": shape.v_head_dim,
        "q_lora_rank": shape.q_lora_rank,
    }


# --- against transformers ------------------------------------------------------------


def transformers_layer(shape: MLAShape) -> tuple[DeepseekV3Attention, DeepseekV3RotaryEmbedding]:
    config = DeepseekV3Config(
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        kv_lora_rank=shape.kv_lora_rank,
        q_lora_rank=shape.q_lora_rank,
        qk_rope_head_dim=shape.qk_rope_head_dim,
        qk_nope_head_dim=shape.qk_nope_head_dim,
        v_head_dim=shape.v_head_dim,
        num_hidden_layers=1,
        vocab_size=32,
        intermediate_size=32,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
    )
    config._attn_implementation = "eager"
    return DeepseekV3Attention(config, layer_idx=0).eval(), DeepseekV3RotaryEmbedding(config)


def run_transformers(
    attention: DeepseekV3Attention,
    rotary: DeepseekV3RotaryEmbedding,
    x: torch.Tensor,
    cache: DynamicCache,
    past: int,
) -> torch.Tensor:
    batch, new = x.shape[:2]
    positions = torch.arange(past, past + new)
    cos, sin = rotary(x, positions[None].expand(batch, -1))
    future = torch.arange(past + new)[None, :] > positions[:, None]
    mask = torch.zeros(batch, 1, new, past + new).masked_fill(future, float("-inf"))
    with torch.no_grad():
        out, _ = attention(x, (cos, sin), mask, past_key_values=cache)
    return out


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_matches_transformers_and_caches_the_same_latent(name: str) -> None:
    shape = SHAPES[name]
    theirs, rotary = transformers_layer(shape)
    ours = layer(shape)
    theirs.load_state_dict(ours.state_dict())  # same module names, same shapes
    x = hidden(shape, 9)
    their_cache, our_cache = DynamicCache(config=theirs.config), LatentCache()
    expected = torch.cat(
        [
            run_transformers(theirs, rotary, x[:, :8], their_cache, 0),
            run_transformers(theirs, rotary, x[:, 8:], their_cache, 8),
        ],
        dim=1,
    )
    for path in ("naive", "absorbed"):
        cache = LatentCache() if path == "absorbed" else our_cache
        with torch.no_grad():
            got = torch.cat([ours(x[:, :8], cache, path), ours(x[:, 8:], cache, path)], dim=1)
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)
    # transformers keeps kv_nope in its "keys" slot and the rotated key in "values".
    stored = their_cache.layers[0]
    assert our_cache.latent is not None
    assert torch.equal(our_cache.latent[..., : shape.kv_lora_rank], stored.keys[:, 0])
    assert torch.equal(our_cache.latent[..., shape.kv_lora_rank :], stored.values[:, 0])


def test_parameter_count_is_the_shapes_and_transformers() -> None:
    for shape in SHAPES.values():
        theirs, _ = transformers_layer(shape)
        ours = layer(shape)
        count = sum(p.numel() for p in ours.parameters())
        assert count == sum(p.numel() for p in theirs.parameters()) == shape.attention_params


# --- naive against absorbed ----------------------------------------------------------

# Tolerances relative to the largest output magnitude, measured on these shapes with
# margin: fp32 paths agree to about 1e-7 of the output scale, bf16 to about 1e-2
# (bf16 keeps 8 significant bits; the two paths round different intermediates).
TOLERANCE = {"fp32": 2e-6, "bf16": 4e-2}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_naive_and_absorbed_agree_with_a_float64_reference(name: str, dtype: str) -> None:
    shape = SHAPES[name]
    reference_layer = layer(shape, torch.float64)
    x64 = hidden(shape, 12, torch.float64)
    reference = prefill_then_decode(reference_layer, x64, "naive")
    scale = reference.abs().max().item()
    module = as_dtype(reference_layer, DTYPES[dtype])
    x = x64.to(DTYPES[dtype])
    outputs = {
        path: prefill_then_decode(module, x, path).double() for path in ("naive", "absorbed")
    }
    for path, out in outputs.items():
        assert (out - reference).abs().max().item() <= TOLERANCE[dtype] * scale, path
    gap = (outputs["naive"] - outputs["absorbed"]).abs().max().item()
    assert gap <= TOLERANCE[dtype] * scale
    # In float64 the two paths are the same function to rounding.
    absorbed64 = prefill_then_decode(reference_layer, x64, "absorbed")
    assert (absorbed64 - reference).abs().max().item() <= 1e-12 * scale


def test_cached_decode_equals_recomputing_the_whole_sequence() -> None:
    shape = SHAPES["q-lora"]
    module = layer(shape, torch.float64)
    x = hidden(shape, 10, torch.float64)
    with torch.no_grad():
        whole = module(x, None, "naive")
    for path in ("naive", "absorbed"):
        torch.testing.assert_close(prefill_then_decode(module, x, path), whole, rtol=0, atol=1e-12)


# --- the cache's bytes ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cache_holds_kvlibs_bytes(dtype: str) -> None:
    shape = V3_LATENT
    module = layer(shape, DTYPES[dtype])
    cache = LatentCache()
    with torch.no_grad():
        module(hidden(shape, 13, DTYPES[dtype]), cache, "absorbed")
        module(hidden(shape, 1, DTYPES[dtype]), cache, "absorbed")
    one_layer = load_config(one_layer_config(shape))
    batch, tokens = 2, 14
    assert cache.tokens == tokens
    assert cache.nbytes == kv_bytes(one_layer, tokens, dtype, batch=batch)
    # The same bytes per token as one layer of the real DeepSeek-V3 (512 + 64 latent).
    real = load_config("DeepSeek-V3")
    assert cache.nbytes == batch * tokens * kv_bytes_per_token_per_layer(real, 0, dtype)


# --- FLOPs and bytes, counted --------------------------------------------------------


def counted_flops(module: MLAAttention, context: int, new: int, path: str) -> int:
    shape = module.shape
    cache = LatentCache()
    x = hidden(shape, context)[:1]
    with torch.no_grad():
        if context > new:
            module(x[:, : context - new], cache, path)  # type: ignore[arg-type]
        with FlopCounterMode(display=False) as counter:
            module(x[:, context - new :], cache, path)  # type: ignore[arg-type]
    return int(counter.get_total_flops())


@pytest.mark.parametrize("path", ["naive", "absorbed"])
@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize(("context", "new"), [(2, 1), (37, 1), (20, 20), (30, 6)])
def test_flops_are_counted(name: str, path: str, context: int, new: int) -> None:
    """At least two cached tokens: torch.einsum contracts a length-1 dimension with a
    broadcast multiply, which FlopCounterMode (matrix products only) does not count."""
    module = layer(SHAPES[name])
    cost = mla_step_cost(SHAPES[name], context, path, query_tokens=new)  # type: ignore[arg-type]
    assert counted_flops(module, context, new, path) == cost.flops


class ReadElements(TorchDispatchMode):
    """Marks, per watched tensor's storage, every element an aten op reads.

    View ops (slices, reshapes, expands) read nothing; ``gather`` reads only the
    elements its index picks; any other op reads every element of its inputs.
    """

    def __init__(self, watched: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.storages = {
            t.untyped_storage().data_ptr(): (name, t.element_size()) for name, t in watched.items()
        }
        self.marks: dict[int, torch.Tensor] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.gather.default:
            source, dim, index = args[:3]
            if self._watched(source):
                self._mark(source, lambda grid: grid.gather(dim, index))
        elif not func.is_view:
            for arg in torch.utils._pytree.tree_leaves((args, kwargs)):
                if isinstance(arg, torch.Tensor) and self._watched(arg):
                    self._mark(arg, lambda grid: grid)
        return func(*args, **kwargs)

    def _watched(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self.storages

    def _mark(self, view: torch.Tensor, pick: Any) -> None:
        ptr = view.untyped_storage().data_ptr()
        size = view.untyped_storage().nbytes() // view.element_size()
        marks = self.marks.setdefault(ptr, torch.zeros(size, dtype=torch.bool))
        grid = torch.arange(size).as_strided(view.shape, view.stride(), view.storage_offset())
        marks[pick(grid)] = True

    def bytes_read(self, prefix: str) -> int:
        """Bytes of distinct elements read from watched tensors named ``prefix...``."""
        return sum(
            int(marks.sum()) * self.storages[ptr][1]
            for ptr, marks in self.marks.items()
            if self.storages[ptr][0].startswith(prefix)
        )


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("path", ["naive", "absorbed"])
def test_bytes_read_are_counted(path: str, dtype: str) -> None:
    shape, context = SHAPES["q-lora"], 23
    module = layer(shape, DTYPES[dtype])
    cache = LatentCache()
    x = hidden(shape, context, DTYPES[dtype])
    with torch.no_grad():
        module(x[:, :-1], cache, path)  # type: ignore[arg-type]
        # Append the new token's latent first, so the step reads the cache in place.
        positions = torch.arange(context - 1, context)
        cos, sin = rope_angles(positions, shape.qk_rope_head_dim)
        latent = cache.append(module.compress(x[:, -1:], cos, sin))
        q_nope, q_rope = module.queries(x[:, -1:], cos, sin)
        no_future = torch.zeros(1, context, dtype=torch.bool)
        watched = {"cache": latent} | {f"w.{n}": p for n, p in module.named_parameters()}
        step = module._naive if path == "naive" else module._absorbed
        with ReadElements(watched) as reads:
            step(q_nope, q_rope, latent, no_future)
    cost = mla_step_cost(shape, context, path, kv_dtype=dtype, weight_dtype=dtype)  # type: ignore[arg-type]
    batch = x.shape[0]
    assert reads.bytes_read("cache") == batch * cost.cache_bytes
    # Both paths read all of kv_b_proj (W_UK and W_UV) and, inside attention, no other weight.
    kv_b = shape.kv_b_params * module.kv_b_proj.weight.element_size()
    assert reads.bytes_read("w.") == reads.bytes_read("w.kv_b_proj.weight") == kv_b
    keys, values = module.expand_kv(latent)
    decompressed = keys.nbytes + values.nbytes
    if path == "naive":
        assert decompressed == batch * cost.decompressed_bytes
    else:
        assert cost.decompressed_bytes == 0
    # The decompressed keys and values are the cache transformers 4.x kept (kvlib's
    # "decompressed" layout), per layer.
    one_layer = load_config(one_layer_config(shape))
    layout = kv_bytes_by_layer(one_layer, context, dtype, mla_layout="decompressed")
    assert decompressed == batch * layout[0]


def test_every_weight_is_read_once_per_step() -> None:
    """The whole step reads each attention weight in full: cost.weight_bytes."""
    shape, context = SHAPES["q-lora"], 11
    for path in ("naive", "absorbed"):
        module = layer(shape)
        cache = LatentCache()
        x = hidden(shape, context)
        with torch.no_grad():
            module(x[:, :-1], cache, path)  # type: ignore[arg-type]
            watched = {f"w.{n}": p for n, p in module.named_parameters()}
            with ReadElements(watched) as reads:
                module(x[:, -1:], cache, path)  # type: ignore[arg-type]
        cost = mla_step_cost(shape, context, path, weight_dtype="fp32")  # type: ignore[arg-type]
        assert reads.bytes_read("w.") == cost.weight_bytes


def test_bad_arguments_are_named() -> None:
    module = layer(SHAPES["q-lora"])
    with pytest.raises(ValueError, match="path must be"):
        module(hidden(SHAPES["q-lora"], 3), None, "fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="qk_rope_head_dim must be even"):
        MLAAttention(MLAShape(64, 2, 32, 7, 16, 16))


def test_every_tensor_follows_the_inputs_device() -> None:
    """On the meta device, a tensor made on the CPU by mistake fails the forward pass: the
    layer runs unchanged on a GPU."""
    with torch.device("meta"):
        module = MLAAttention(SHAPES["q-lora"])
    x = torch.empty(2, 5, SHAPES["q-lora"].hidden_size, device="meta")
    for path in ("naive", "absorbed"):
        cache = LatentCache()
        module(x, cache, path)  # type: ignore[arg-type]
        out = module(x[:, :1], cache, path)  # type: ignore[arg-type]
        assert out.device.type == "meta" and out.shape == (2, 1, SHAPES["q-lora"].hidden_size)
