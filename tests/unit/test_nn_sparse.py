"""kvlib.nn.sparse against transformers' DeepseekV32Indexer, dense attention and SDPA, with
FLOPs and bytes counted against :func:`kvlib.mla.latent_read_cost`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_nn_mla import ReadElements
from torch.utils.flop_counter import FlopCounterMode
from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
    DeepseekV32Config,
    DeepseekV32Indexer,
)

from kvlib.mla import IndexerShape, MLAShape, latent_read_cost
from kvlib.nn.mla import rope_angles
from kvlib.nn.sparse import LightningIndexer, attend_dense, attend_selected, select_top_k

HIDDEN, Q_LORA, HEADS, HEAD_DIM, ROPE = 32, 16, 4, 16, 8


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def indexer(seed: int = 0) -> LightningIndexer:
    module = LightningIndexer(HIDDEN, Q_LORA, HEADS, HEAD_DIM, ROPE)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return module.eval()


def test_indexer_picks_what_transformers_picks() -> None:
    config = DeepseekV32Config(
        hidden_size=HIDDEN,
        q_lora_rank=Q_LORA,
        index_n_heads=HEADS,
        index_head_dim=HEAD_DIM,
        qk_rope_head_dim=ROPE,
        index_topk=5,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        kv_lora_rank=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        vocab_size=32,
        intermediate_size=16,
        moe_intermediate_size=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
    )
    theirs = DeepseekV32Indexer(config, layer_idx=0).eval()
    ours = indexer()
    theirs.load_state_dict(ours.state_dict())
    batch, tokens = 2, 24
    hidden, query_input = randn(batch, tokens, HIDDEN, seed=1), randn(batch, tokens, Q_LORA, seed=2)
    positions = torch.arange(tokens)
    cos, sin = rope_angles(positions, ROPE)
    full = (
        torch.cat([cos, cos], -1)[None],
        torch.cat([sin, sin], -1)[None],
    )  # transformers' layout
    causal = (positions[None, :] <= positions[:, None])[None].expand(batch, -1, -1)
    with torch.no_grad():
        expected = theirs(hidden, query_input, full, causal, None)  # (B, S, 5), score order
        scores = ours.scores(hidden, query_input, ours.keys(hidden, cos, sin), cos, sin)
    indices, valid = select_top_k(scores, config.index_topk, positions)
    for b in range(batch):
        for s in range(config.index_topk - 1, tokens):  # queries that see >= 5 tokens
            assert set(indices[b, s].tolist()) == set(expected[b, s].tolist())
            assert bool(valid[b, s].all())


def test_top_k_sees_only_the_past_and_keeps_cache_order() -> None:
    tokens, top_k = 10, 4
    scores = randn(1, tokens, tokens, seed=3)
    scores[..., -1] = 1e9  # the future token would win everywhere if it were visible
    positions = torch.arange(tokens)
    indices, valid = select_top_k(scores, top_k, positions)
    assert bool((indices[..., 1:] > indices[..., :-1]).all())  # ascending
    assert bool((indices[valid] <= positions[None, :, None].expand_as(indices)[valid]).all())
    # The first query sees one token: one valid pick, the rest are masked fillers.
    assert valid[0, 0].tolist() == [True, False, False, False]
    assert int(indices[0, tokens - 1, -1]) == tokens - 1  # the last query may pick it
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        select_top_k(scores, 0, positions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_k_of_the_whole_context_is_dense_attention_exactly(dtype: torch.dtype) -> None:
    batch, heads, tokens, key_dim, value_dim = 2, 3, 17, 12, 8
    q = randn(batch, heads, tokens, key_dim, seed=4, dtype=dtype)
    keys = randn(batch, tokens, key_dim, seed=5, dtype=dtype)
    values = keys[..., :value_dim]  # MLA's value is the start of its key, as here
    positions = torch.arange(tokens)
    indices, valid = select_top_k(randn(batch, tokens, tokens, seed=6), tokens, positions)
    assert torch.equal(indices, positions.expand(batch, tokens, tokens))  # every token
    sparse = attend_selected(q, keys, values, indices, valid, 0.25)
    dense = attend_dense(q, keys, values, positions, 0.25)
    assert torch.equal(sparse, dense)  # bit for bit: selection and gathering change nothing
    reference = F.scaled_dot_product_attention(
        q.double(),
        keys.double()[:, None].expand(-1, heads, -1, -1),
        values.double()[:, None].expand(-1, heads, -1, -1),
        attn_mask=positions[None, :] <= positions[:, None],
        scale=0.25,
    )
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(dense.double(), reference, rtol=0, atol=tolerance)


def test_fewer_tokens_is_attention_masked_to_the_selection() -> None:
    batch, heads, tokens, key_dim, value_dim, top_k = 2, 3, 40, 12, 8, 6
    q = randn(batch, heads, 1, key_dim, seed=7, dtype=torch.float64)
    keys = randn(batch, tokens, key_dim, seed=8, dtype=torch.float64)
    values = keys[..., :value_dim]
    position = torch.tensor([tokens - 1])
    indices, valid = select_top_k(randn(batch, 1, tokens, seed=9), top_k, position)
    sparse = attend_selected(q, keys, values, indices, valid, 0.3)
    chosen = torch.zeros(batch, 1, tokens, dtype=torch.bool).scatter(-1, indices, True)
    reference = F.scaled_dot_product_attention(
        q,
        keys[:, None].expand(-1, heads, -1, -1),
        values[:, None].expand(-1, heads, -1, -1),
        attn_mask=chosen[:, None],
        scale=0.3,
    )
    torch.testing.assert_close(sparse, reference, rtol=0, atol=1e-12)
    dense = attend_dense(q, keys, values, position, 0.3)
    assert (sparse - dense).abs().max() > 1e-3  # dropping tokens does change the output


# DeepSeek-style shapes, small: 4 query heads over a 40 + 8 latent, indexer 4 x 16.
MLA = MLAShape(HIDDEN, 4, 40, ROPE, 16, 16, q_lora_rank=Q_LORA)
INDEXER = IndexerShape(HEADS, HEAD_DIM, top_k=8)


def decode_step(tokens: int) -> tuple[int, int, ReadElements]:
    """One query token over ``tokens`` cached ones: FLOPs of scoring and of attention,
    and the elements of the caches each read."""
    indexer_module = indexer()
    hidden = randn(1, tokens, HIDDEN, seed=10)
    positions = torch.arange(tokens)
    cos, sin = rope_angles(positions, ROPE)
    with torch.no_grad():
        index_keys = indexer_module.keys(hidden, cos, sin)  # (1, T, d_I): cached
    latent = randn(1, tokens, MLA.latent_dim, seed=11)  # (1, T, d_c + d_r): cached
    q = randn(1, MLA.num_heads, 1, MLA.latent_dim, seed=12)  # absorbed query
    query = hidden[:, -1:]
    last = positions[-1:]
    watched = {"latent": latent, "index_keys": index_keys}
    with torch.no_grad(), ReadElements(watched) as reads:
        with FlopCounterMode(display=False) as scoring:
            scores = indexer_module.scores(
                query, randn(1, 1, Q_LORA, seed=13), index_keys, cos[-1:], sin[-1:]
            )
        indices, valid = select_top_k(scores, INDEXER.top_k, last)
        with FlopCounterMode(display=False) as attention:
            attend_selected(q, latent, latent[..., : MLA.kv_lora_rank], indices, valid, 0.1)
    projections = 2 * (Q_LORA * HEADS * HEAD_DIM + HIDDEN * HEADS)  # wq_b and weights_proj
    return (
        int(scoring.get_total_flops()) - projections,
        int(attention.get_total_flops()),
        reads,
    )


@pytest.mark.parametrize("tokens", [5, 8, 9, 64])
def test_flops_and_bytes_are_counted(tokens: int) -> None:
    scoring_flops, attention_flops, reads = decode_step(tokens)
    cost = latent_read_cost(
        MLA,
        tokens,
        latent_bytes_per_token=MLA.latent_dim * 4,
        indexer=INDEXER,
        indexer_bytes_per_token=HEAD_DIM * 4,
    )
    assert cost.selected_tokens == min(tokens, INDEXER.top_k)
    assert scoring_flops == cost.indexer_flops
    assert attention_flops == cost.attention_flops
    assert reads.bytes_read("index_keys") == cost.indexer_bytes  # every key is scored
    assert reads.bytes_read("latent") == cost.attention_bytes  # only the chosen rows


def test_dense_cost_is_the_whole_context() -> None:
    dense = latent_read_cost(MLA, 64, latent_bytes_per_token=MLA.latent_dim * 4)
    sparse = latent_read_cost(
        MLA, 64, MLA.latent_dim * 4, indexer=INDEXER, indexer_bytes_per_token=HEAD_DIM * 4
    )
    assert dense.selected_tokens == 64 and dense.indexer_flops == dense.indexer_bytes == 0
    assert dense.attention_flops == 64 // INDEXER.top_k * sparse.attention_flops
    with pytest.raises(ValueError, match="indexer_bytes_per_token"):
        latent_read_cost(MLA, 64, 100, indexer=INDEXER)


def test_every_tensor_follows_the_inputs_device() -> None:
    with torch.device("meta"):
        module = LightningIndexer(HIDDEN, Q_LORA, HEADS, HEAD_DIM, ROPE)
    tokens = 6
    hidden = torch.empty(1, tokens, HIDDEN, device="meta")
    positions = torch.arange(tokens, device="meta")
    cos, sin = rope_angles(positions, ROPE)
    keys = module.keys(hidden, cos, sin)
    scores = module.scores(hidden, torch.empty(1, tokens, Q_LORA, device="meta"), keys, cos, sin)
    indices, valid = select_top_k(scores, 3, positions)
    q = torch.empty(1, 2, tokens, HEAD_DIM, device="meta")
    out = attend_selected(q, keys, keys, indices, valid, 0.1)
    dense = attend_dense(q, keys, keys, positions, 0.1)
    assert out.device.type == dense.device.type == "meta"
