"""A deployment scenario, and the checks that refuse one no engine would run as stated.

A :class:`Scenario` states everything the capacity arithmetic
(:func:`kvlib.capacity.assessment.assess`) needs: the model and GPU, the parallelism, the
precisions, the engine's limits against the context the product needs, the traffic, and
the model FLOPs utilization (``mfu``) its GPUs' arithmetic reaches. :func:`check_scenario`
raises :class:`ScenarioError` for a scenario that cannot be served as stated, naming the
field and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import require_fraction, require_int
from kvlib.bounds import tp_error as bounds_tp_error
from kvlib.config import ModelConfig
from kvlib.dtypes import require_dtype
from kvlib.hardware import VLLM_GPU_MEMORY_UTILIZATION, GPUSpec
from kvlib.step import ASSUMED_MFU, VLLM_MAX_NUM_BATCHED_TOKENS_API
from kvlib.units import GiB

__all__ = ["SERVING_MFU", "VLLM_MAX_NUM_SEQS", "Scenario", "ScenarioError", "check_scenario"]

# vLLM's --max-num-seqs default for years; recent API servers pick 1,024 on 70 GiB+ cards.
VLLM_MAX_NUM_SEQS = 256

# The model FLOPs utilization the chapter assumes: the step model's (kvlib.step.ASSUMED_MFU,
# where its sources are cited), an assumption and no measurement.
SERVING_MFU = ASSUMED_MFU


class ScenarioError(ValueError):
    """A scenario that cannot be served as stated; the message names the field and the fix."""


@dataclass(frozen=True)
class Scenario:
    """One deployment and its traffic. ``weight_dtype=None`` sizes the checkpoint as shipped;
    ``max_model_len=None`` is the engine's default, the model's ``max_position_embeddings``."""

    model: ModelConfig
    gpu: GPUSpec
    prompt_tokens: int
    output_tokens: int
    concurrency: int  # sequences the traffic keeps in flight (arrival rate x latency)
    needed_context_tokens: int  # the longest prompt + output the product accepts
    max_model_len: int | None = None
    tp: int = 1
    replicas: int = 1
    weight_dtype: str | None = None
    kv_dtype: str = "bf16"
    shared_prefix_tokens: int = 0  # a system prompt every request starts with
    prefix_caching: bool = False
    # Prompt tokens after the shared prefix that an earlier turn of the same conversation
    # prefilled: gone from a full GPU pool by the time the conversation returns.
    returning_tokens: int = 0
    host_tier: bool = False  # evicted blocks kept in host memory, reloaded on a prefix hit
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION  # x CUDA's total
    runtime_bytes_per_gpu: int = 2 * GiB  # activations, CUDA graphs, context: assumed
    block_size: int = 16
    max_num_seqs: int = VLLM_MAX_NUM_SEQS
    max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS_API  # a step's token budget
    mfu: float = SERVING_MFU  # share of the dense peak a step's FLOPs reach
    matmul_dtype: str = "bf16"  # "fp8": W8A8 weights on fp8 tensor cores

    @property
    def engine_max_len(self) -> int:
        """``max_model_len`` as the engine runs it (the model's maximum when not set)."""
        if self.max_model_len is not None:
            return self.max_model_len
        if self.model.max_position_embeddings is None:
            raise ScenarioError(
                f"{self.model.name}'s config gives no max_position_embeddings: "
                "set max_model_len explicitly"
            )
        return self.model.max_position_embeddings

    @property
    def gpus(self) -> int:
        """GPUs the deployment rents: ``tp x replicas``."""
        return self.tp * self.replicas

    @property
    def sequence_tokens(self) -> int:
        """A request's full length: prompt + output."""
        return self.prompt_tokens + self.output_tokens

    @property
    def decode_context_tokens(self) -> int:
        """Mean context over a request's decode steps: prompt + output / 2."""
        return self.prompt_tokens + self.output_tokens // 2


def check_scenario(s: Scenario) -> None:
    """Refuse a scenario that no engine would run as stated, naming the field."""
    for name in ("prompt_tokens", "output_tokens", "concurrency", "needed_context_tokens",
                 "tp", "replicas", "block_size", "max_num_seqs", "max_num_batched_tokens"):
        require_int(getattr(s, name), name, 1)
    require_int(s.shared_prefix_tokens, "shared_prefix_tokens")
    require_int(s.returning_tokens, "returning_tokens")
    require_int(s.runtime_bytes_per_gpu, "runtime_bytes_per_gpu")
    require_fraction(s.gpu_memory_utilization, "gpu_memory_utilization")
    require_fraction(s.mfu, "mfu")
    if s.matmul_dtype not in ("bf16", "fp8"):
        raise ScenarioError(f"matmul_dtype must be 'bf16' or 'fp8', got {s.matmul_dtype!r}")
    if s.matmul_dtype == "fp8" and s.weight_dtype != "fp8":
        raise ScenarioError("matmul_dtype 'fp8' needs fp8 weights (W8A8): set weight_dtype='fp8'")
    require_dtype(s.kv_dtype)
    limit = s.model.max_position_embeddings
    if s.max_model_len is not None:
        require_int(s.max_model_len, "max_model_len", 1)
        if limit is not None and s.max_model_len > limit:
            raise ScenarioError(
                f"max_model_len ({s.max_model_len:,}) exceeds {s.model.name}'s "
                f"max_position_embeddings ({limit:,}): the model was not trained that long"
            )
    if limit is not None and s.needed_context_tokens > limit:
        raise ScenarioError(
            f"needed_context_tokens ({s.needed_context_tokens:,}) exceeds {s.model.name}'s "
            f"max_position_embeddings ({limit:,}): choose a model with a longer context"
        )
    if s.needed_context_tokens > s.engine_max_len:
        raise ScenarioError(
            f"needed_context_tokens ({s.needed_context_tokens:,}) exceeds max_model_len "
            f"({s.engine_max_len:,}): the engine would refuse the product's longest requests"
        )
    if s.sequence_tokens > s.needed_context_tokens:
        raise ScenarioError(
            f"prompt_tokens + output_tokens ({s.sequence_tokens:,}) exceeds "
            f"needed_context_tokens ({s.needed_context_tokens:,}): raise the need"
        )
    if s.shared_prefix_tokens > s.prompt_tokens:
        raise ScenarioError(
            f"shared_prefix_tokens ({s.shared_prefix_tokens:,}) exceeds prompt_tokens "
            f"({s.prompt_tokens:,}): the shared prefix is part of the prompt"
        )
    if s.shared_prefix_tokens + s.returning_tokens > s.prompt_tokens:
        raise ScenarioError(
            f"shared_prefix_tokens + returning_tokens ({s.shared_prefix_tokens:,} + "
            f"{s.returning_tokens:,}) exceeds prompt_tokens ({s.prompt_tokens:,}): both are "
            "parts of the prompt"
        )
    if s.host_tier and not s.prefix_caching:
        raise ScenarioError(
            "host_tier needs prefix_caching: a host tier finds a returning prefix by its "
            "blocks' prefix hashes (set prefix_caching=True)"
        )
    tp_error = bounds_tp_error(s.model, s.tp)
    if tp_error:
        raise ScenarioError(tp_error)
