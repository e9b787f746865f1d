"""Dedicated GPUs paid by the hour against tokens paid on a shared pool: the crossover.

A dedicated deployment of ``g`` GPUs at ``p_gpu`` per GPU-hour costs the same
whether it is busy or idle. If it can sustain ``R`` tokens/s (the decode bound of
:mod:`kvlib.capacity.assessment`, or a measured figure) and the traffic uses a fraction ``x``
of that, each million tokens costs

    c_dedicated(x) = g x p_gpu x 10^6 / (3600 x R x x)

while a shared pool (a per-token API) charges a flat ``p_token`` per million. They
are equal at the **crossover utilization**

    x* = g x p_gpu x 10^6 / (3600 x R x p_token)

Above ``x*`` the dedicated GPUs are cheaper; below it, paying per token is. If
``x* > 1`` the GPUs never pay for themselves at that throughput. Prices are inputs:
this module holds none, because prices change and differ by contract. The
comparison leaves out what both sides add (engineering time, egress, redundancy)
and counts one kind of token: use the blended price of the tokens ``R`` counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlib._validate import require_fraction, require_int, require_positive

__all__ = [
    "SECONDS_PER_HOUR",
    "TOKENS_PER_MILLION",
    "Crossover",
    "crossover",
    "dedicated_cost_per_million_tokens",
]

SECONDS_PER_HOUR = 3600
TOKENS_PER_MILLION = 10**6


def dedicated_cost_per_million_tokens(
    gpu_hour_price: float, gpus: int, tokens_per_s: float, utilization: float
) -> float:
    """``g x p_gpu x 10^6 / (3600 x R x x)``: what a million tokens cost on rented GPUs
    that serve ``utilization`` of the ``tokens_per_s`` they can sustain."""
    require_positive(gpu_hour_price, "gpu_hour_price")
    require_int(gpus, "gpus", 1)
    require_positive(tokens_per_s, "tokens_per_s")
    require_fraction(utilization, "utilization")
    tokens_per_hour = tokens_per_s * utilization * SECONDS_PER_HOUR
    return gpus * gpu_hour_price * TOKENS_PER_MILLION / tokens_per_hour


@dataclass(frozen=True)
class Crossover:
    """The two prices, the throughput, and where dedicated GPUs start to pay."""

    gpu_hour_price: float
    gpus: int
    tokens_per_s: float  # what the deployment sustains at full use
    price_per_million_tokens: float  # the shared pool's price
    utilization: float  # x*, may exceed 1 (then dedicated never pays)

    @property
    def dedicated_pays(self) -> bool:
        """Whether some utilization up to 100 % makes the dedicated GPUs cheaper."""
        return self.utilization < 1

    @property
    def cost_per_million_at_full_use(self) -> float:
        """The dedicated deployment's cost per million tokens at 100 % utilization."""
        return self.cost_per_million(1.0)

    def cost_per_million(self, utilization: float) -> float:
        """The dedicated deployment's cost per million tokens at ``utilization``."""
        return dedicated_cost_per_million_tokens(
            self.gpu_hour_price, self.gpus, self.tokens_per_s, utilization
        )


def crossover(
    gpu_hour_price: float, gpus: int, tokens_per_s: float, price_per_million_tokens: float
) -> Crossover:
    """``x* = g x p_gpu x 10^6 / (3600 x R x p_token)``, with its inputs."""
    require_positive(gpu_hour_price, "gpu_hour_price")
    require_int(gpus, "gpus", 1)
    require_positive(tokens_per_s, "tokens_per_s")
    require_positive(price_per_million_tokens, "price_per_million_tokens")
    x = (
        gpus * gpu_hour_price * TOKENS_PER_MILLION
        / (SECONDS_PER_HOUR * tokens_per_s * price_per_million_tokens)
    )
    return Crossover(gpu_hour_price, gpus, tokens_per_s, price_per_million_tokens, x)
