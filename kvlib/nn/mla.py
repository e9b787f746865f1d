"""One Multi-head Latent Attention layer in torch: its latent cache, and two ways to attend.

The layer follows DeepSeek-V2/V3 (arXiv 2405.04434, section 2.1 and appendix C)
with the module and weight names of transformers' ``DeepseekV3Attention``, so a
state dict loads either way. Each token is compressed to one latent of
``d_c + d_r`` elements (``kv_lora_rank`` after an RMSNorm, plus the RoPE key
shared by all heads); only that latent is cached (:class:`LatentCache`). Reading
it back, the layer can:

- ``path="naive"``: decompress every cached latent through ``kv_b_proj`` into
  per-head keys ``[k_nope; k_rope]`` and values, then attend as MHA;
- ``path="absorbed"``: fold ``W_UK`` into the query (``q_nope W_UK``, width
  ``d_c``) and ``W_UV`` into the output, and attend in latent space: MQA with the
  latent as the one key (``d_c + d_r``) and its first ``d_c`` elements as the value.

Both compute the same function; ``tests/unit/test_nn_mla.py`` checks them against each
other, against a float64 reference and against transformers, and counts their
FLOPs and bytes against :func:`kvlib.mla.mla_step_cost`. RoPE has no YaRN
scaling here (``qk_head_dim ** -0.5`` is the softmax scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kvlib.mla import MLAPath, MLAShape

__all__ = [
    "LatentCache",
    "MLAAttention",
    "RMSNorm",
    "rope_angles",
    "rotate_half_split",
    "rotate_interleaved",
]


class RMSNorm(nn.Module):
    """``w * x / rms(x)``, computed in fp32 and cast back (transformers ``DeepseekV3RMSNorm``)."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_angles(
    positions: torch.Tensor, dim: int, theta: float = 10000.0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``position x theta^(-2i/dim)``, each ``[S, dim // 2]`` in ``dtype``
    (fp32 as transformers computes them; the float64 decoder asks for float64)."""
    exponents = torch.arange(0, dim, 2, dtype=dtype, device=positions.device) / dim
    inv_freq = 1.0 / theta**exponents
    angles = positions.to(dtype)[:, None] * inv_freq[None, :]  # (S, dim/2)
    return angles.cos(), angles.sin()


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on pairs ``(x0, x1), (x2, x3), ...``, returned as [rotated evens; rotated odds].

    DeepSeek's MLA layout (transformers ``apply_rotary_pos_emb_interleave``); the
    output order is a fixed permutation shared by queries and keys, so dot products
    are those of the interleaved rotation. ``x``: ``(..., S, d)``; cos/sin: ``(S, d/2)``.
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)


def rotate_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on halves ``(x_i, x_{i + d/2})`` (transformers ``apply_rotary_pos_emb``; the
    DeepSeek-V3.2 indexer's layout)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


@dataclass
class LatentCache:
    """The cache of one MLA layer: ``latent`` is ``[B, T, d_c + d_r]``, one row per token.

    ``latent[..., :d_c]`` is the normalised compressed KV, ``latent[..., d_c:]`` the
    rotated RoPE key: the 576-wide entry vLLM pages (``MLAAttentionSpec``).
    """

    latent: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return 0 if self.latent is None else self.latent.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds: ``B x T x (d_c + d_r) x element size``."""
        return 0 if self.latent is None else self.latent.nbytes

    def append(self, new: torch.Tensor) -> torch.Tensor:
        """Add ``new`` ``[B, S, d_c + d_r]`` after the cached tokens; return the whole cache."""
        self.latent = new if self.latent is None else torch.cat([self.latent, new], dim=1)
        return self.latent


class MLAAttention(nn.Module):
    """One MLA attention layer (no biases, as DeepSeek-V2/V3 ship it)."""

    def __init__(
        self,
        shape: MLAShape,
        *,
        rope_theta: float = 10000.0,
        eps: float = 1e-6,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if shape.qk_rope_head_dim % 2:
            raise ValueError(
                f"qk_rope_head_dim must be even for RoPE, got {shape.qk_rope_head_dim}"
            )
        self.shape, self.rope_theta = shape, rope_theta
        h, heads, s = shape.hidden_size, shape.num_heads, shape
        q_out = heads * s.qk_head_dim

        def linear(n_in: int, n_out: int) -> nn.Linear:
            return nn.Linear(n_in, n_out, bias=False, dtype=dtype)

        self.q_proj = linear(h, q_out) if s.q_lora_rank is None else None
        self.q_a_proj = None if s.q_lora_rank is None else linear(h, s.q_lora_rank)
        self.q_a_layernorm = None if s.q_lora_rank is None else RMSNorm(s.q_lora_rank, eps, dtype)
        self.q_b_proj = None if s.q_lora_rank is None else linear(s.q_lora_rank, q_out)
        self.kv_a_proj_with_mqa = linear(h, s.latent_dim)  # W_DKV and W_KR together
        self.kv_a_layernorm = RMSNorm(s.kv_lora_rank, eps, dtype)
        self.kv_b_proj = linear(s.kv_lora_rank, heads * (s.qk_nope_head_dim + s.v_head_dim))
        self.o_proj = linear(heads * s.v_head_dim, h)
        self.scale = s.qk_head_dim**-0.5

    def forward(
        self, hidden: torch.Tensor, cache: LatentCache | None = None, path: MLAPath = "absorbed"
    ) -> torch.Tensor:
        """``hidden`` ``[B, S, D]`` -> ``[B, S, D]``; the new tokens' latents join ``cache``."""
        if path not in ("naive", "absorbed"):
            raise ValueError(f"path must be 'naive' or 'absorbed', got {path!r}")
        batch, new = hidden.shape[:2]
        past = 0 if cache is None else cache.tokens
        positions = torch.arange(past, past + new, device=hidden.device)
        cos, sin = rope_angles(positions, self.shape.qk_rope_head_dim, self.rope_theta)
        q_nope, q_rope = self.queries(hidden, cos, sin)  # (B, H, S, d_n), (B, H, S, d_r)
        latent = self.compress(hidden, cos, sin)  # (B, S, d_c + d_r)
        if cache is not None:
            latent = cache.append(latent)  # (B, T, d_c + d_r)
        # Query i sits at position past + i and sees keys 0 .. past + i; later ones are masked.
        keys_pos = torch.arange(latent.shape[1], device=hidden.device)
        future = keys_pos[None, :] > positions[:, None]  # (S, T)
        attend = self._naive if path == "naive" else self._absorbed
        out = attend(q_nope, q_rope, latent, future).transpose(1, 2).reshape(batch, new, -1)
        result: torch.Tensor = self.o_proj(out)
        return result

    def queries(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head queries, split into the no-RoPE part and the rotated part."""
        s = self.shape
        if self.q_proj is not None:
            q = self.q_proj(hidden)
        else:
            assert self.q_a_proj is not None and self.q_a_layernorm is not None
            assert self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))  # W_UQ and W_QR
        batch, new = hidden.shape[:2]
        q = q.view(batch, new, s.num_heads, s.qk_head_dim).transpose(1, 2)  # (B, H, S, d_n + d_r)
        q_nope, q_rope = torch.split(q, [s.qk_nope_head_dim, s.qk_rope_head_dim], dim=-1)
        return q_nope, rotate_interleaved(q_rope, cos, sin)

    def compress(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The latent each new token caches: RMSNorm(c_kv) then RoPE(k_r), ``(B, S, d_c + d_r)``."""
        s = self.shape
        compressed = self.kv_a_proj_with_mqa(hidden)  # (B, S, d_c + d_r)
        c_kv, k_rope = torch.split(compressed, [s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        return torch.cat([self.kv_a_layernorm(c_kv), rotate_interleaved(k_rope, cos, sin)], dim=-1)

    def expand_kv(self, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decompress cached latents: keys ``(B, H, T, d_n + d_r)``, values ``(B, H, T, d_v)``."""
        s = self.shape
        batch, tokens = latent.shape[:2]
        c_kv, k_rope = torch.split(latent, [s.kv_lora_rank, s.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(c_kv).view(batch, tokens, s.num_heads, -1).transpose(1, 2)
        k_nope, values = torch.split(kv, [s.qk_nope_head_dim, s.v_head_dim], dim=-1)
        shared = k_rope[:, None].expand(batch, s.num_heads, tokens, s.qk_rope_head_dim)
        return torch.cat([k_nope, shared], dim=-1), values

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK`` ``(H, d_n, d_c)`` and ``W_UV`` ``(H, d_v, d_c)``, views of ``kv_b_proj``."""
        s = self.shape
        w = self.kv_b_proj.weight.view(s.num_heads, s.qk_nope_head_dim + s.v_head_dim, -1)
        return w[:, : s.qk_nope_head_dim], w[:, s.qk_nope_head_dim :]

    def _softmax(self, scores: torch.Tensor, future: torch.Tensor) -> torch.Tensor:
        scores = scores.masked_fill(future, float("-inf"))
        return torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))

    def _naive(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        future: torch.Tensor,
    ) -> torch.Tensor:
        keys, values = self.expand_kv(latent)  # (B, H, T, d_n + d_r), (B, H, T, d_v)
        q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, S, d_n + d_r)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * self.scale  # (B, H, S, T)
        probs = self._softmax(scores, future).to(values.dtype)
        return torch.matmul(probs, values)  # (B, H, S, d_v)

    def _absorbed(
        self,
        q_nope: torch.Tensor,
        q_rope: torch.Tensor,
        latent: torch.Tensor,
        future: torch.Tensor,
    ) -> torch.Tensor:
        w_uk, w_uv = self.absorbed_weights()
        q_latent = torch.einsum("bhsn,hnc->bhsc", q_nope, w_uk)  # (B, H, S, d_c)
        q = torch.cat([q_latent, q_rope], dim=-1)  # (B, H, S, d_c + d_r)
        scores = torch.einsum("bhsc,btc->bhst", q, latent) * self.scale  # one key for all heads
        probs = self._softmax(scores, future).to(latent.dtype)
        c_kv = latent[..., : self.shape.kv_lora_rank]  # the value is the latent itself
        out_latent = torch.einsum("bhst,btc->bhsc", probs, c_kv)  # (B, H, S, d_c)
        return torch.einsum("bhsc,hvc->bhsv", out_latent, w_uv)  # (B, H, S, d_v)
