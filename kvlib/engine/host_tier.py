"""A host-memory tier under the engine's prefix cache: blocks the GPU pool evicts are kept
in host memory, and a later prompt that starts with them copies them back instead of
computing them again (vLLM's CPU offloading connector, SGLang's HiCache, in miniature).

- **Offload.** The GPU pool reuses its least recently used free cached block when it
  needs one (:meth:`kvlib.paging.block_pool.BlockPool.allocate`). Before that happens the
  tier copies the block's keys and values, every layer, into its own pool, keyed by the
  block's hash; the host pool is LRU too and drops its oldest block past
  ``capacity_blocks``.
- **Reload.** Before each step plans, the tier walks the leading full blocks of the
  waiting requests the step can admit (in order, while the free blocks cover their
  prompts; the prompt's last token excluded, as the prefix cache does): a block the GPU
  pool still holds is kept, one only the host holds is copied into a free GPU block and
  registered under its hash, and the walk stops at the first block neither holds. The
  prefix's blocks stay off the free queue until the walk ends, so a copy never evicts the
  prefix it completes. The scheduler then finds those blocks as ordinary prefix hits.
- **Time.** With a modelled GPU clock, the copy costs :func:`kvlib.tiers.reload.reload_s`
  of the tokens brought back, for the clock's model, over the tier's link, before the
  step that uses them (the copy is not overlapped with compute: an upper bound on its
  cost).

The copies are the tensors themselves, so outputs with the tier equal outputs without it.
"""

from __future__ import annotations

import random
import statistics
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from kvlib._validate import require_int
from kvlib.engine.core import Engine, EngineConfig, Request, RequestResult, StepClock
from kvlib.engine.gpu_clock import GpuClock
from kvlib.nn.decoder import PagedKV, TinyDecoder
from kvlib.paging.block_pool import Block, BlockPool
from kvlib.paging.prefix import BlockHash, block_hashes
from kvlib.paging.table import blocks_for_tokens
from kvlib.tiers.links import Link
from kvlib.tiers.reload import reload_s

__all__ = ["HostTier", "HostTieredEngine", "MultiTurnRun", "Session", "multi_turn",
           "run_multi_turn"]


