"""kvlib.dtypes: the one table of element widths and of their spellings."""

from __future__ import annotations

import pytest

from kvlib.config import from_dict
from kvlib.dtypes import DTYPE_BITS, bytes_for, canonical_dtype, require_dtype


@pytest.mark.parametrize(
    ("spelling", "name"),
    [("bfloat16", "bf16"), ("float16", "fp16"), ("half", "fp16"), ("float32", "fp32"),
     ("float", "fp32"), ("fp8_e4m3", "fp8"), ("float8_e4m3fn", "fp8"), ("bf16", "bf16")],
)
def test_every_spelling_has_one_name(spelling: str, name: str) -> None:
    assert require_dtype(spelling) == canonical_dtype(spelling) == name


@pytest.mark.parametrize("value", ["auto", None, 16, "fp12"])
def test_what_names_no_dtype_is_none_or_one_line(value: object) -> None:
    assert canonical_dtype(value) is None
    if isinstance(value, str):
        with pytest.raises(ValueError, match="use one of"):
            require_dtype(value)


def test_a_config_reads_its_torch_dtype_through_the_same_table() -> None:
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100}
    assert from_dict({**base, "torch_dtype": "float"}).dtype == "fp32"
    assert from_dict({**base, "torch_dtype": "auto"}).dtype is None


@pytest.mark.parametrize("dtype", sorted(DTYPE_BITS))
def test_bytes_round_sub_byte_types_up(dtype: str) -> None:
    assert bytes_for(3, dtype) == -(-3 * DTYPE_BITS[dtype] // 8)
