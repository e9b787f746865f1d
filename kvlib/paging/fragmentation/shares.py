"""The simulator's result: how KV memory was spent, averaged over the measured steps."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MemoryShares", "ShareTotals"]


@dataclass(frozen=True)
class MemoryShares:
    """Time-averaged shares of KV memory (they sum to 1) while requests wait, and counts.

    ``token_states``: slots holding a token's keys and values; ``reserved``:
    slots set aside for tokens not produced yet; ``internal``: slots past a
    request's final length (over-reservation) or the empty end of a last
    block; ``external``: slots no request holds (holes too small for the next
    request, or blocks left over when the next prompt does not fit).
    """

    policy: str
    block_size: int | None
    capacity_tokens: int
    token_states: float
    reserved: float
    internal: float
    external: float
    mean_running: float
    measured_steps: int
    total_steps: int
    preemptions: int = 0
    recomputed_tokens: int = 0
    timeline: tuple[tuple[int, int, int, int], ...] = field(default=(), repr=False)
    """(step, slots held, token states, running requests) of every step, when asked for."""
    preempted_at: tuple[int, ...] = field(default=(), repr=False)
    """The step of every preemption, when a timeline is asked for."""

    @property
    def wasted(self) -> float:
        """Everything but token states: ``1 - token_states``."""
        return 1 - self.token_states


class ShareTotals:
    """Sums of per-step slot counts over the steps in which requests wait."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self.steps = self.states = self.reserved = self.internal = self.free = self.running = 0

    def add(self, steps: int, states: int, reserved: int, internal: int, running: int) -> None:
        """Add ``steps`` steps whose summed slots are given (free slots are the rest)."""
        self.steps += steps
        self.states += states
        self.reserved += reserved
        self.internal += internal
        self.free += steps * self.capacity - states - reserved - internal
        self.running += running

    def shares(
        self,
        policy: str,
        block_size: int | None,
        *,
        total_steps: int,
        preemptions: int = 0,
        recomputed_tokens: int = 0,
        timeline: tuple[tuple[int, int, int, int], ...] = (),
        preempted_at: tuple[int, ...] = (),
    ) -> MemoryShares:
        """The averages, as a :class:`MemoryShares`."""
        whole = max(self.steps, 1) * self.capacity
        return MemoryShares(
            policy=policy,
            block_size=block_size,
            capacity_tokens=self.capacity,
            token_states=self.states / whole,
            reserved=self.reserved / whole,
            internal=self.internal / whole,
            external=self.free / whole,
            mean_running=self.running / max(self.steps, 1),
            measured_steps=self.steps,
            total_steps=total_steps,
            preemptions=preemptions,
            recomputed_tokens=recomputed_tokens,
            timeline=timeline,
            preempted_at=preempted_at,
        )
