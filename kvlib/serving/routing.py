"""Routing requests to replicas that hold their prefix: hit rate and load imbalance, simulated.

``N`` replicas of one model each keep a prefix cache of ``C`` blocks. A block is named
as vLLM names it: the hash of its parent's hash and its own tokens
(:func:`kvlib.paging.prefix.hash_block_tokens`), full blocks only, so a replica can
serve the first ``n`` blocks of a prompt from its cache exactly when it holds the
first ``n`` hashes of the prompt's chain. The cache is the least recently used of
those hashes: a request touches its chain from the tail to the head (vLLM frees a
request's blocks in reverse order, "so that the tail blocks are evicted first",
``KVCacheManager.free``), so a parent is never older than its child and what a
replica holds of any chain is a prefix of it. Blocks of running requests are not
pinned here: ``C`` stands for the part of the pool free for reuse.

The workload (:class:`SessionWorkload`): sessions arrive as a Poisson stream; each
picks one of a few system prompts and runs ``turns`` turns. Turn ``k``'s prompt is the
system prompt, every earlier message and reply, and a new message; once the reply is
written the replica caches the full blocks of ``prompt + reply - 1`` tokens (the last
sampled token is never fed back, so it has no KV); the next turn arrives a think time
(exponential) after the reply.

The routers (:class:`RoundRobin`, :class:`LeastLoaded`, :class:`ConsistentHash`,
:class:`PrefixIndex`):

- round-robin sends arrival ``i`` to replica ``i mod N``;
- least-loaded to the replica with the fewest requests (or tokens) in flight;
- consistent hashing puts ``N x virtual_nodes`` points on a ring and sends a key (the
  session, or the prompt's first block hash) to the first point clockwise;
- the prefix index knows which block hashes each replica holds (NVIDIA Dynamo's
  KvIndexer and llm-d's precise prefix-cache scorer learn it from the engines' KV
  events) and sends a request to the replica with the longest cached prefix.

Both cache-aware routers take an optional load bound (consistent hashing with bounded
loads, as HAProxy's ``hash-balance-factor`` does it): a replica is eligible only while
its requests in flight stay below ``ceil(load_factor x (in flight + 1) / N)``.

Time: a request holds its replica for ``prefill_s(P - hit, hit) + O x tpot_s``
(:class:`StepService` from :func:`kvlib.step.step_time`, or :class:`LinearService`),
replicas never queue (each is a continuous-batching engine below saturation), and the
load a router sees is the requests in flight. Results over seeds are reported as
Student-t intervals, one simulation per seed (:func:`seed_interval`).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, cast

import numpy as np
import numpy.typing as npt

from kvlib._validate import is_int, is_number, require_int, require_positive
from kvlib.config import ModelConfig
from kvlib.hardware import GPUSpec
from kvlib.paging.prefix import BlockHash, cacheable_blocks, hash_block_tokens
from kvlib.serving.simulate import Estimate, t_quantile
from kvlib.step import ASSUMED_MFU, PrefillChunk, mixed_step, step_time

__all__ = [
    "ConsistentHash",
    "LeastLoaded",
    "LinearService",
    "PrefixCache",
    "PrefixIndex",
    "Replicas",
    "Request",
    "RoundRobin",
    "Router",
    "RouterSummary",
    "RoutingRun",
    "ServiceModel",
    "SessionWorkload",
    "StepService",
    "compare_routers",
    "expected_hit_rate",
    "seed_interval",
    "simulate_routing",
]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
VOCAB_SIZE = 128_000  # token ids are drawn below this; only their identity matters


def _require_number(value: object, name: str, minimum: float, strict: bool) -> float:
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        sign = ">" if strict else ">="
        raise ValueError(f"{name} must be {sign} {minimum}, got {value!r}")
    return float(value)


# --- the workload ----------------------------------------------------------------------


@dataclass(frozen=True)
class SessionWorkload:
    """Multi-turn sessions that share a few system prompts.

    Turn ``k`` (1-based) sends ``P_k = S + k x m + (k - 1) x O`` prompt tokens (system
    prompt ``S``, messages ``m``, replies ``O``) and gets ``O`` tokens back.
    """

    sessions: int
    turns: int
    system_prompts: int
    system_prompt_tokens: int
    message_tokens: int
    output_tokens: int
    sessions_per_s: float
    think_s: float
    block_size: int = 16

    def __post_init__(self) -> None:
        require_int(self.sessions, "sessions", 1)
        require_int(self.turns, "turns", 1)
        require_int(self.system_prompts, "system_prompts", 1)
        require_int(self.system_prompt_tokens, "system_prompt_tokens")
        require_int(self.message_tokens, "message_tokens", 1)
        require_int(self.output_tokens, "output_tokens", 1)
        require_positive(self.sessions_per_s, "sessions_per_s")
        _require_number(self.think_s, "think_s", 0.0, strict=False)
        require_int(self.block_size, "block_size", 1)

    def prompt_tokens(self, turn: int) -> int:
        """``P_k = S + k m + (k - 1) O`` for turn ``k`` in ``1..turns``."""
        require_int(turn, "turn", 1)
        own = turn * self.message_tokens + (turn - 1) * self.output_tokens
        return self.system_prompt_tokens + own

    def cached_after(self, turn: int) -> int:
        """Tokens whose KV exists once turn ``k``'s reply is written: ``P_k + O - 1``."""
        return self.prompt_tokens(turn) + self.output_tokens - 1

    @property
    def requests(self) -> int:
        return self.sessions * self.turns

    @property
    def prompt_tokens_total(self) -> int:
        return self.sessions * sum(self.prompt_tokens(k) for k in range(1, self.turns + 1))


