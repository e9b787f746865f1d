"""MLA's cache against MHA, GQA and MQA: groups, reduction factors and the bits they assume.

The DeepSeek-V2 paper (arXiv 2405.04434, Table 1) compares caches per token by
*elements*, "regardless of the storage precision":

    MHA  2 n_h d_h l      GQA  2 n_g d_h l      MQA  2 d_h l      MLA  (d_c + d_h^R) l

so MLA caches as much as GQA with ``n_g = (d_c + d_h^R) / (2 d_h)`` groups (2.25 for
DeepSeek-V2, section 2.1.4). Here a cache is counted in *bits* (elements x average
bits per element), so a 16-bit baseline and a cache quantized to "6 bits on average"
(section 3.2.3) compare exactly. Element counts come from
:func:`kvlib.sizing.kv_bytes_per_token` at bf16 (two bytes an element, no scales),
the layout transformers 5.23 and vLLM allocate (``tests/reference/test_reference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from kvlib._validate import is_number, require_int
from kvlib.config import MLAShape, ModelConfig
from kvlib.dtypes import DTYPE_BITS, bytes_for, require_dtype
from kvlib.sizing import kv_bytes_per_token
from kvlib.specs import DS_MLA_FP8_BYTES_PER_TOKEN

__all__ = [
    "KVReduction",
    "bits_for_published_reduction",
    "cached_elements_per_token",
    "equivalent_gqa_groups",
    "kv_reduction",
    "vllm_latent_entry_bytes",
]

# vLLM cache dtypes whose MLA entry kvlib cannot size, and why.
_UNSIZED_CACHE_DTYPES = {
    "nvfp4_ds_mla": (
        "vLLM lists it in CacheDType (vllm/config/cache.py, commit 002f10e0cfa1) for "
        "DeepSeek-V4's compressed attention, but MLAAttentionSpec.real_page_size_bytes "
        "(vllm/v1/kv_cache_interface.py, commit 001cabc1be16) gives it no page size, "
        "and DeepSeek-V4 caches token windows compressed 4x and 128x, not one entry a "
        "token: size it from a running engine's 'GPU KV cache size' line instead"
    ),
}


def cached_elements_per_token(cfg: ModelConfig) -> int:
    """Elements one token adds to the cache, summed over layers (bf16 bytes / 2).

    ``2 L H_kv d`` for full attention; ``L (d_c + d_h^R)`` for an MLA latent.
    """
    return kv_bytes_per_token(cfg, "bf16") // 2


def equivalent_gqa_groups(cfg: ModelConfig, head_dim: int | None = None) -> Fraction:
    """``(d_c + d_h^R) / (2 d_h)``: the GQA group count that caches as much as MLA.

    ``head_dim`` is the paper's per-head width ``d_h`` (128 for DeepSeek-V2/V3, where
    ``qk_nope_head_dim == v_head_dim``); give it when the two differ. DeepSeek-V2
    paper, section 2.1.4: "equal to GQA with only 2.25 groups".
    """
    mla = MLAShape.from_config(cfg)
    if head_dim is None:
        if mla.qk_nope_head_dim != mla.v_head_dim:
            raise ValueError(
                f"{cfg.name}: qk_nope_head_dim ({mla.qk_nope_head_dim}) and v_head_dim "
                f"({mla.v_head_dim}) differ, so d_h is ambiguous: pass head_dim=..."
            )
        head_dim = mla.v_head_dim
    require_int(head_dim, "head_dim", 1)
    return Fraction(mla.latent_dim, 2 * head_dim)


@dataclass(frozen=True)
class KVReduction:
    """One model's cache per token against a baseline's, both counted in bits.

    ``factor`` is how many times smaller the model's cache is; ``reduction`` the
    fraction saved, ``1 - model / baseline`` (the DeepSeek-V2 paper's "reduced by").
    """

    model: str
    baseline: str
    model_bits_per_element: Fraction
    baseline_bits_per_element: Fraction
    model_bits_per_token: Fraction
    baseline_bits_per_token: Fraction

    @property
    def model_bytes_per_token(self) -> Fraction:
        return self.model_bits_per_token / 8

    @property
    def baseline_bytes_per_token(self) -> Fraction:
        return self.baseline_bits_per_token / 8

    @property
    def factor(self) -> Fraction:
        """``baseline / model``: how many times smaller the model's cache is."""
        return self.baseline_bits_per_token / self.model_bits_per_token

    @property
    def reduction(self) -> Fraction:
        """``1 - model / baseline``: the fraction of the baseline's cache saved."""
        return 1 - self.model_bits_per_token / self.baseline_bits_per_token

    @property
    def percent(self) -> float:
        """``reduction`` in percent, as a float for printing."""
        return float(100 * self.reduction)


def _bits(value: int | float | Fraction | str, name: str) -> Fraction:
    """Average bits per element from a dtype name (``"bf16"`` -> 16) or a number (6)."""
    if isinstance(value, str):
        return Fraction(DTYPE_BITS[require_dtype(value)])
    if not (is_number(value) or isinstance(value, Fraction)):
        raise ValueError(f"{name} must be a dtype name or a number of bits, got {value!r}")
    bits = Fraction(value)
    if not 0 < bits <= 64:
        raise ValueError(f"{name} must be between 0 and 64 bits per element, got {value!r}")
    return bits


def kv_reduction(
    model: ModelConfig,
    baseline: ModelConfig,
    *,
    model_bits: int | float | Fraction | str = 16,
    baseline_bits: int | float | Fraction | str = 16,
) -> KVReduction:
    """The model's cache per token against the baseline's, each at its own bits per element.

    ``model_bits`` and ``baseline_bits`` are a dtype (``"bf16"``, ``"fp8"``) or an
    average number of bits per cached element (``6`` for DeepSeek-V2's deployed,
    quantized cache). Scales and other quantization metadata are not counted.
    """
    m_bits, b_bits = _bits(model_bits, "model_bits"), _bits(baseline_bits, "baseline_bits")
    return KVReduction(
        model=model.name,
        baseline=baseline.name,
        model_bits_per_element=m_bits,
        baseline_bits_per_element=b_bits,
        model_bits_per_token=cached_elements_per_token(model) * m_bits,
        baseline_bits_per_token=cached_elements_per_token(baseline) * b_bits,
    )


def bits_for_published_reduction(
    model: ModelConfig,
    baseline: ModelConfig,
    published_percent: str,
    *,
    baseline_bits: int | float | Fraction | str = 16,
) -> tuple[Fraction, Fraction]:
    """The average bits per model element for which the reduction rounds to ``published_percent``.

    ``published_percent`` is the figure as printed (``"93.3"``); every reduction in
    ``[p - h, p + h]``, ``h`` half a unit of its last digit, rounds to it. Returns
    ``(low, high)`` bits per element: which quantization the published figure assumes.
    """
    text = published_percent if isinstance(published_percent, str) else ""
    if not text.replace(".", "", 1).isdigit():
        raise ValueError(
            f"published_percent must be the printed figure, e.g. '93.3', got {published_percent!r}"
        )
    decimals = len(text.partition(".")[2])
    half = Fraction(1, 2 * 10**decimals)
    percent = Fraction(text)
    at_16 = kv_reduction(model, baseline, model_bits=16, baseline_bits=baseline_bits)
    # reduction(b) = 1 - (b / 16) x model_16 / baseline: solve for b at both edges.
    kept_at_16 = 1 - at_16.reduction
    low = 16 * (1 - (percent + half) / 100) / kept_at_16
    high = 16 * (1 - (percent - half) / 100) / kept_at_16
    return low, high


def vllm_latent_entry_bytes(cfg: ModelConfig, cache_dtype: str) -> int:
    """Bytes vLLM stores per token per MLA layer for ``--kv-cache-dtype cache_dtype``.

    ``MLAAttentionSpec.real_page_size_bytes`` over ``block_size``: ``auto``/``bfloat16``
    keep ``d_c + d_r`` elements at 2 bytes, ``fp8``/``fp8_e4m3`` at one byte (one scale
    for the whole tensor), ``fp8_ds_mla`` is DeepSeek-V3.2's entry of
    :data:`kvlib.specs.DS_MLA_FP8_BYTES_PER_TOKEN` (512 fp8 values, four fp32 scales,
    64 bf16 RoPE values). Raises, naming the reason, for a
    dtype whose entry vLLM's code does not define.
    """
    mla = MLAShape.from_config(cfg)
    if cache_dtype in _UNSIZED_CACHE_DTYPES:
        raise ValueError(
            f"cannot size --kv-cache-dtype {cache_dtype}: {_UNSIZED_CACHE_DTYPES[cache_dtype]}"
        )
    if cache_dtype in ("auto", "bfloat16", "fp8", "fp8_e4m3"):  # auto: the model's bf16
        return bytes_for(mla.latent_dim, "bf16" if cache_dtype == "auto" else cache_dtype)
    if cache_dtype == "fp8_ds_mla":
        if (mla.kv_lora_rank, mla.qk_rope_head_dim) != (512, 64):
            raise ValueError(
                f"fp8_ds_mla is laid out for a 512 + 64 latent; {cfg.name} has "
                f"{mla.kv_lora_rank} + {mla.qk_rope_head_dim}"
            )
        return DS_MLA_FP8_BYTES_PER_TOKEN
    raise ValueError(
        f"unknown MLA cache dtype {cache_dtype!r}: use auto, bfloat16, fp8, fp8_e4m3 or "
        "fp8_ds_mla (nvfp4_ds_mla is refused with its reason)"
    )
