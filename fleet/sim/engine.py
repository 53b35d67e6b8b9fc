"""A model of one vLLM engine: requests in, scheduling steps and finished requests out.

In:  ``submit(SimRequest)``; ``step(now)`` called by a driver (real time in the server,
     virtual time in tests and benchmarks).
Out: per step, its duration (from the cost model) and the requests that produced a token or
     finished; the engine's stats (``SimStats``) from which ``fleet.sim.metrics`` renders the same
     ``/metrics`` families as vLLM.

What is modelled, as in vLLM's V1 scheduler:
- continuous batching: every step decodes one token for each running request and spends the
  rest of the token budget (``max_num_batched_tokens``) on prefill chunks, oldest first;
- a paged KV cache of ``num_blocks`` blocks of ``block_size`` tokens; a request holds
  ceil(tokens / block_size) blocks; ``max_num_seqs`` running requests at most;
- prefix caching: full prompt blocks are hashed along the prompt; blocks whose hash is cached
  (held by a running request or left free-but-cached) are reused instead of computed;
- preemption: when a running request needs a block and none is free, the most recently
  admitted request is preempted (its blocks freed, recomputed later, counted);
- FCFS waiting queue; a request is admitted when its uncached prompt blocks fit;
- step time = ``step_overhead_s + prefill_tokens * prefill_token_s + decodes * decode_seq_s``,
  divided by ``speed`` (a faster GPU).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

__all__ = ["EngineConfig", "SimEngine", "SimRequest", "SimStats"]


@dataclass(frozen=True)
class EngineConfig:
    num_blocks: int = 2048
    block_size: int = 16
    max_model_len: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    step_overhead_s: float = 0.004
    prefill_token_s: float = 0.00004
    decode_seq_s: float = 0.0002
    speed: float = 1.0


@dataclass
class SimRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival: float
    trace_id: str = ""
    # filled by the engine
    computed: int = 0  # prompt tokens with KV in the cache (computed or prefix hits)
    generated: int = 0
    blocks: int = 0
    block_hashes: list[str] = field(default_factory=list)
    held_hashes: list[str] = field(default_factory=list)
    admitted_at: float | None = None
    first_scheduled: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    recompute: int = 0  # generated tokens to prefill again after a preemption
    cached_tokens: int = 0
    prefill_time: float = 0.0
    token_gaps: list[float] = field(default_factory=list)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.recompute

    @property
    def prefilled(self) -> bool:
        return self.computed >= self.context_len


@dataclass
class SimStats:
    """Cumulative counters and the observations a scrape turns into histograms."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0, "error": 0})
    observations: dict[str, list[float]] = field(default_factory=dict)

    def observe(self, name: str, value: float) -> None:
        self.observations.setdefault(name, []).append(value)


def _block_hash(parent: str, tokens: list[int]) -> str:
    return hashlib.blake2b((parent + ",".join(map(str, tokens))).encode(), digest_size=12).hexdigest()


class SimEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.free_blocks = config.num_blocks
        self.cached: OrderedDict[str, None] = OrderedDict()  # free blocks that still hold a prefix (LRU)
        self.in_use: dict[str, int] = {}  # prefix hash -> running requests holding that block
        self.stats = SimStats()

    # ------------------------------------------------------------------ state
    @property
    def used_blocks(self) -> int:
        return self.config.num_blocks - self.free_blocks - len(self.cached)

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.config.num_blocks

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def submit(self, request: SimRequest) -> None:
        if request.prompt_len + request.max_tokens > self.config.max_model_len:
            raise ValueError(
                f"prompt ({request.prompt_len}) + max_tokens ({request.max_tokens}) exceeds "
                f"max_model_len ({self.config.max_model_len})"
            )
        bs = self.config.block_size
        parent = ""
        for i in range(request.prompt_len // bs):
            parent = _block_hash(parent, request.prompt[i * bs : (i + 1) * bs])
            request.block_hashes.append(parent)
        self.waiting.append(request)

    # ------------------------------------------------------------------ blocks
    def _take_block(self) -> bool:
        if self.free_blocks > 0:
            self.free_blocks -= 1
            return True
        if self.cached:  # evict the least recently used cached prefix block
            self.cached.popitem(last=False)
            return True
        return False

    def _release(self, request: SimRequest) -> None:
        shared = 0
        for h in request.held_hashes:
            count = self.in_use.get(h, 0) - 1
            if count <= 0:
                self.in_use.pop(h, None)
                self.cached[h] = None  # the block stays, reusable, evictable
                self.cached.move_to_end(h)
            else:
                self.in_use[h] = count
            shared += 1
        self.free_blocks += request.blocks - shared
        request.blocks = 0
        request.held_hashes = []

    def _hits(self, request: SimRequest) -> int:
        hits = 0
        for h in request.block_hashes:
            if h in self.in_use or h in self.cached:
                hits += 1
            else:
                break
        return hits

    def _admit(self, request: SimRequest, now: float) -> bool:
        """Allocate the prompt's blocks (reusing cached prefix blocks); False if they don't fit."""
        cfg = self.config
        hits = self._hits(request)
        need = math.ceil((request.context_len + 1) / cfg.block_size) - hits
        reusable_cached = sum(1 for h in request.block_hashes[:hits] if h in self.cached)
        if need > self.free_blocks + len(self.cached) - reusable_cached:
            return False
        self.stats.prefix_queries += request.prompt_len
        self.stats.prefix_hits += hits * cfg.block_size
        for h in request.block_hashes[:hits]:
            if h in self.cached:
                del self.cached[h]
            self.in_use[h] = self.in_use.get(h, 0) + 1
            request.held_hashes.append(h)
        for _ in range(need):
            self._take_block()
        request.blocks = hits + need
        request.computed = hits * cfg.block_size
        request.cached_tokens = request.computed
        request.admitted_at = now
        if request.first_scheduled is None:
            request.first_scheduled = now
        return True

    def _register_prefix(self, request: SimRequest) -> None:
        """The prompt's full blocks are computed: they join the prefix cache (shared from now on)."""
        held = set(request.held_hashes)
        for h in request.block_hashes[len(request.held_hashes):]:
            if h in held or h in self.in_use or h in self.cached:
                continue  # another copy is already cached; this one stays private
            self.in_use[h] = 1
            request.held_hashes.append(h)
            held.add(h)

    def _preempt(self, now: float) -> None:
        victim = self.running.pop()  # the most recently admitted
        self._release(victim)
        victim.computed = 0
        victim.recompute = victim.generated  # recompute: prompt and tokens so far are prefilled again
        victim.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(victim)

    # ------------------------------------------------------------------ stepping
    def step(self, now: float) -> tuple[float, list[SimRequest], list[SimRequest]]:
        """Run one scheduler step starting at ``now``.

        Returns (duration, requests that got a token, requests that finished). Token and
        finish times are ``now + duration``.
        """
        cfg = self.config
        # decodes first: each prefilled running request needs room for one more token
        decoding = []
        for request in list(self.running):
            if request not in self.running or not request.prefilled:
                continue
            tokens = request.prompt_len + request.generated + 1
            while request.blocks * cfg.block_size < tokens:
                if self._take_block():
                    request.blocks += 1
                    continue
                if self.running[-1] is request and len(self.running) == 1:
                    break  # alone and still no room: cannot happen with max_model_len <= cache
                self._preempt(now)
                if request not in self.running:
                    break
            if request in self.running and request.blocks * cfg.block_size >= tokens:
                decoding.append(request)
        budget = cfg.max_num_batched_tokens - len(decoding)
        prefill_tokens = 0
        prefilling: list[SimRequest] = []
        for request in self.running:  # continue chunked prefills
            if budget <= 0:
                break
            if not request.prefilled:
                chunk = min(budget, request.context_len - request.computed)
                request.computed += chunk
                budget -= chunk
                prefill_tokens += chunk
                prefilling.append(request)
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            request = self.waiting[0]
            if not self._admit(request, now):
                break
            self.waiting.popleft()
            self.running.append(request)
            chunk = min(budget, request.context_len - request.computed)
            request.computed += chunk
            budget -= chunk
            prefill_tokens += chunk
            prefilling.append(request)
        duration = (cfg.step_overhead_s + prefill_tokens * cfg.prefill_token_s + len(decoding) * cfg.decode_seq_s) / cfg.speed
        end = now + duration
        self.stats.observe("iteration_tokens", prefill_tokens + len(decoding))
        produced: list[SimRequest] = []
        finished: list[SimRequest] = []
        for request in prefilling:
            request.prefill_time += duration
            if request.prefilled:  # the (re)prefill is done: this step also samples a token
                request.recompute = 0
                request.computed = request.context_len
                self._register_prefix(request)
                produced.append(request)
        produced.extend(decoding)
        for request in produced:
            request.generated += 1
            self.stats.generation_tokens += 1
            if request.first_token_at is None:
                request.first_token_at = end
            elif request.last_token_at is not None:
                request.token_gaps.append(end - request.last_token_at)
            request.last_token_at = end
            if request.generated >= request.max_tokens:
                finished.append(request)
        for request in finished:
            self._finish(request, end, "length")
        return duration, produced, finished

    def _finish(self, request: SimRequest, end: float, reason: str) -> None:
        self.running.remove(request)
        self._release(request)
        request.finished_at = end
        s = self.stats
        s.prompt_tokens += request.prompt_len
        s.cached_prompt_tokens += request.cached_tokens
        s.finished[reason] += 1
        ttft = (request.first_token_at or end) - request.arrival
        s.observe("ttft", ttft)
        for gap in request.token_gaps:
            s.observe("itl", gap)
        s.observe("e2e", end - request.arrival)
        s.observe("queue", (request.first_scheduled or end) - request.arrival)
        s.observe("prefill", request.prefill_time)
        s.observe("decode", end - (request.first_token_at or end))
        s.observe("inference", end - (request.first_scheduled or end))
        s.observe("prompt_tokens", request.prompt_len)
        s.observe("generation_tokens", request.generated)
        s.observe("max_tokens", request.max_tokens)
        s.observe("n", 1)
        s.observe("preemptions", request.preemptions)
        s.observe("kv_computed", request.prompt_len - request.cached_tokens)
        if request.generated > 1:
            s.observe("tpot", (end - (request.first_token_at or end)) / (request.generated - 1))
