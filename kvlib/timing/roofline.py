"""The roofline: FLOPs, bytes moved, and which of the two limits a kernel hits.

A kernel that does ``F`` FLOPs while moving ``Q`` bytes to or from memory has
arithmetic intensity ``I = F / Q`` (FLOPs per byte). A machine with peak
compute ``P`` and memory bandwidth ``B`` can reach at most

    attainable(I) = min(P, B x I)

(Williams, Waterman and Patterson, "Roofline: an insightful visual
performance model for multicore architectures", Communications of the ACM
52(4), 2009). The two ceilings meet at the ridge point ``I* = P / B``: below
it a kernel is memory-bound, above it compute-bound.

The counts here are the minimum traffic of each operation: every operand read
once, every output written once. A copy of ``N`` bytes moves ``2N`` (read
and write), the convention of STREAM's Copy kernel (McCalpin, STREAM
benchmark: 16 bytes per iteration of ``a(i) = b(i)`` on 8-byte words).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import require_int, require_positive
from kvlib.hardware import GPUSpec
from kvlib.step import step_time_from_counts

__all__ = [
    "Machine",
    "copy_bytes_moved",
    "decode_kernel_bytes",
    "decode_kernel_flops",
    "decode_bytes_from_sizes",
    "decode_step_flops",
    "decode_step_intensity",
    "decode_step_s_merged",
    "decode_step_s_per_operation",
    "machine_from_gpu",
    "matmul_bytes",
    "matmul_flops",
    "matmul_ridge_batch",
    "ridge_batch",
]


@dataclass(frozen=True)
class Machine:
    """A roofline's two ceilings: peak FLOP/s and memory bandwidth (decimal units)."""

    name: str
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    source: str

    def __post_init__(self) -> None:
        require_positive(self.peak_flops_per_s, "peak_flops_per_s")
        require_positive(self.bandwidth_bytes_per_s, "bandwidth_bytes_per_s")

    @property
    def ridge_flops_per_byte(self) -> float:
        """``P / B``: the intensity at which the memory and compute ceilings meet."""
        return self.peak_flops_per_s / self.bandwidth_bytes_per_s

    def attainable_flops_per_s(self, intensity: float) -> float:
        """``min(P, B x I)``: the most a kernel of intensity ``I`` can reach here."""
        require_positive(intensity, "intensity")
        return min(self.peak_flops_per_s, self.bandwidth_bytes_per_s * intensity)

    def bound(self, intensity: float) -> str:
        """``"memory"`` below the ridge point, ``"compute"`` at or above it."""
        require_positive(intensity, "intensity")
        return "memory" if intensity < self.ridge_flops_per_byte else "compute"


def machine_from_gpu(gpu: GPUSpec, dtype: str = "bf16") -> Machine:
    """A datasheet roofline: dense bf16 (or fp8) FLOP/s and HBM bandwidth of ``gpu``.

    Dense figures only: the "with sparsity" numbers datasheets print are twice
    as large and need 2:4 structured-sparse weights, which dense inference lacks.
    """
    if dtype == "bf16":
        peak = gpu.bf16_dense_flops_per_s
    elif dtype == "fp8" and gpu.fp8_dense_flops_per_s is not None:
        peak = gpu.fp8_dense_flops_per_s
    else:
        raise ValueError(f"{gpu.name} has no dense {dtype} figure: use dtype 'bf16' or 'fp8'")
    return Machine(gpu.name, peak, gpu.hbm_bandwidth_bytes_per_s, f"datasheet: {gpu.source}")


def copy_bytes_moved(n_bytes: int) -> int:
    """``2 x N``: a copy of ``N`` bytes reads ``N`` and writes ``N`` (STREAM's convention).

    A CPU without non-temporal stores also reads the destination before
    writing it (write-allocate), so its memory bus carries ``3N``; the
    convention counts the bytes the program asked for.
    """
    require_int(n_bytes, "n_bytes", 1)
    return 2 * n_bytes


