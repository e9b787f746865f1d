"""kvlib.nn.decoder against transformers' LlamaForCausalLM holding the same weights.

The tiny decoder reads its keys and values through scattered cache slots (a
shuffled block table); transformers keeps a contiguous cache. Same weights, same
prompt: the logits must agree within 1e-5 (transformers computes RMSNorm and the
rotary tables in float32 even for a float64 model; the tiny decoder stays in
float64), and greedy decoding must pick the same tokens. Runs on the CPU.
"""

from __future__ import annotations

import random

import pytest
import torch

from kvlib.config import load_config
from kvlib.nn.decoder import QUERY_BLOCK, PagedKV, SeqInput, TinyDecoder, tiny_config

BLOCK = 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _reference(model: TinyDecoder) -> torch.nn.Module:
    """transformers' Llama with ``model``'s weights (no download)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in tiny_config().items() if not k.startswith("_")}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()
    state = {
        "model.embed_tokens.weight": model.embed_tokens.weight,
        "model.norm.weight": model.norm.weight,
        "lm_head.weight": model.lm_head.weight,
    }
    for i, layer in enumerate(model.layers):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[f"model.layers.{i}.self_attn.{name}.weight"] = getattr(layer, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            state[f"model.layers.{i}.mlp.{name}.weight"] = getattr(layer, name).weight
        for name in ("input_layernorm", "post_attention_layernorm"):
            state[f"model.layers.{i}.{name}.weight"] = getattr(layer, name).weight
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    return reference


def _slots(num_tokens: int, table: list[int]) -> list[int]:
    return [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(num_tokens)]


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(load_config(tiny_config()), seed=3)


def test_logits_and_greedy_tokens_equal_transformers(model: TinyDecoder) -> None:
    reference = _reference(model)
    rng = random.Random(0)
    prompt = [rng.randrange(512) for _ in range(19)]
    table = rng.sample(range(32), 32)  # physical blocks in a scrambled order
    kv = PagedKV(model.cfg, 32, BLOCK, torch.float64)
    ours = model.forward_batch([SeqInput(prompt, 0, _slots(len(prompt), table))], kv)
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0, -1]
    assert torch.allclose(ours[0], theirs, rtol=0, atol=1e-5)
    tokens = list(prompt)
    for _ in range(8):  # decode through the paged cache, one token a step
        nxt = int(ours[0].argmax())
        with torch.no_grad():
            expected = int(reference(torch.tensor([tokens])).logits[0, -1].argmax())
        assert nxt == expected
        tokens.append(nxt)
        step = SeqInput([nxt], len(tokens) - 1, _slots(len(tokens), table))
        ours = model.forward_batch([step], kv)


def test_a_long_prompt_whole_and_in_chunks_equals_transformers(model: TinyDecoder) -> None:
    """A prompt longer than two query blocks (each block reads only the keys its queries
    see), prefilled in one pass, then in chunks that start and end inside blocks (chunked
    prefill): the last token's logits of every pass are transformers' at that position."""
    reference = _reference(model)
    rng = random.Random(2)
    prompt = [rng.randrange(512) for _ in range(2 * QUERY_BLOCK + 88)]
    blocks = -(-len(prompt) // BLOCK)
    table = rng.sample(range(blocks), blocks)
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0]  # every position's logits
    whole = model.forward_batch([SeqInput(prompt, 0, _slots(len(prompt), table))],
                                PagedKV(model.cfg, blocks, BLOCK, torch.float64))
    assert torch.allclose(whole[0], theirs[-1], rtol=0, atol=1e-5)
    kv, start = PagedKV(model.cfg, blocks, BLOCK, torch.float64), 0
    for end in (100, 100 + QUERY_BLOCK + 30, len(prompt)):
        chunk = model.forward_batch([SeqInput(prompt[start:end], start, _slots(end, table))], kv)
        assert torch.allclose(chunk[0], theirs[end - 1], rtol=0, atol=1e-5), (start, end)
        start = end


def test_a_batch_equals_its_sequences_alone(model: TinyDecoder) -> None:
    rng = random.Random(1)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (3, 17, 9)]
    tables = [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]]
    together = model.forward_batch(
        [SeqInput(p, 0, _slots(len(p), t)) for p, t in zip(prompts, tables, strict=True)],
        PagedKV(model.cfg, 16, BLOCK, torch.float64),
    )
    for i, (prompt, table) in enumerate(zip(prompts, tables, strict=True)):
        alone = model.forward_batch(
            [SeqInput(prompt, 0, _slots(len(prompt), table))],
            PagedKV(model.cfg, 16, BLOCK, torch.float64),
        )
        assert torch.allclose(together[i], alone[0], rtol=0, atol=1e-12)


def test_decodes_of_different_lengths_beside_a_prompt_equal_each_alone(
        model: TinyDecoder) -> None:
    """One pass with three decodes (6, 13 and 31 tokens: the shorter ones padded in the
    batched product) and a prompt: each decode's logits are those of its whole sequence
    prefilled alone, through the per-sequence path, and the prompt's are its own."""
    rng = random.Random(4)
    sequences = [[rng.randrange(512) for _ in range(n)] for n in (6, 13, 31, 7)]
    blocks = rng.sample(range(40), 40)  # scattered blocks, ten a sequence
    tables = [blocks[10 * i : 10 * i + 10] for i in range(4)]
    kv = PagedKV(model.cfg, 40, BLOCK, torch.float64)
    for tokens, table in zip(sequences[:3], tables, strict=False):  # cache all but the last
        model.forward_batch([SeqInput(tokens[:-1], 0, _slots(len(tokens) - 1, table))], kv)
    batch = [SeqInput(t[-1:], len(t) - 1, _slots(len(t), table))
             for t, table in zip(sequences[:3], tables, strict=False)]
    batch.append(SeqInput(sequences[3], 0, _slots(len(sequences[3]), tables[3])))
    together = model.forward_batch(batch, kv)
    for i, (tokens, table) in enumerate(zip(sequences, tables, strict=True)):
        alone = model.forward_batch([SeqInput(tokens, 0, _slots(len(tokens), table))],
                                    PagedKV(model.cfg, 40, BLOCK, torch.float64))
        assert torch.allclose(together[i], alone[0], rtol=0, atol=1e-12), i


def test_cache_bytes_are_kvlibs(model: TinyDecoder) -> None:
    from kvlib.sizing import summed_page_bytes

    kv = PagedKV(model.cfg, 10, BLOCK, torch.float64)
    assert kv.nbytes == 10 * summed_page_bytes(model.cfg, BLOCK, "fp32") * 2  # float64: 8 B


def test_only_full_attention_configs() -> None:
    with pytest.raises(ValueError, match="full-attention"):
        TinyDecoder(load_config("gpt-oss-20b"))
