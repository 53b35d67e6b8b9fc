"""The autoscaler in virtual time: the simulator's pools grow and shrink as the live fleet's would.

In:  the fleet spec (its ``autoscale`` section: the evaluation interval, the first port, each
     pool's ``ScalePolicy``; ``pool_template`` for a new replica; the models' ``slo.ttft``), the
     gateway's ``Router`` and the simulator's replicas (``fleet.sim.replay``), a factory that makes
     a simulated replica from a ``ReplicaSpec``, and, from the player, the clock and the request
     records that finished.
Out: every ``interval_s`` each pool's signals (from its ready replicas' engines: mean
     ``kv_cache_usage``, ``requests_waiting`` and ``requests_running`` per replica; the p99 TTFT of
     the pool's requests that finished in the last minute over the model's TTFT SLO), the
     policy's decision (``policy.decide``), applied:

     - **scale out**: a replica copied from the pool's template (name ``<prefix>-<n>`` continuing
       the pool's numbering, a free port from ``AutoscaleSpec.ports()``) starts; it is neither
       scraped nor routable until ``ready_at = decided + cold_start_s`` (the simulated start-up),
       then joins the router (``ready``); ``serving`` is its first request's first token.
     - **scale in**: the pool's newest ready replica is drained: the router sends it nothing new,
       its requests finish, then it is removed (no request fails by a drain).

     ``ScaleEvent`` rows (``source="sim"``) for every decision and step, taken by the player with
     ``take_events``; ``next_at`` says when the scaler next has something to do.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from fleet.autoscale.events import ScaleEvent, from_decision
from fleet.autoscale.policy import Decision, PoolState, ScalePolicy, decide
from fleet.errors import FleetError
from fleet.gateway.routing import ReplicaState, Router
from fleet.sim.engine import SimEngine
from fleet.spec import FleetSpec, ReplicaSpec

__all__ = ["TTFT_WINDOW_S", "VirtualScaler", "autoscaled", "with_autoscale"]

TTFT_WINDOW_S = 60.0  # the window of finished requests the TTFT p99 signal reads


class SimReplica(Protocol):
    """What the scaler needs of the player's simulated replica."""

    state: ReplicaState
    engine: SimEngine
    labels: dict[str, str]

    def restart(self, now: float) -> None: ...


def with_autoscale(spec: FleetSpec, on: bool) -> FleetSpec:
    """``spec`` with its autoscaling turned on or off (a scenario's or a flag's choice), checked
    again as the spec file would be; ``FleetError`` when it has no ``autoscale`` section to turn on
    or the section does not fit the fleet."""
    scale = spec.autoscale
    if scale is None:
        if not on:
            return spec
        raise FleetError("autoscaling asked for, but the fleet spec has no autoscale section (pools and their policy)")
    if scale.enabled == on:
        return spec
    data = spec.model_dump()
    data["autoscale"]["enabled"] = on
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        raise FleetError(f"the fleet spec's autoscale section cannot be turned on: {exc.errors()[0]['msg']}") from None


def autoscaled(spec: FleetSpec, scenario_choice: bool | None, flag: bool | None) -> bool:
    """Whether a run autoscales: the flag, else the scenario's ``autoscale:``, else the spec's."""
    if flag is not None:
        return flag
    if scenario_choice is not None:
        return scenario_choice
    return spec.autoscale is not None and spec.autoscale.enabled


@dataclass
class _Starting:
    replica: Any  # the player's replica, not yet scraped nor routable
    ready_at: float
    event: ScaleEvent  # the scale_out decision it belongs to


@dataclass
class _Pool:
    model: str
    policy: ScalePolicy
    state: PoolState
    prefix: str
    numbers: set[int] = field(default_factory=set)  # every number the pool's replicas have used
    starting: list[_Starting] = field(default_factory=list)
    draining: dict[str, ScaleEvent] = field(default_factory=dict)  # replica -> its scale_in decision
    order: list[str] = field(default_factory=list)  # the pool's replicas, oldest first