def matmul_flops(m: int, n: int, k: int) -> int:
    """``2 m n k``: one multiply and one add per term of each of the ``m x n`` dot products."""
    for name, value in (("m", m), ("n", n), ("k", k)):
        require_int(value, name, 1)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, bytes_per_element: int) -> int:
    """``(m k + k n + m n) x b``: read A (m x k) and B (k x n) once, write C (m x n) once."""
    for name, value in (("m", m), ("n", n), ("k", k), ("bytes_per_element", bytes_per_element)):
        require_int(value, name, 1)
    return (m * k + k * n + m * n) * bytes_per_element


def decode_kernel_flops(batch: int, heads: int, context_tokens: int, head_dim: int) -> int:
    """``4 B H T d``: one attention kernel of one layer, each of ``B x H`` query heads
    scoring ``T`` keys and mixing ``T`` values (a whole model's decode attention, every
    layer's kind counted, is :func:`kvlib.step.decode_attention_flops`).

    ``q . k`` for T keys is ``2 T d`` FLOPs and the weighted sum of T values
    another ``2 T d``; the softmax's few FLOPs per score are left out.
    """
    for name, value in (("batch", batch), ("heads", heads), ("context_tokens", context_tokens),
                        ("head_dim", head_dim)):
        require_int(value, name, 1)
    return 4 * batch * heads * context_tokens * head_dim


def decode_kernel_bytes(
    batch: int,
    heads: int,
    kv_heads: int,
    context_tokens: int,
    head_dim: int,
    bytes_per_element: int,
) -> int:
    """``(2 B H_kv T d + 2 B H d) x b``: read the cached K and V once; read q, write the output.

    The ``H / H_kv`` query heads of a group share their KV head, so a kernel
    that reads each KV head once moves ``2 B H_kv T d`` elements of cache.
    """
    decode_kernel_flops(batch, heads, context_tokens, head_dim)  # checks those counts
    require_int(kv_heads, "kv_heads", 1)
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    require_int(bytes_per_element, "bytes_per_element", 1)
    cache = 2 * batch * kv_heads * context_tokens * head_dim
    query_and_output = 2 * batch * heads * head_dim
    return (cache + query_and_output) * bytes_per_element


def decode_step_flops(active_params: int, batch: int) -> int:
    """``2 P B``: one decode step of ``B`` sequences, 2 FLOPs per active parameter per token.

    Attention's own ``4 L H T d`` per token is left out (see
    :func:`decode_kernel_flops`); it reads the cache, not the weights.
    """
    require_int(active_params, "active_params", 1)
    require_int(batch, "batch", 1)
    return 2 * active_params * batch


def decode_bytes_from_sizes(weight_bytes: int, batch: int, kv_bytes_per_sequence: int = 0) -> int:
    """``W + B x KV``: every weight once per step (shared by the batch), every cache once.

    From sizes already known; :func:`kvlib.bounds.decode_bytes_per_gpu` derives them
    from a model config (MoE routing, tensor parallelism). ``weight_bytes`` is what a
    step reads: the bytes of the active parameters (``b x P``), without the input
    embedding table, of which a step looks up one row per token.
    """
    require_int(weight_bytes, "weight_bytes", 1)
    require_int(batch, "batch", 1)
    require_int(kv_bytes_per_sequence, "kv_bytes_per_sequence")
    return weight_bytes + batch * kv_bytes_per_sequence


def decode_step_intensity(
    active_params: int, weight_bytes: int, batch: int, kv_bytes_per_sequence: int = 0
) -> float:
    """``2 P B / (W + B x KV)``: grows with the batch, towards ``2 P / KV`` when caches dominate."""
    flops = decode_step_flops(active_params, batch)
    return flops / decode_bytes_from_sizes(weight_bytes, batch, kv_bytes_per_sequence)