@dataclass(frozen=True)
class _Session:
    key: int  # the session's id as a router would hash it
    system_prompt: int
    start_s: float
    think_s: tuple[float, ...]
    hashes: tuple[BlockHash, ...]  # the chain over the whole conversation's full blocks


def _chain(parent: BlockHash | None, tokens: Sequence[int], block_size: int) -> list[BlockHash]:
    """Hashes of the full blocks of ``tokens``, continuing the chain after ``parent``."""
    hashes = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, tokens[start : start + block_size])
        hashes.append(parent)
    return hashes


def _draw_sessions(workload: SessionWorkload, seed: int) -> list[_Session]:
    """Arrival times, think times, system prompts and token ids for one seed."""
    w, b = workload, workload.block_size
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, VOCAB_SIZE, w.system_prompt_tokens).tolist()
               for _ in range(w.system_prompts)]
    head = [(s[: len(s) // b * b], _chain(None, s, b)) for s in systems]  # shared full blocks
    starts = np.cumsum(rng.exponential(1 / w.sessions_per_s, w.sessions))
    picks = rng.integers(0, w.system_prompts, w.sessions)
    keys = rng.integers(0, 2**63, w.sessions)
    own = w.turns * (w.message_tokens + w.output_tokens)
    sessions = []
    for i in range(w.sessions):
        k = int(picks[i])
        done, shared = head[k]
        tail = systems[k][len(done):] + rng.integers(0, VOCAB_SIZE, own).tolist()
        parent = shared[-1] if shared else None
        chain = shared + _chain(parent, tail, b)
        think = rng.exponential(w.think_s, w.turns).tolist() if w.think_s > 0 else [0.0] * w.turns
        sessions.append(_Session(int(keys[i]), k, float(starts[i]), tuple(think), tuple(chain)))
    return sessions


# --- replicas and their caches ---------------------------------------------------------


class PrefixCache:
    """One replica's prefix cache: block hashes in LRU order (most recent last).

    :meth:`store` touches a chain's first ``n`` hashes tail first, so the head is the most
    recent and eviction takes tails first; what the cache holds of a chain is then
    always a prefix of it, and :meth:`cached_blocks` finds its length by bisection.
    """

    def __init__(self, capacity_blocks: int | None) -> None:
        if capacity_blocks is not None:
            require_int(capacity_blocks, "cache_blocks", 1)
        self.capacity_blocks = capacity_blocks
        self._lru: OrderedDict[BlockHash, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._lru

    def cached_blocks(self, hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of ``hashes`` the cache holds (a prefix, by the order)."""
        low, high = 0, len(hashes)
        while low < high:  # invariant: hashes[:low] cached, hashes[high:] not
            mid = (low + high + 1) // 2
            if hashes[mid - 1] in self._lru:
                low = mid
            else:
                high = mid - 1
        return low

    def store(self, hashes: Sequence[BlockHash]) -> None:
        """Touch (or add) ``hashes`` tail first, then evict the least recent past capacity."""
        lru = self._lru
        held = self.cached_blocks(hashes)
        lru.update(dict.fromkeys(reversed(hashes[held:])))  # new blocks, appended tail first
        deque(map(lru.move_to_end, reversed(hashes[:held])), maxlen=0)  # then the held prefix
        if self.capacity_blocks is not None:
            while len(lru) > self.capacity_blocks:
                lru.popitem(last=False)


@dataclass(slots=True)
class Request:
    """One turn as the router sees it: its session, prompt and block hashes."""

    index: int  # arrival order
    session: int
    session_key: int  # a random id, as a client's session header would carry
    turn: int
    prompt_tokens: int
    output_tokens: int
    hashes: Sequence[BlockHash]  # the prompt's full blocks


class Replicas:
    """What a router may look at: each replica's cache and the work it has in flight."""

    def __init__(self, replicas: int, cache_blocks: int | None) -> None:
        require_int(replicas, "replicas", 1)
        self.count = replicas
        self.caches = [PrefixCache(cache_blocks) for _ in range(replicas)]
        self.in_flight = [0] * replicas
        self.in_flight_tokens = [0] * replicas
        self.last = -1  # the replica chosen last

    def allowed(self, load_factor: float | None) -> list[int]:
        """Replicas under the bound ``in_flight < ceil(c x (total + 1) / N)``; all when None."""
        if load_factor is None:
            return list(range(self.count))
        cap = math.ceil(load_factor * (sum(self.in_flight) + 1) / self.count)
        return [r for r in range(self.count) if self.in_flight[r] < cap]

    def least_loaded(self, candidates: Iterable[int], by: str = "requests") -> int:
        """The candidate with the least in flight; ties go to the next one after ``last``."""
        load = self.in_flight if by == "requests" else self.in_flight_tokens
        return min(candidates, key=lambda r: (load[r], (r - self.last - 1) % self.count))


# --- routers ---------------------------------------------------------------------------


class Router(Protocol):
    """A routing policy: which replica serves ``request``."""

    @property
    def name(self) -> str: ...

    def choose(self, request: Request, replicas: Replicas) -> int: ...


def _check_load_factor(load_factor: float | None) -> None:
    if load_factor is not None:
        _require_number(load_factor, "load_factor", 1.0, strict=False)


@dataclass(frozen=True)
class RoundRobin:
    """Arrival ``i`` goes to replica ``i mod N``."""

    @property
    def name(self) -> str:
        return "round-robin"

    def choose(self, request: Request, replicas: Replicas) -> int:
        return request.index % replicas.count


@dataclass(frozen=True)
class LeastLoaded:
    """The replica with the fewest requests in flight (``by="tokens"``: the fewest prompt
    tokens still to prefill plus reply tokens still to decode)."""

    by: Literal["requests", "tokens"] = "requests"

    def __post_init__(self) -> None:
        if self.by not in ("requests", "tokens"):
            raise ValueError(f"by must be 'requests' or 'tokens', got {self.by!r}")

    @property
    def name(self) -> str:
        return f"least-loaded ({self.by})"

    def choose(self, request: Request, replicas: Replicas) -> int:
        return replicas.least_loaded(range(replicas.count), self.by)


def _point(text: bytes) -> int:
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


@dataclass(frozen=True)
class ConsistentHash:
    """A hash ring of ``virtual_nodes`` points per replica; the key is the session
    (``key="session"``) or the prompt's first block hash (``key="prefix"``, the system
    prompt when it fills a block). With ``load_factor``, the walk clockwise skips
    replicas at the bound (bounded loads)."""

    key: Literal["session", "prefix"] = "session"
    virtual_nodes: int = 64
    load_factor: float | None = None
    _rings: dict[int, tuple[list[int], list[int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.key not in ("session", "prefix"):
            raise ValueError(f"key must be 'session' or 'prefix', got {self.key!r}")
        require_int(self.virtual_nodes, "virtual_nodes", 1)
        _check_load_factor(self.load_factor)

    @property
    def name(self) -> str:
        bound = f", bound {self.load_factor:g}" if self.load_factor is not None else ""
        return f"consistent hash ({self.key}{bound})"

    def ring(self, replicas: int) -> tuple[list[int], list[int]]:
        """Sorted ring points and the replica owning each."""
        if replicas not in self._rings:
            points = sorted((_point(f"replica {r} vnode {v}".encode()), r)
                            for r in range(replicas) for v in range(self.virtual_nodes))
            self._rings[replicas] = ([p for p, _ in points], [r for _, r in points])
        return self._rings[replicas]

    def _key(self, request: Request) -> int:
        if self.key == "prefix" and request.hashes:
            return int.from_bytes(request.hashes[0][:8], "big")
        return _point(f"session {request.session_key}".encode())

    def choose(self, request: Request, replicas: Replicas) -> int:
        points, owners = self.ring(replicas.count)
        start = bisect.bisect_left(points, self._key(request))
        allowed = set(replicas.allowed(self.load_factor))
        for step in range(len(points)):
            owner = owners[(start + step) % len(points)]
            if owner in allowed:
                return owner
        raise AssertionError("a load_factor >= 1 always leaves a replica under the bound")


@dataclass(frozen=True)
class PrefixIndex:
    """The replica whose cache holds the longest prefix of the prompt's block hashes, among
    those under the load bound; ties go to the least loaded."""

    load_factor: float | None = 1.5

    def __post_init__(self) -> None:
        _check_load_factor(self.load_factor)

    @property
    def name(self) -> str:
        bound = f"bound {self.load_factor:g}" if self.load_factor is not None else "no bound"
        return f"prefix index ({bound})"

    def choose(self, request: Request, replicas: Replicas) -> int:
        allowed = replicas.allowed(self.load_factor)
        matched = {r: replicas.caches[r].cached_blocks(request.hashes) for r in allowed}
        best = max(matched.values())
        return replicas.least_loaded([r for r in allowed if matched[r] == best])


# --- time --------------------------------------------------------------------------------


class ServiceModel(Protocol):
    """Seconds a replica spends on a request."""

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float: ...

    def service_s(self, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> float: ...


@dataclass(frozen=True)
class LinearService:
    """``prefill_s = a (P - hit)``, ``service_s = prefill_s + O x tpot_s``."""

    prefill_s_per_token: float
    tpot_s: float

    def __post_init__(self) -> None:
        require_positive(self.prefill_s_per_token, "prefill_s_per_token")
        require_positive(self.tpot_s, "tpot_s")

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        return (prompt_tokens - cached_tokens) * self.prefill_s_per_token

    def service_s(self, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        return self.prefill_s(prompt_tokens, cached_tokens) + output_tokens * self.tpot_s


class StepService:
    """The course's step model: the prompt's uncached tokens prefilled as one chunk after
    the cached ones, alone on the GPU (:func:`kvlib.step.step_time`, attention's
    quadratic term included), then ``O`` decode steps at ``tpot_s``, the step of
    ``decode_batch`` sequences at ``context_tokens`` (:func:`kvlib.step.mixed_step`)."""

    def __init__(self, cfg: ModelConfig, gpu: GPUSpec, *, decode_batch: int = 32,
                 context_tokens: int = 4_096, mfu: float = ASSUMED_MFU) -> None:
        require_int(decode_batch, "decode_batch", 1)
        require_int(context_tokens, "context_tokens", 1)
        self.cfg, self.gpu, self.mfu = cfg, gpu, mfu
        self.tpot_s = mixed_step(cfg, gpu, decode_batch, context_tokens, mfu=mfu).total_s
        self._prefill: dict[tuple[int, int], float] = {}

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        key = (prompt_tokens, cached_tokens)
        if key not in self._prefill:
            chunk = PrefillChunk(prompt_tokens - cached_tokens, cached_tokens)
            self._prefill[key] = step_time(self.cfg, self.gpu, [], [chunk], mfu=self.mfu).total_s
        return self._prefill[key]

    def service_s(self, prompt_tokens: int, cached_tokens: int, output_tokens: int) -> float:
        return self.prefill_s(prompt_tokens, cached_tokens) + output_tokens * self.tpot_s


# --- one run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoutingRun:
    """Every request of one simulated run, in arrival order."""

    router: str
    replicas: int
    arrival_s: Floats
    replica: Ints
    session: Ints
    turn: Ints
    prompt_tokens: Ints
    hit_tokens: Ints
    prefill_s: Floats
    service_s: Floats

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from a cache over all prompt tokens."""
        return float(self.hit_tokens.sum() / self.prompt_tokens.sum())

    @property
    def requests_per_replica(self) -> Ints:
        counts: Ints = np.bincount(self.replica, minlength=self.replicas)
        return counts

    @property
    def busy_s_per_replica(self) -> Floats:
        """Seconds of work each replica was given (prefill and decode)."""
        busy = np.bincount(self.replica, self.service_s, minlength=self.replicas)
        return busy.astype(np.float64)

    @property
    def request_imbalance(self) -> float:
        """``max / mean`` of requests per replica (1: perfectly even)."""
        counts = self.requests_per_replica
        return float(counts.max() / counts.mean())

    @property
    def work_imbalance(self) -> float:
        """``max / mean`` of busy seconds per replica."""
        busy = self.busy_s_per_replica
        return float(busy.max() / busy.mean())

    @property
    def work_cv(self) -> float:
        """Coefficient of variation of busy seconds per replica (0: even)."""
        busy = self.busy_s_per_replica
        return float(busy.std() / busy.mean())

    @property
    def mean_in_flight(self) -> float:
        """Requests in flight on a replica, averaged over the run: busy seconds over
        ``N x`` the span from the first arrival to the last reply."""
        span = float((self.arrival_s + self.service_s).max() - self.arrival_s.min())
        return float(self.service_s.sum() / (self.replicas * span))

    @property
    def mean_prefill_s(self) -> float:
        """Mean prefill seconds a request (the TTFT without queueing)."""
        return float(self.prefill_s.mean())


def _require_router(router: object) -> Router:
    if not (hasattr(router, "choose") and hasattr(router, "name")):
        raise TypeError(f"router must be a Router (RoundRobin(), PrefixIndex(), ...), "
                        f"got {router!r}")
    return cast(Router, router)


def _run(workload: SessionWorkload, sessions: list[_Session], router: Router, replicas: int,
         cache_blocks: int | None, service: ServiceModel) -> RoutingRun:
    """The event loop: arrivals are routed and cached; completions cache the reply and
    schedule the session's next turn a think time later."""
    w, b = workload, workload.block_size
    state = Replicas(replicas, cache_blocks)
    events: list[tuple[float, int, int, int, int]] = []  # (time, tiebreak, kind, session, turn)
    for i, s in enumerate(sessions):
        events.append((s.start_s, i, 0, i, 1))
    heapq.heapify(events)
    order = len(events)
    rows: list[tuple[float, int, int, int, int, int, float, float]] = []
    placed: dict[tuple[int, int], tuple[int, int]] = {}  # (session, turn) -> (replica, tokens)
    while events:
        now, _, kind, i, turn = heapq.heappop(events)
        chain = sessions[i].hashes
        if kind == 0:  # arrival
            prompt = w.prompt_tokens(turn)
            request = Request(len(rows), i, sessions[i].key, turn, prompt, w.output_tokens,
                              chain[: prompt // b])
            r = router.choose(request, state)
            hit = b * cacheable_blocks(b * state.caches[r].cached_blocks(request.hashes), prompt, b)
            state.caches[r].store(request.hashes)  # the prompt's blocks, once prefilled
            prefill = service.prefill_s(prompt, hit)
            busy = service.service_s(prompt, hit, w.output_tokens)
            tokens = prompt - hit + w.output_tokens
            state.in_flight[r] += 1
            state.in_flight_tokens[r] += tokens
            state.last = r
            placed[(i, turn)] = (r, tokens)
            rows.append((now, r, i, turn, prompt, hit, prefill, busy))
            order += 1
            heapq.heappush(events, (now + busy, order, 1, i, turn))
        else:  # the reply is written
            r, tokens = placed.pop((i, turn))
            state.in_flight[r] -= 1
            state.in_flight_tokens[r] -= tokens
            state.caches[r].store(chain[: w.cached_after(turn) // b])
            if turn < w.turns:
                order += 1
                heapq.heappush(events, (now + sessions[i].think_s[turn - 1], order, 0, i, turn + 1))
    columns = list(zip(*rows, strict=True))
    return RoutingRun(
        router=router.name, replicas=replicas, arrival_s=np.array(columns[0]),
        replica=np.array(columns[1], dtype=np.int64),
        session=np.array(columns[2], dtype=np.int64),
        turn=np.array(columns[3], dtype=np.int64),
        prompt_tokens=np.array(columns[4], dtype=np.int64),
        hit_tokens=np.array(columns[5], dtype=np.int64),
        prefill_s=np.array(columns[6]),
        service_s=np.array(columns[7]),
    )


def _check_setup(replicas: int, cache_blocks: int | None, service: object) -> None:
    require_int(replicas, "replicas", 1)
    if cache_blocks is not None:
        require_int(cache_blocks, "cache_blocks", 1)
    if not (hasattr(service, "prefill_s") and hasattr(service, "service_s")):
        raise TypeError(f"service must be a LinearService or StepService, got {service!r}")


def simulate_routing(workload: SessionWorkload, router: Router, *, replicas: int,
                     cache_blocks: int | None, service: ServiceModel, seed: int) -> RoutingRun:
    """One run of ``workload`` over ``replicas`` replicas of ``cache_blocks`` blocks each
    (None: unbounded), routed by ``router``; the same ``seed`` gives the same run."""
    _check_setup(replicas, cache_blocks, service)
    require_int(seed, "seed")
    return _run(workload, _draw_sessions(workload, seed), _require_router(router), replicas,
                cache_blocks, service)


# --- many seeds ----------------------------------------------------------------------------


def seed_interval(values: Sequence[float] | Floats, confidence: float = 0.95) -> Estimate:
    """Mean of one statistic over independent runs (one per seed) +- ``t(confidence,
    n - 1) x sd / sqrt(n)``, Student's t at ``n - 1`` degrees of freedom; ``n >= 10``
    (:func:`kvlib.serving.simulate.t_quantile`'s accuracy). ``batches`` is ``n``."""
    data = np.asarray(values, dtype=float)
    if len(data) < 10:
        raise ValueError(f"seeds: a t-interval here needs at least 10 runs, got {len(data)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, e.g. 0.95, got {confidence!r}")
    half = t_quantile(0.5 + confidence / 2, len(data) - 1) * data.std(ddof=1) / math.sqrt(len(data))
    return Estimate(float(data.mean()), float(half), confidence, len(data))


STATISTICS: dict[str, Callable[[RoutingRun], float]] = {
    "hit_rate": lambda run: run.hit_rate,
    "request_imbalance": lambda run: run.request_imbalance,
    "work_imbalance": lambda run: run.work_imbalance,
    "mean_prefill_s": lambda run: run.mean_prefill_s,
}


@dataclass(frozen=True)
class RouterSummary:
    """One router's statistics over seeds, each a t-interval (:func:`seed_interval`)."""

    router: str
    seeds: int
    hit_rate: Estimate
    request_imbalance: Estimate
    work_imbalance: Estimate
    mean_prefill_s: Estimate


def compare_routers(workload: SessionWorkload, routers: Sequence[Router], *, replicas: int,
                    cache_blocks: int | None, service: ServiceModel, seeds: int | Sequence[int],
                    confidence: float = 0.95) -> list[RouterSummary]:
    """Every router on the same draws (seed ``0 .. seeds - 1``, or the seeds given): common
    random numbers, so differences between routers are not noise between workloads."""
    _check_setup(replicas, cache_blocks, service)
    if isinstance(seeds, int):
        seed_list = list(range(require_int(seeds, "seeds", 10)))
    else:
        seed_list = list(seeds)
    if any(not is_int(s) or s < 0 for s in seed_list):
        raise ValueError(f"seeds must be a count >= 10 or non-negative integers, got {seeds!r}")
    if len(set(seed_list)) < 10:
        raise ValueError(f"seeds: a t-interval here needs at least 10 distinct seeds, "
                         f"got {seeds!r}")
    checked = [_require_router(r) for r in routers]
    if not checked:
        raise ValueError("routers must name at least one router, e.g. [RoundRobin()]")
    runs: list[list[RoutingRun]] = [[] for _ in checked]
    for seed in seed_list:
        sessions = _draw_sessions(workload, seed)
        for k, router in enumerate(checked):
            runs[k].append(_run(workload, sessions, router, replicas, cache_blocks, service))
    return [
        RouterSummary(router.name, len(seed_list), *(
            seed_interval([stat(run) for run in runs[k]], confidence)
            for stat in STATISTICS.values()))
        for k, router in enumerate(checked)
    ]


# --- closed form -------------------------------------------------------------------------


def expected_hit_rate(workload: SessionWorkload, replicas: int) -> float:
    """Hit rate with unbounded caches, after warm-up, when each turn lands on a replica
    drawn uniformly and independently (round-robin over many interleaved sessions):

        E[hit_k] = sum_{j<k} p q^(k-1-j) c(P_j + O - 1, P_k) + q^(k-1) c(S, P_k),

    ``p = 1 / N``, ``q = 1 - p``: the latest earlier turn ``j`` on the same replica left
    the conversation up to its reply cached; with none, only the system prompt is there.
    ``c(T, P) = B min(floor(T / B), floor((P - 1) / B))`` (:func:`cacheable_blocks`). With
    ``N = 1`` it is session affinity: every turn finds its previous turn's blocks.
    """
    require_int(replicas, "replicas", 1)
    w, b = workload, workload.block_size
    p = 1 / replicas
    q = 1 - p
    hit = 0.0
    for k in range(1, w.turns + 1):
        prompt = w.prompt_tokens(k)
        hit += q ** (k - 1) * b * cacheable_blocks(w.system_prompt_tokens, prompt, b)
        for j in range(1, k):
            hit += p * q ** (k - 1 - j) * b * cacheable_blocks(w.cached_after(j), prompt, b)
    return hit * w.sessions / w.prompt_tokens_total
