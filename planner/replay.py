"""Recorded traffic replayed through a fleet variant in virtual time: the gateway's own routing
(``fleet.gateway.routing.Router``), its admission limits, and the engine simulator
(``fleet.sim.engine.SimEngine``: continuous batching, paged KV cache, prefix caching, preemption).

In:  a ``planner.fleet.Variant``, ``planner.traffic.Arrival``s, the window's length.
Out: ``Outcome``: per request ``[at, model, replica, tenant, prompt_tokens, completion_tokens,
     cached_tokens, ttft, itl, e2e, queue, outcome]`` (``outcome``: ok, rejected — the gateway's
     queue was full or its wait too long —, no_replica, or too_long — the engine answers 400),
     every token gap (for ITL quantiles), and each replica's KV-cache usage sampled every
     ``TICK_S`` seconds of virtual time (while it is up); ``up``: each replica's up-interval
     (a fixed pool's replicas the whole window; an autoscaled pool's from ready to removed,
     ``planner.scaling``) and ``scaling``: the autoscaler's decisions and replica steps.

The gateway forwards at most ``max_in_flight`` requests at once; the next ones wait in its queue
(up to ``max_queue``; a fuller queue or a wait past ``queue_timeout_s`` rejects them, as its 429
does), and a waiting request is sent on at the next tick a slot is free. A request's TTFT counts
from its arrival at the gateway. Engines that share one host's CPU cores (``shared_cores``: the
CPU demo fleet) run ``busy engines / cores`` times slower while more of them are busy than there
are cores, re-judged at every arrival and tick. Runs as fast as the CPU allows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from fleet.gateway.config import GatewaySpec
from fleet.gateway.routing import NoReplica, ReplicaState, Router
from fleet.sim.engine import EngineConfig, RequestRejected, SimEngine, SimRequest
from planner.fleet import Pool, Variant
from planner.scaling import EVENT_COLUMNS, UP_COLUMNS, Scaling
from planner.traffic import Arrival

__all__ = ["TICK_S", "Outcome", "replay"]

TICK_S = 1.0


@dataclass
class Outcome:
    requests: pd.DataFrame
    gaps: dict[str, np.ndarray]  # model -> every inter-token gap (seconds)
    kv: pd.DataFrame  # [t, replica, model, kv]
    seconds: float
    variant: Variant
    replicas: dict[str, str] = field(default_factory=dict)  # replica -> model
    up: pd.DataFrame | None = None  # [replica, model, start, end] seconds; None: every pool's replicas, throughout
    scaling: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EVENT_COLUMNS))


@dataclass
class _Replica:
    state: ReplicaState
    engine: SimEngine
    clock: float = 0.0
    configs: dict[float, EngineConfig] = field(default_factory=dict)  # its config at each share of the CPU

    def share(self, slower: float) -> None:
        """Run ``slower`` times slower (engines sharing a host's cores)."""
        key = round(slower, 2)
        config = self.configs.get(key)
        if config is None:
            base = self.configs.setdefault(1.0, self.engine.config)
            config = self.configs[key] = replace(base, speed=base.speed / key)
        self.engine.config = config

    def advance(self, until: float) -> list[SimRequest]:
        self.clock, done = self.engine.run_until(self.clock, until)
        self.state.in_flight = len(self.engine.running) + len(self.engine.waiting)
        return done


def replay(variant: Variant, arrivals: list[Arrival], seconds: float) -> Outcome:
    """``arrivals`` through ``variant`` (see the module docstring)."""
    run = _Replay(variant)
    tick = 0.0
    for n, arrival in enumerate(arrivals):
        while tick <= arrival.at:
            run.advance(tick)
            run.scaling.tick(tick)
            run.admit(tick)
            run.sample_kv(tick)
            tick += TICK_S
        run.arrive(arrival, n)
    run.drain(tick, max(seconds, arrivals[-1].at if arrivals else 0.0))
    return run.outcome(seconds)


class _Replay:
    """The state of one replay: the replicas, the gateway's router and queue, and the rows so far."""

    __slots__ = (
        "cores",
        "forwarded",
        "gaps",
        "kv",
        "meta",
        "replicas",
        "router",
        "rows",
        "scaling",
        "variant",
        "waiting",
    )

    def __init__(self, variant: Variant) -> None:
        self.variant = variant
        self.replicas: dict[str, _Replica] = {}
        for pool in variant.pools.values():
            config = pool.engine_config()
            for name in pool.replica_names():
                self.replicas[name] = _Replica(ReplicaState(name, pool.model, url=""), SimEngine(config))
        spec = GatewaySpec(policy=variant.policy, model_router=variant.router, max_in_flight=variant.max_in_flight)  # type: ignore[arg-type]
        self.router = Router(spec, [r.state for r in self.replicas.values()])
        self.scaling = Scaling(variant, self.replicas, self.router, self.spawn)
        self.rows: list[dict[str, object]] = []
        self.gaps: dict[str, list[float]] = {}
        self.kv: list[tuple[float, str, str, float]] = []
        self.meta: dict[str, dict[str, object]] = {}  # request id -> its row so far
        self.waiting: deque[tuple[Arrival, int]] = deque()  # the gateway's queue
        self.forwarded = 0
        self.cores = variant.shared_cores

    def finish(self, request: SimRequest) -> None:
        self.forwarded -= 1
        row = self.meta.pop(request.request_id)
        arrived = float(row["at"])  # type: ignore[arg-type]
        first = request.first_token_at if request.first_token_at is not None else request.finished_at
        row.update(
            cached_tokens=request.cached_tokens,
            completion_tokens=request.generated,
            ttft=(first or arrived) - arrived,
            e2e=(request.finished_at or arrived) - arrived,
            queue=(request.first_scheduled or arrived) - arrived,
            itl=float(np.mean(request.token_gaps)) if request.token_gaps else np.nan,
            outcome="ok",
        )
        self.gaps.setdefault(str(row["model"]), []).extend(request.token_gaps)
        self.rows.append(row)
        if self.scaling:
            self.scaling.finished(str(row["model"]), request.finished_at or arrived, float(row["ttft"]))  # type: ignore[arg-type]

    def spawn(self, name: str, pool: Pool) -> _Replica:
        """A new replica of ``pool`` (the autoscaler's): unhealthy, outside the router until its cold start ends."""
        replica = _Replica(
            ReplicaState(name, pool.model, url=f"replay://{name}", healthy=False), SimEngine(pool.engine_config())
        )
        self.replicas[name] = replica
        return replica

    def advance(self, until: float) -> None:
        replicas = self.replicas
        if self.cores:  # engines on one host share its cores: each runs slower while more than it has are busy
            busy = sum(1 for r in replicas.values() if r.engine.has_work())
            for r in replicas.values():
                r.share(max(1.0, busy / self.cores))
        for replica in replicas.values():
            for request in replica.advance(until):
                self.finish(request)

    def sample_kv(self, tick: float) -> None:
        self.kv.extend(
            (tick, name, r.state.model, r.engine.kv_usage) for name, r in self.replicas.items() if r.state.healthy
        )

    def arrive(self, arrival: Arrival, n: int) -> None:
        """The ``n``-th request at the gateway: sent on, queued, or rejected (queue full)."""
        self.advance(arrival.at)
        if self.forwarded < self.variant.max_in_flight and not self.waiting:
            self.send(arrival, n, arrival.at)
        elif len(self.waiting) < self.variant.max_queue:
            self.waiting.append((arrival, n))
        else:
            self.rows.append(_rejected(arrival, self.model_of(arrival)))

    def send(self, arrival: Arrival, n: int, now: float) -> None:
        row: dict[str, object] = {
            "at": arrival.at,
            "tenant": arrival.tenant,
            "prompt_tokens": len(arrival.prompt),
            "completion_tokens": 0,
            "cached_tokens": 0,
        }
        try:
            decision = self.router.decide(
                arrival.model,
                arrival.tenant,
                len(arrival.prompt),
                arrival.asked_tokens or arrival.max_tokens,
                arrival.key,
            )
        except NoReplica:
            self.rows.append(dict(row, model=self.model_of(arrival), replica="", outcome="no_replica"))
            return
        target = self.replicas[decision.replica.name]
        row.update(model=decision.model, replica=target.state.name)
        target.advance(now)
        try:
            target.engine.submit(
                SimRequest(request_id=f"r{n}", prompt=arrival.prompt, max_tokens=arrival.max_tokens, arrival=arrival.at)
            )
        except RequestRejected:
            self.rows.append(dict(row, outcome="too_long"))
            return
        target.state.in_flight += 1
        self.meta[f"r{n}"] = row
        self.forwarded += 1

    def model_of(self, arrival: Arrival) -> str:
        """The model a request counts against: the router's choice for ``auto`` (a refused request
        misses its model's SLO), else the one asked for."""
        try:
            return self.router.choose_model(
                arrival.model, arrival.tenant, len(arrival.prompt), arrival.asked_tokens or arrival.max_tokens
            )[0]
        except NoReplica:
            return arrival.model

    def admit(self, now: float) -> None:
        """The gateway's queue sent on while slots are free (a request that waited too long: rejected)."""
        while self.waiting and self.forwarded < self.variant.max_in_flight:
            arrival, n = self.waiting.popleft()
            if now - arrival.at > self.variant.queue_timeout_s:
                self.rows.append(_rejected(arrival, self.model_of(arrival)))
                continue
            self.send(arrival, n, now)

    def drain(self, tick: float, horizon: float) -> None:
        """After the last arrival: ticks until every request finished and the queue is empty (KV
        sampled up to ``horizon``), for at most an hour past it; what is left is ``unfinished``. An
        autoscaled fleet ticks on to ``horizon`` (its pools shrink when the traffic is over)."""
        while self.meta or self.waiting or (self.scaling and tick < horizon):
            self.advance(tick)
            if tick < horizon:
                self.scaling.tick(tick)
            self.admit(tick)
            if tick < horizon:
                self.sample_kv(tick)
            tick += TICK_S
            if tick > horizon + 3600:  # a fleet that cannot drain its queue in an hour: the rest never finished
                break
        for row in self.meta.values():
            self.rows.append(dict(row, outcome="unfinished"))
        for arrival, _n in self.waiting:  # still in the gateway's queue when the replay gave up
            self.rows.append(dict(_rejected(arrival, self.model_of(arrival)), outcome="unfinished"))

    def outcome(self, seconds: float) -> Outcome:
        df = pd.DataFrame(self.rows).reindex(columns=_COLUMNS).sort_values("at", ignore_index=True)
        fixed = [
            (name, pool.model, 0.0, seconds)
            for pool in self.variant.pools.values()
            if pool.autoscale is None
            for name in pool.replica_names()
        ]
        up = pd.DataFrame([*fixed, *self.scaling.up(seconds)], columns=UP_COLUMNS)
        return Outcome(
            df,
            {m: np.asarray(g, float) for m, g in self.gaps.items()},
            pd.DataFrame(self.kv, columns=["t", "replica", "model", "kv"]),
            seconds,
            self.variant,
            {name: r.state.model for name, r in self.replicas.items()},
            up,
            self.scaling.events(),
        )


_COLUMNS = [
    "at",
    "model",
    "replica",
    "tenant",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "ttft",
    "itl",
    "e2e",
    "queue",
    "outcome",
]


def _rejected(arrival: Arrival, model: str) -> dict[str, object]:
    return {
        "at": arrival.at,
        "model": model,
        "replica": "",
        "tenant": arrival.tenant,
        "prompt_tokens": len(arrival.prompt),
        "completion_tokens": 0,
        "cached_tokens": 0,
        "outcome": "rejected",
    }
