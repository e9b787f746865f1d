"""Seeded request lengths for the fragmentation simulator."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kvlib._validate import require_int

__all__ = [
    "ALPACA_LIKE",
    "SHAREGPT_LIKE",
    "LengthDistribution",
    "LengthMix",
    "RequestLengths",
    "sample_requests",
]


@dataclass(frozen=True)
class LengthDistribution:
    """Log-normal token counts of mean ``mean_tokens`` (before clipping); ``sigma`` of the log."""

    mean_tokens: float
    sigma: float

    def __post_init__(self) -> None:
        if not self.mean_tokens >= 1 or not self.sigma >= 0:
            raise ValueError(
                f"mean_tokens must be >= 1 and sigma >= 0, got {self.mean_tokens!r}, {self.sigma!r}"
            )

    def sample(self, rng: random.Random) -> int:
        # E[lognormal(mu, s)] = exp(mu + s^2 / 2): choose mu so the mean is mean_tokens.
        mu = math.log(self.mean_tokens) - self.sigma**2 / 2
        return max(1, round(rng.lognormvariate(mu, self.sigma)))


@dataclass(frozen=True)
class LengthMix:
    """Prompt and output length distributions, drawn independently."""

    prompt: LengthDistribution
    output: LengthDistribution


# Means from the PagedAttention paper's datasets (its Figure 11: ShareGPT prompts of 161.31
# and outputs of 337.99 tokens on average, Alpaca 19.31 and 58.45). The log-normal shape
# and its spread are this module's assumption, wider for ShareGPT as the paper describes.
SHAREGPT_LIKE = LengthMix(LengthDistribution(161.31, 1.0), LengthDistribution(337.99, 0.9))
ALPACA_LIKE = LengthMix(LengthDistribution(19.31, 0.6), LengthDistribution(58.45, 0.7))


@dataclass(frozen=True)
class RequestLengths:
    """One request: its prompt and the output it will produce (known only to an oracle)."""

    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        require_int(self.prompt_tokens, "prompt_tokens", 1)
        require_int(self.output_tokens, "output_tokens", 1)

    @property
    def final_tokens(self) -> int:
        """Prompt plus output: the sequence's length when it finishes."""
        return self.prompt_tokens + self.output_tokens


def sample_requests(
    num_requests: int, workload: LengthMix = SHAREGPT_LIKE, seed: int = 0, max_seq_len: int = 2048
) -> list[RequestLengths]:
    """``num_requests`` seeded draws; a prompt and its output are cut to fit ``max_seq_len``."""
    for name, value in (("num_requests", num_requests), ("max_seq_len", max_seq_len)):
        require_int(value, name, 1)
    if max_seq_len < 2:
        raise ValueError("max_seq_len must leave room for a prompt and one output token")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        prompt = min(workload.prompt.sample(rng), max_seq_len - 1)
        output = min(workload.output.sample(rng), max_seq_len - prompt)
        requests.append(RequestLengths(prompt, output))
    return requests
