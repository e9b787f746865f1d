"""kvlib.tiers.handoff: the cache a prefill GPU hands a decode GPU, and DistServe's ratio."""

from __future__ import annotations

import pytest

from kvlib.bounds import kv_bytes_per_gpu
from kvlib.config import load_config
from kvlib.hardware import get_gpu
from kvlib.step import PrefillChunk, mixed_step, step_time
from kvlib.tiers.handoff import handoff, instance_ratio, transfer_s

H100 = get_gpu("H100-SXM")


@pytest.fixture(scope="module")
def llama():
    return load_config("Llama-3.1-8B")


def test_transfer_bytes_are_k_and_v_of_every_layer(llama) -> None:
    t = 4096
    plan = handoff(llama, t)
    assert plan.transfer_bytes == 2 * 32 * 8 * 128 * 2 * t
    assert plan.bytes_per_gpu_pair == {"0->0": plan.transfer_bytes}


@pytest.mark.parametrize(("a", "b"), [(1, 1), (2, 4), (4, 2), (8, 8), (1, 8), (8, 1), (2, 8)])
def test_each_decode_gpu_receives_its_tp_share(llama, a: int, b: int) -> None:
    t = 1000
    plan = handoff(llama, t, prefill_tp=a, decode_tp=b)
    received = dict.fromkeys(range(b), 0)
    sent = dict.fromkeys(range(a), 0)
    for pair, n in plan.bytes_per_gpu_pair.items():
        i, j = map(int, pair.split("->"))
        received[j] += n
        sent[i] += n
    assert all(n == kv_bytes_per_gpu(llama, t, tp=b) for n in received.values())
    assert all(n <= kv_bytes_per_gpu(llama, t, tp=a) for n in sent.values())
    assert plan.wire_bytes == plan.transfer_bytes  # 8 KV heads: nothing replicated


def test_prefill_tp2_to_decode_tp4_sends_halves(llama) -> None:
    plan = handoff(llama, 100, prefill_tp=2, decode_tp=4)
    quarter = plan.transfer_bytes // 4
    assert plan.bytes_per_gpu_pair == {"0->0": quarter, "0->1": quarter,
                                       "1->2": quarter, "1->3": quarter}
    assert plan.busiest_gpu_bytes == 2 * quarter
    assert transfer_s(plan, 50e9) == pytest.approx(2 * quarter / 50e9)


def test_an_mla_latent_crosses_once_per_decode_gpu() -> None:
    ds = load_config("DeepSeek-V3")
    plan = handoff(ds, 256, prefill_tp=8, decode_tp=4)
    assert plan.wire_bytes == 4 * plan.transfer_bytes
    assert plan.transfer_bytes == 61 * 576 * 2 * 256


def test_bad_tp_is_named(llama) -> None:
    with pytest.raises(ValueError, match="decode_tp"):
        handoff(llama, 10, decode_tp=3)


def test_instance_ratio_balances_the_rates(llama) -> None:
    r = instance_ratio(llama, H100, 4000, 1000, 91)
    prefill = step_time(llama, H100, (), [PrefillChunk(4000)]).total_s
    step = mixed_step(llama, H100, 91, 4500).total_s
    assert r.prefill_s == prefill and r.decode_step_s == step
    assert r.prefill_per_decode == pytest.approx(prefill * 91 / (1000 * step))
    # longer replies keep a decode instance busy longer: fewer prefill instances each
    assert instance_ratio(llama, H100, 4000, 4000, 91).prefill_per_decode < r.prefill_per_decode