class HostTier:
    """Host copies of evicted GPU blocks, LRU, at most ``capacity_blocks`` of them."""

    def __init__(self, kv: PagedKV, pool: BlockPool, capacity_blocks: int) -> None:
        require_int(capacity_blocks, "capacity_blocks", 1)
        self.kv, self.pool, self.capacity_blocks = kv, pool, capacity_blocks
        # hash -> (keys, values), one (block_size, H_kv, d) tensor a layer each
        self.blocks: OrderedDict[BlockHash, tuple[list[torch.Tensor], list[torch.Tensor]]] = (
            OrderedDict())
        self.offloaded_blocks = 0
        self.dropped_blocks = 0
        self.reloaded_blocks = 0
        self._allocate: Callable[[int], list[Block]] = pool.allocate
        pool.allocate = self._allocate_offloading  # type: ignore[method-assign]

    def _rows(self, block: Block) -> slice:
        size = self.pool.block_size
        return slice(block.block_id * size, (block.block_id + 1) * size)

    def _allocate_offloading(self, n: int) -> list[Block]:
        """The pool's allocate, after copying out the cached blocks it is about to evict
        (the first ``n`` of its free queue)."""
        if 0 < n <= self.pool.num_free_blocks:
            for block_id in self.pool.free_block_ids()[:n]:
                block = self.pool.blocks[block_id]
                if block.block_hash is not None:
                    self._store(block)
        return self._allocate(n)

    def _store(self, block: Block) -> None:
        assert block.block_hash is not None
        rows = self._rows(block)
        self.blocks[block.block_hash] = ([k[rows].clone() for k in self.kv.keys],
                                         [v[rows].clone() for v in self.kv.values])
        self.blocks.move_to_end(block.block_hash)
        self.offloaded_blocks += 1
        while len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)  # the host pool's least recently used
            self.dropped_blocks += 1

    def reload_prefix(self, tokens: Sequence[int]) -> int:
        """Copy back the leading blocks of ``tokens`` the GPU pool lost and the host kept;
        return the tokens copied.

        The prefix's blocks, those the GPU still holds and those copied back, are held off
        the free queue until the walk ends, so that a copy never evicts the prefix's own
        earlier blocks; they are then freed last block first, leaving the leading blocks
        the last the pool evicts."""
        size = self.pool.block_size
        hashes = block_hashes(list(tokens), size)[: (len(tokens) - 1) // size]
        held: list[Block] = []
        copied = 0
        for block_hash in hashes:
            block = self.pool.get_cached_block(block_hash)
            if block is not None:
                self.pool.touch([block])
                held.append(block)
                continue
            entry = self.blocks.get(block_hash)
            if entry is None or self.pool.num_free_blocks == 0:
                break
            [block] = self.pool.allocate(1)
            rows = self._rows(block)
            for layer, (k, v) in enumerate(zip(*entry, strict=True)):
                self.kv.keys[layer][rows] = k
                self.kv.values[layer][rows] = v
            self.pool.cache_block(block, block_hash)
            held.append(block)
            self.blocks.move_to_end(block_hash)
            self.reloaded_blocks += 1
            copied += size
        # cached and free again: the scheduler's prefix lookup finds them
        self.pool.free(reversed(held))
        return copied


class HostTieredEngine(Engine):
    """:class:`kvlib.engine.core.Engine` with a :class:`HostTier` of ``host_blocks`` blocks
    under its prefix cache; copies back cost ``link``'s time on the modelled clock."""

    def __init__(
        self,
        model: TinyDecoder,
        config: EngineConfig,
        host_blocks: int,
        link: Link,
        clock: Callable[[], float] | None = None,
        gpu_clock: GpuClock | None = None,
    ) -> None:
        if not config.enable_prefix_caching:
            raise ValueError("a host tier keeps evicted prefix-cache blocks: set "
                             "enable_prefix_caching=True")
        super().__init__(model, config, clock=clock or StepClock(), gpu_clock=gpu_clock)
        self.host = HostTier(self.kv, self.cache.pool, host_blocks)
        self.link = link
        self.reloaded_tokens = 0
        self.reload_s = 0.0  # modelled seconds spent copying blocks back

    def before_schedule(self) -> None:
        """Copy back, from the host, the prefixes of the requests the next step can admit:
        first come first served, while the free blocks, less one for each running
        sequence's next token, cover each prompt's blocks (those a running sequence already
        holds excepted). A request the step cannot admit gets nothing copied: its blocks
        would be reused before it runs, and the copy paid again the next step."""
        room = self.config.max_num_seqs - len(self.scheduler.running)
        free = self.cache.pool.num_free_blocks
        tokens = 0
        for seq in list(self.scheduler.waiting)[:max(0, room)]:
            free -= self._blocks_to_admit(seq.tokens)
            if free < 0:
                break  # the scheduler admits in order: it waits, and everyone behind it
            tokens += self.host.reload_prefix(seq.tokens)
        self.reloaded_tokens += tokens
        if tokens and self.gpu_clock is not None:
            seconds = reload_s(self.gpu_clock.cfg, tokens, self.link.bytes_per_s,
                               setup_s=self.link.setup_s)
            self.modelled_now_s += seconds
            self.reload_s += seconds


    def _blocks_to_admit(self, tokens: Sequence[int]) -> int:
        """Free blocks admitting a prompt of ``tokens`` takes: all its blocks but the
        leading ones a running sequence holds (``ref_count > 0``, not in the free queue)."""
        pool, size = self.cache.pool, self.config.block_size
        hashes = block_hashes(list(tokens), size)[: (len(tokens) - 1) // size]
        held = 0
        for block_hash in hashes:
            block = pool.get_cached_block(block_hash)
            if block is None or block.ref_count == 0:
                break
            held += 1
        return blocks_for_tokens(len(tokens), size) - held


@dataclass(frozen=True)
class Session:
    """A conversation: a first prompt, then a user message a turn; each reply
    ``reply_tokens`` long; ``think_steps`` between a reply and the next message."""

    session_id: str
    first_prompt: tuple[int, ...]
    messages: tuple[tuple[int, ...], ...]
    reply_tokens: int
    think_steps: int
    start_step: int = 0


def multi_turn(sessions: int, turns: int, *, prompt_tokens: int = 24, message_tokens: int = 8,
               reply_tokens: int = 6, think_steps: int = 12, stagger_steps: int = 2,
               vocab: int = 512, seed: int = 0) -> list[Session]:
    """``sessions`` conversations of ``turns`` turns, random tokens (seeded), started
    ``stagger_steps`` apart."""
    rng = random.Random(seed)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(vocab) for _ in range(n))

    return [Session(f"s{i}", tokens(prompt_tokens),
                    tuple(tokens(message_tokens) for _ in range(turns - 1)), reply_tokens,
                    think_steps, i * stagger_steps) for i in range(sessions)]


@dataclass
class MultiTurnRun:
    """A multi-turn run: each turn's result, and the prefix cache's and host tier's counts."""

    results: dict[str, RequestResult] = field(default_factory=dict)
    prompts: dict[str, list[int]] = field(default_factory=dict)
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    reloaded_tokens: int = 0
    reload_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Prompt tokens found in the cache (GPU, or copied back from the host) over
        prompt tokens looked up."""
        return self.prefix_hit_tokens / self.prefix_query_tokens

    def mean_ttft_s(self, first_turns: bool = False) -> float:
        """Mean modelled time to first token of the later turns (or of the first ones)."""
        return statistics.fmean(
            r.modelled_ttft_s for rid, r in self.results.items()
            if r.modelled_ttft_s is not None and rid.endswith("/0") == first_turns)

    @property
    def outputs(self) -> dict[str, list[int]]:
        """Each turn's reply tokens."""
        return {rid: r.output_tokens for rid, r in self.results.items()}


def run_multi_turn(
    model: TinyDecoder,
    config: EngineConfig,
    sessions: Sequence[Session],
    *,
    host_blocks: int | None,
    link: Link,
    gpu_clock: GpuClock | None = None,
) -> MultiTurnRun:
    """Serve ``sessions`` on a :class:`StepClock`: each turn's prompt is the conversation so
    far (earlier prompts and replies) and its new message, sent ``think_steps`` after the
    previous reply ended. ``host_blocks=None``: no host tier."""
    clock = StepClock()
    engine: Engine
    if host_blocks is None:
        engine = Engine(model, config, clock=clock, gpu_clock=gpu_clock)
    else:
        engine = HostTieredEngine(model, config, host_blocks, link, clock, gpu_clock)
    run = MultiTurnRun()

    def send(session: Session, turn: int, prompt: list[int], at: float) -> None:
        rid = f"{session.session_id}/{turn}"
        run.prompts[rid] = prompt
        run.results[rid] = engine.submit(Request(rid, prompt, session.reply_tokens,
                                                 arrival_s=at))

    for session in sessions:
        send(session, 0, list(session.first_prompt), float(session.start_step))
    by_id = {s.session_id: s for s in sessions}
    done: set[str] = set()
    while any(r.finish_s is None and r.error is None for r in run.results.values()):
        engine.step(clock.now)
        clock.now += 1.0
        for rid, result in list(run.results.items()):
            if result.finish_s is None or rid in done:
                continue
            done.add(rid)
            sid, turn = rid.split("/")
            session, nxt = by_id[sid], int(turn) + 1
            if nxt <= len(session.messages):
                history = run.prompts[rid] + result.output_tokens
                send(session, nxt, history + list(session.messages[nxt - 1]),
                     clock.now + session.think_steps)
    run.prefix_query_tokens = engine.cache.prefix_query_tokens
    run.prefix_hit_tokens = engine.cache.prefix_hit_tokens
    if isinstance(engine, HostTieredEngine):
        run.reloaded_tokens, run.reload_s = engine.reloaded_tokens, engine.reload_s
    return run