def ridge_batch(
    active_params: int,
    weight_bytes: int,
    ridge_flops_per_byte: float,
    kv_bytes_per_sequence: int = 0,
) -> float | None:
    """The batch ``B*`` at which a decode step's intensity reaches the ridge point ``R``.

    Solving ``2 P B / (W + B x KV) = R``: ``B* = R W / (2 P - R x KV)``; without cache
    reads, :func:`matmul_ridge_batch`. None when ``2 P <= R x KV``: the cache reads grow
    as fast as the FLOPs and the step stays memory-bound at any batch.
    """
    require_int(active_params, "active_params", 1)
    require_int(weight_bytes, "weight_bytes", 1)
    require_positive(ridge_flops_per_byte, "ridge_flops_per_byte")
    require_int(kv_bytes_per_sequence, "kv_bytes_per_sequence")
    headroom = 2 * active_params - ridge_flops_per_byte * kv_bytes_per_sequence
    if headroom <= 0:
        return None
    return ridge_flops_per_byte * weight_bytes / headroom


def decode_step_s_per_operation(
    active_params: int,
    weight_bytes: int,
    batch: int,
    kv_bytes_per_sequence: int,
    machine: Machine,
) -> float:
    """A decode step's time bound with each operation on its own roofline:

        T = B x KV / BW + max(2 B P / F, W / BW)

    The weight matmuls (``2 B P`` FLOPs on ``W`` bytes) and attention (the ``B x KV``
    cache bytes, a few FLOPs each) run one after the other, so their times add; only
    within the matmuls do FLOPs and bytes overlap. Attention's intensity is
    ``2 H / (H_kv b)`` FLOPs per byte at any batch (:func:`decode_kernel_flops` over
    :func:`decode_kernel_bytes`), far below any GPU's ridge, so its term is its bytes.
    The form of the scaling book's inference chapter (Austin et al., "How to Scale Your
    Model", 2025, "All about Transformer Inference"). The step model
    (:func:`kvlib.step.step_time_from_counts`) computes it, at the machine's full peak.
    """
    require_int(kv_bytes_per_sequence, "kv_bytes_per_sequence")
    require_int(weight_bytes, "weight_bytes", 1)
    step = step_time_from_counts(
        weight_bytes=weight_bytes,
        weight_flops=decode_step_flops(active_params, batch),
        decode_tokens=batch,
        decode_kv_bytes=batch * kv_bytes_per_sequence,
        matmul_flops_per_s=machine.peak_flops_per_s,
        bandwidth_bytes_per_s=machine.bandwidth_bytes_per_s,
    )
    return step.total_s


def decode_step_s_merged(
    active_params: int,
    weight_bytes: int,
    batch: int,
    kv_bytes_per_sequence: int,
    machine: Machine,
) -> float:
    """The merged bound ``max(2 B P / F, (W + B x KV) / BW)``: one intensity for the whole
    step, as if the matmuls' arithmetic could hide the cache reads. It is never above
    :func:`decode_step_s_per_operation`, and is low once the matmuls are compute-bound."""
    flops = decode_step_flops(active_params, batch)
    moved = decode_bytes_from_sizes(weight_bytes, batch, kv_bytes_per_sequence)
    return max(flops / machine.peak_flops_per_s, moved / machine.bandwidth_bytes_per_s)


def matmul_ridge_batch(active_params: int, weight_bytes: int, machine: Machine) -> float:
    """``B* = F W / (2 P BW)``: the batch at which the weight matmuls reach the ridge,
    whatever the context (the cache is attention's traffic, not theirs). At bf16
    (``W = 2 P``) it is the ridge point itself; fp8 weights on fp8 tensor cores
    (``W = P``, ``F`` doubled) give the same batch, fp8 weights on bf16 arithmetic half."""
    require_int(active_params, "active_params", 1)
    require_int(weight_bytes, "weight_bytes", 1)
    return machine.ridge_flops_per_byte * weight_bytes / (2 * active_params)
