"""The autoscaler inside a replay: a variant's autoscaled pools resized tick by tick by the same
decisions the bundled fleet's autoscaler takes (``fleet.autoscale.policy.decide``).

In:  the replay's replicas (their ``SimEngine`` and gateway ``ReplicaState``), its ``Router``, a
     factory for a new replica of a pool, the finished requests' TTFTs, and the virtual clock
     (``tick`` once per replay tick).
Out: the pools resized as they go: every ``Variant.scale_interval_s`` each autoscaled pool's
     signals are read over its ready replicas, as the live autoscaler reads them (mean KV-cache
     usage, requests waiting and running per replica, the p99 TTFT of the pool's requests that
     finished in the last ``TTFT_WINDOW_S`` over its SLO target: ``ttft_p99_over_slo``, left out
     without a target), and ``decide``'s answer applied: a scale-out starts a replica that joins
     the router ``Pool.cold_start()`` seconds later (the recorded median, or the policy's), a
     scale-in drains the newest ready replica (no new requests; it leaves once its last request
     finished, or at the policy's ``drain_timeout_s``). ``up()``: each replica's up-interval
     ``[replica, model, start, end]`` (from ready to removed: what the store bills, since a
     starting replica is not scraped); ``events()``: ``[t, pool, kind, replica, from_replicas,
     to_replicas, signal, value, threshold]`` per decision and replica step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from fleet.autoscale.policy import Decision, PoolState, ScalePolicy, decide
from fleet.gateway.routing import ReplicaState, Router
from fleet.sim.engine import SimEngine
from planner.fleet import Pool, Variant

__all__ = ["EVENT_COLUMNS", "TTFT_WINDOW_S", "UP_COLUMNS", "Scaling"]

TTFT_WINDOW_S = 60.0  # the TTFT signal: the p99 of the pool's requests that finished in the last minute
UP_COLUMNS = ["replica", "model", "start", "end"]
EVENT_COLUMNS = ["t", "pool", "kind", "replica", "from_replicas", "to_replicas", "signal", "value", "threshold"]


class Replica(Protocol):
    state: ReplicaState
    engine: SimEngine


@dataclass
class _Member:
    name: str
    joins_at: float  # when its cold start ends
    up_from: float | None = None  # when it joined the router (billed from then)
    drain_from: float | None = None
    up_to: float | None = None  # when it left


@dataclass
class _Pool:
    pool: Pool
    policy: ScalePolicy
    state: PoolState
    members: list[_Member] = field(default_factory=list)
    ttfts: deque[tuple[float, float]] = field(default_factory=deque)  # (finished at, ttft)
    added: int = 0

    def ready(self) -> list[_Member]:
        return [m for m in self.members if m.up_from is not None and m.drain_from is None and m.up_to is None]


class Scaling:
    """The autoscaled pools of one replay (see the module docstring)."""

    def __init__(
        self,
        variant: Variant,
        replicas: Mapping[str, Replica],
        router: Router,
        spawn: Callable[[str, Pool], Replica],
    ) -> None:
        self.replicas, self.router, self.spawn = replicas, router, spawn
        self.interval = variant.scale_interval_s
        self.slo = dict(variant.ttft_slo)
        self.pools: dict[str, _Pool] = {}
        for model, pool in variant.pools.items():
            if pool.autoscale is None:
                continue
            run = _Pool(pool, pool.autoscale, PoolState(ready=pool.replicas))
            run.members = [_Member(name, 0.0, 0.0) for name in pool.replica_names()]
            self.pools[model] = run
        self.next_eval = 0.0
        self.rows: list[tuple[float, str, str, str, int, int, str, float, float]] = []

    def __bool__(self) -> bool:
        return bool(self.pools)

    def finished(self, model: str, at: float, ttft: float) -> None:
        """A request of ``model`` finished at ``at`` with its TTFT (for the ``ttft_p99_over_slo`` signal)."""
        run = self.pools.get(model)
        if run is not None:
            run.ttfts.append((at, ttft))

    def tick(self, now: float) -> None:
        """Cold starts that ended join, drained replicas leave, and every ``interval`` the pools are decided on."""
        for model, run in self.pools.items():
            self._steps(model, run, now)
        if now + 1e-9 < self.next_eval:
            return
        self.next_eval = now + self.interval
        for model, run in self.pools.items():
            signals = self.signals(run, now)
            if not signals:
                continue
            decision = decide(model, run.policy, run.state, signals, now)
            if decision is not None:
                run.state.record(decision, now)
                self._apply(model, run, decision, now)

    def signals(self, run: _Pool, now: float) -> dict[str, float]:
        """The pool's signals over its ready replicas (none when it has no ready replica)."""
        engines = [self.replicas[m.name].engine for m in run.ready()]
        if not engines:
            return {}
        out = {
            "kv_cache_usage": float(np.mean([e.kv_usage for e in engines])),
            "requests_waiting": float(np.mean([len(e.waiting) for e in engines])),
            "requests_running": float(np.mean([len(e.running) for e in engines])),
        }
        while run.ttfts and run.ttfts[0][0] < now - TTFT_WINDOW_S:
            run.ttfts.popleft()
        target = self.slo.get(run.pool.model)
        if target and run.ttfts:
            out["ttft_p99_over_slo"] = float(np.quantile([t for _at, t in run.ttfts], 0.99)) / target
        return out

    def _steps(self, model: str, run: _Pool, now: float) -> None:
        for m in run.members:
            if m.up_from is None and m.joins_at <= now:  # its cold start is over: healthy, in the router
                m.up_from = now
                replica = self.replicas[m.name]
                replica.state.healthy = True
                self.router.add(replica.state)
                run.state.became_ready(now)
                self._row(now, model, "ready", m.name, run)
            elif m.drain_from is not None and m.up_to is None:
                engine = self.replicas[m.name].engine
                if not engine.has_work() or now - m.drain_from >= run.policy.drain_timeout_s:
                    m.up_to = now
                    replica = self.replicas[m.name]
                    replica.state.healthy = False  # no longer sampled; a request past the drain timeout still ends
                    self.router.remove(m.name)
                    run.state.draining -= 1
                    self._row(now, model, "removed", m.name, run)

    def _apply(self, model: str, run: _Pool, decision: Decision, now: float) -> None:
        self._row(now, model, decision.kind, "", run, decision)
        if decision.kind == "scale_out":
            for _ in range(decision.to_replicas - decision.from_replicas):
                run.added += 1
                name = f"{model}-scaled-{run.added}"
                self.spawn(name, run.pool).state.healthy = False  # the factory adds it to the replay's replicas
                run.members.append(_Member(name, now + run.pool.cold_start()))
                run.state.starting += 1
        elif decision.kind == "scale_in":
            for m in run.ready()[::-1][: decision.from_replicas - decision.to_replicas]:  # the newest first
                m.drain_from = now
                self.replicas[m.name].state.draining = True
                run.state.ready -= 1
                run.state.draining += 1
                self._row(now, model, "draining", m.name, run)
        self._steps(model, run, now)  # a cold start of 0 s joins at once

    def _row(self, now: float, model: str, kind: str, replica: str, run: _Pool, d: Decision | None = None) -> None:
        if d is not None:
            self.rows.append(
                (now, model, kind, replica, d.from_replicas, d.to_replicas, d.signal, d.value, d.threshold)
            )
        else:
            size = run.state.size
            self.rows.append((now, model, kind, replica, size, size, "", np.nan, np.nan))

    def up(self, seconds: float) -> list[tuple[str, str, float, float]]:
        """Each autoscaled replica's up-interval ``UP_COLUMNS`` (open ones end at ``seconds``)."""
        return [
            (m.name, model, m.up_from, seconds if m.up_to is None else m.up_to)
            for model, run in self.pools.items()
            for m in run.members
            if m.up_from is not None
        ]

    def events(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=EVENT_COLUMNS)
