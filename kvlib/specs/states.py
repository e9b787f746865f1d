"""Layers whose cache does not grow per token: linear-attention states and shared layers."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from kvlib._validate import require_int
from kvlib.dtypes import bytes_for, require_dtype
from kvlib.specs.base import CacheSpec

__all__ = ["LinearState", "SharedKV"]


@dataclass(frozen=True)
class LinearState(CacheSpec):
    """A linear-attention layer: a fixed state whatever the context.

    ``conv_elements`` of short-convolution state in the cache dtype and
    ``recurrent_elements`` of recurrent state kept in fp32 (transformers'
    ``LinearAttentionLayer`` keeps it in fp32 whatever the model dtype).
    One page (vLLM ``MambaSpec``) holds a sequence's whole state.
    """

    conv_elements: int
    recurrent_elements: int
    kind: ClassVar[str] = "linear"

    def bytes_per_token(self, dtype: str) -> int:
        require_dtype(dtype)
        return 0

    def fixed_bytes(self, dtype: str) -> int:
        """``conv x b + recurrent x 4``."""
        return bytes_for(self.conv_elements, dtype) + 4 * self.recurrent_elements

    def page_bytes(self, block_size: int, dtype: str) -> int:
        """The whole state: vLLM gives a linear-attention sequence one page."""
        require_int(block_size, "block_size", 1)
        return self.fixed_bytes(dtype)

    def tp_share(self, tp: int) -> Fraction:
        """The state splits with its heads: ``1 / tp``."""
        return Fraction(1, tp)

    def attention_pairs(self, prompt_tokens: int) -> int:
        raise ValueError("kvlib does not count the FLOPs of a linear-attention layer")

    def held_blocks(self, tokens: int, block_size: int) -> int:
        return 1

    def vllm_page_type(self) -> tuple[str, int | None]:
        raise ValueError(
            "linear attention: vLLM pages its fixed state (MambaSpec, padded to the "
            "attention page), which kvlib does not model"
        )


@dataclass(frozen=True)
class SharedKV(CacheSpec):
    """A layer that reads an earlier layer's cache (Gemma 3n, Gemma 4): it holds nothing."""

    kind: ClassVar[str] = "shared"

    def bytes_per_token(self, dtype: str) -> int:
        require_dtype(dtype)
        return 0

    def tp_share(self, tp: int) -> Fraction:
        return Fraction(0)

    def attention_pairs(self, prompt_tokens: int) -> int:
        raise ValueError("a layer reading another layer's cache: its attention is not counted")

    def held_blocks(self, tokens: int, block_size: int) -> int:
        return 0

    def vllm_page_type(self) -> None:
        return None