class VirtualScaler:
    """One autoscaler over the simulator's replicas (see the module docstring)."""

    def __init__(
        self,
        spec: FleetSpec,
        router: Router,
        replicas: dict[str, Any],
        make: Callable[[ReplicaSpec], SimReplica],
        start: float,
    ) -> None:
        if spec.autoscale is None:
            raise FleetError("the fleet spec has no autoscale section: nothing to scale")
        self.spec, self.scale = spec, spec.autoscale
        self.router, self.replicas, self.make = router, replicas, make
        self.next_eval = start + self.scale.interval_s
        self.events: list[ScaleEvent] = []
        self.pools: dict[str, _Pool] = {}
        self.pool_of: dict[str, str] = {}  # replica -> its pool's model
        self.ports = {r.name: r.port for r in spec.replicas}  # the replicas that exist or start -> their port
        self.waiting_first_token: dict[str, ScaleEvent] = {}  # ready replica -> its decision
        self.seen: set[str] = set()  # pending records already noted (the player hands them out later)
        self.recent: deque[tuple[float, str, float]] = deque()  # (finished at, replica, ttft) of ok requests
        for model, policy in self.scale.pools.items():
            names = [r.name for r in spec.replicas if r.model == model]
            prefix, _ = _split(spec.pool_template(model).name)
            pool = _Pool(model, policy, PoolState(ready=len(names)), prefix, order=list(names))
            pool.numbers.update(n for name in names if (n := _split(name)[1]) is not None)
            self.pools[model] = pool
            self.pool_of.update(dict.fromkeys(names, model))

    # ------------------------------------------------------------------ the player's calls
    def next_at(self) -> float:
        """The next time the scaler acts: an evaluation or a replica's end of cold start."""
        ready = [s.ready_at for p in self.pools.values() for s in p.starting]
        return min([self.next_eval, *ready])

    def observe(self, records: Sequence[dict[str, Any]]) -> None:
        """Request records the player has handed out (the TTFT window and first tokens read them)."""
        for record in records:
            if record.get("request_id") not in self.seen:
                self._note(record)
        self.seen.clear()

    def step(self, now: float, pending: Sequence[dict[str, Any]] = ()) -> None:
        """Everything due at ``now``: replicas whose cold start ended join; at an evaluation, the
        pools' signals are read and decided on, drained replicas with no request left leave.
        ``pending``: records finished but not yet handed out."""
        for pool in self.pools.values():
            for starting in [s for s in pool.starting if s.ready_at <= now]:
                self._join(pool, starting)
        if now < self.next_eval:
            return
        self.next_eval = now + self.scale.interval_s
        for record in pending:
            if record.get("request_id") not in self.seen:
                self.seen.add(record.get("request_id", ""))
                self._note(record)
        self._first_tokens(now)
        while self.recent and self.recent[0][0] < now - TTFT_WINDOW_S:
            self.recent.popleft()
        for pool in self.pools.values():
            self._remove_drained(pool, now)
            decision = decide(pool.model, pool.policy, pool.state, self.signals(pool, now), now)
            if decision is not None:
                self._apply(pool, decision, now)

    def take_events(self) -> list[ScaleEvent]:
        events, self.events = self.events, []
        return events

    # ------------------------------------------------------------------ signals
    def signals(self, pool: _Pool, now: float) -> dict[str, float]:
        """The pool's signals now (no signal when no replica is ready)."""
        ready = [r for r in self.router.replicas if self.pool_of.get(r.name) == pool.model and r.healthy]
        engines = [self.replicas[r.name].engine for r in ready]
        if not engines:
            return {}
        n = len(engines)
        out = {
            "kv_cache_usage": sum(e.kv_usage for e in engines) / n,
            "requests_waiting": sum(len(e.waiting) for e in engines) / n,
            "requests_running": sum(len(e.running) for e in engines) / n,
        }
        slo = self.spec.models[pool.model].slo.get("ttft")
        ttfts = sorted(t for at, name, t in self.recent if self.pool_of.get(name) == pool.model and at <= now)
        if slo and ttfts:
            out["ttft_p99_over_slo"] = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] / slo
        return out

    def _note(self, record: dict[str, Any]) -> None:
        name = record.get("replica")
        if record.get("outcome") != "ok" or name not in self.pool_of:
            return
        first = record["ts"] + record["ttft_seconds"]
        self.recent.append((record["ts"] + record["e2e_seconds"], name, record["ttft_seconds"]))
        event = self.waiting_first_token.get(name)
        if event is not None:
            self._serving(name, event, first)

    def _first_tokens(self, now: float) -> None:
        """``serving`` for a new replica whose first token is out (of a request still running)."""
        for name, event in list(self.waiting_first_token.items()):
            replica = self.replicas.get(name)
            firsts = (
                [r.first_token_at for r in replica.engine.running if r.first_token_at is not None] if replica else []
            )
            if firsts and min(firsts) <= now:
                self._serving(name, event, min(firsts))

    def _serving(self, name: str, event: ScaleEvent, at: float) -> None:
        del self.waiting_first_token[name]
        self.events.append(
            event.step("serving", at, name, f"{name}'s first token, {at - event.ts:.1f}s after the decision")
        )

    # ------------------------------------------------------------------ actions
    def _apply(self, pool: _Pool, decision: Decision, now: float) -> None:
        pool.state.record(decision, now)
        if decision.kind == "scale_out":
            for _ in range(decision.to_replicas - decision.from_replicas):
                self._start(pool, decision, now)
        elif decision.kind == "scale_in":
            for _ in range(decision.from_replicas - decision.to_replicas):
                self._drain(pool, decision, now)
        else:
            self.events.append(from_decision(decision, now, source="sim"))

    def _start(self, pool: _Pool, decision: Decision, now: float) -> None:
        number = max(pool.numbers, default=-1) + 1
        pool.numbers.add(number)
        name = f"{pool.prefix}-{number}"
        port = next((p for p in self.scale.ports() if p not in self.ports.values()), None)
        if port is None:
            raise FleetError(f"autoscale: no free port in {self.scale.ports()} for {name}")
        self.ports[name] = port
        template = self.spec.pool_template(pool.model)
        replica = self.make(template.model_copy(update={"name": name, "port": port}))
        event = from_decision(decision, now, replica=name, source="sim")
        self.events.append(event)
        pool.starting.append(_Starting(replica, now + pool.policy.cold_start_s, event))
        pool.state.starting += 1
        self.pool_of[name] = pool.model

    def _join(self, pool: _Pool, starting: _Starting) -> None:
        """The end of a replica's cold start: its engine starts, the router and the scrapes see it."""
        pool.starting.remove(starting)
        replica, at = starting.replica, starting.ready_at
        replica.restart(at)
        replica.state.healthy = True
        self.replicas[replica.state.name] = replica
        self.router.replicas.append(replica.state)
        pool.order.append(replica.state.name)
        pool.state.became_ready(at)
        self.waiting_first_token[replica.state.name] = starting.event
        self.events.append(
            starting.event.step("ready", at, detail=f"healthy after a {at - starting.event.ts:.0f}s cold start")
        )

    def _drain(self, pool: _Pool, decision: Decision, now: float) -> None:
        """The pool's newest ready replica stops taking requests; it leaves when they are done."""
        ready = {r.name for r in self.router.replicas if self.pool_of.get(r.name) == pool.model}
        name = next(n for n in reversed(pool.order) if n in ready)
        state = self.replicas[name].state
        self.router.replicas.remove(state)
        event = from_decision(decision, now, replica=name, source="sim")
        self.events += [event, event.step("draining", now, detail=f"{state.in_flight} request(s) in flight")]
        pool.draining[name] = event
        pool.state.ready -= 1
        pool.state.draining += 1

    def _remove_drained(self, pool: _Pool, now: float) -> None:
        for name, event in list(pool.draining.items()):
            replica = self.replicas[name]
            if replica.engine.has_work():
                continue
            del pool.draining[name], self.replicas[name], self.ports[name]
            self.waiting_first_token.pop(name, None)
            pool.order.remove(name)
            pool.state.draining -= 1
            self.events.append(event.step("removed", now, detail=f"drained in {now - event.ts:.0f}s"))


def _split(name: str) -> tuple[str, int | None]:
    """``large-0`` -> (``large``, 0); a name without a number -> (name, None)."""
    match = re.fullmatch(r"(.*?)-?(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else (name, None)
