"""The live autoscaler's loop: every ``autoscale.interval_s``, each pool's signals -> a decision -> acted on.

In:  a fleet spec with an enabled ``autoscale`` section, its launcher's state directory, the
     running fleet (its gateway's admin API, its replicas' ``/metrics``).
Out: per evaluation and pool, ``policy.decide`` on the signals (``fleet.autoscale.signals``);
     a decision becomes a scale event (posted by the ``EventShipper``), a printed line, and the
     actuator's task (``fleet.autoscale.actuator``). The loop waits for neither the collector nor
     a cold start. A pool never goes below the replicas the spec starts (those are the fleet's;
     the autoscaler scales in only what it added): its ``min_replicas`` is raised to that count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from fleet.autoscale.actuator import Actuator, clock_time
from fleet.autoscale.events import from_decision
from fleet.autoscale.policy import Decision, PoolState, ScalePolicy, decide
from fleet.autoscale.shipper import EventShipper
from fleet.autoscale.signals import PoolReader
from fleet.errors import LaunchError
from fleet.launcher import Launcher
from fleet.spec import FleetSpec

__all__ = ["Autoscaler", "run"]

log = logging.getLogger("fleetscope.autoscale")


class Autoscaler:
    def __init__(self, spec: FleetSpec, actuator: Actuator, shipper: EventShipper, say: Callable[[str], None]) -> None:
        scale = spec.autoscale
        if scale is None or not scale.enabled:
            raise LaunchError("the fleet spec has no enabled autoscale section: nothing to scale")
        self.spec, self.actuator, self.shipper, self.say = spec, actuator, shipper, say
        self.policies: dict[str, ScalePolicy] = {}
        for model, policy in scale.pools.items():
            floor = sum(1 for r in spec.replicas if r.model == model)
            self.policies[model] = policy.model_copy(update={"min_replicas": max(policy.min_replicas, floor)})
        self.states = {model: PoolState(ready=0) for model in self.policies}
        self.readers = {model: PoolReader(spec.models[model].slo.get("ttft")) for model in self.policies}
        self.last_signals: dict[str, dict[str, float]] = {}

    async def step(self, client: httpx.AsyncClient, now: float | None = None) -> None:
        """One evaluation of every pool."""
        for model, policy in self.policies.items():
            now = time.time() if now is None else now
            state = self.states[model]
            state.count(*self.actuator.count(model), now)
            reader = self.readers[model]
            signals = await reader.read(client, self.actuator.ready_urls(model))
            for error in reader.errors:
                log.warning("%s: %s", model, error)
            self.last_signals[model] = signals
            if not signals and state.size >= policy.min_replicas:
                continue  # nothing read: hold
            decision = decide(model, policy, state, signals, now)
            if decision is None:
                continue
            self.apply(client, model, decision, now)

    def apply(self, client: httpx.AsyncClient, model: str, decision: Decision, now: float) -> None:
        state = self.states[model]
        replica_name, replica, victim = "", None, None
        if decision.kind == "scale_out":
            try:
                replica = self.actuator.new_replica(model)
            except LaunchError as exc:
                self.say(f"{model}: cannot scale out: {exc}")
                return
            replica_name = replica.name
        elif decision.kind == "scale_in":
            victim = self.actuator.victim(model)
            if victim is None:
                return  # only the spec's replicas are left: they stay
            replica_name = victim.name
        event = from_decision(decision, now, replica=replica_name)
        state.record(decision, now)
        self.shipper.add(event)
        action = {"scale_out": f"starting {replica_name}", "scale_in": f"draining {replica_name}"}
        self.say(
            f"{model} {decision.from_replicas} -> {decision.to_replicas}: {decision.kind} decided {clock_time(now)} "
            f"({decision.reason})" + (f": {action[decision.kind]}" if decision.kind in action else "")
        )
        if replica is not None:
            self.actuator.scale_out(client, event, replica)
        elif victim is not None:
            self.actuator.scale_in(client, event, victim)


async def run(
    spec: FleetSpec,
    spec_path: Path,
    state_dir: Path,
    *,
    stop: asyncio.Event,
    say: Callable[[str], None] = print,
    cpu_nice: int = 0,
    file_sd_wait_s: float = 12.0,
) -> None:
    """The loop until ``stop`` is set; then the events left are sent (tasks under way are cancelled:
    the launcher's ``stop`` takes down what they started)."""
    scale = spec.autoscale
    if scale is None or not scale.enabled:
        raise LaunchError(f"{spec_path}: no enabled autoscale section: nothing to scale")
    launcher = Launcher(spec, state_dir, spec_path=spec_path)
    shipper = EventShipper(scale.events_url)
    async with httpx.AsyncClient() as client:
        actuator = Actuator(spec, launcher, shipper, say, cpu_nice=cpu_nice, file_sd_wait_s=file_sd_wait_s)
        await actuator.sync(client)
        scaler = Autoscaler(spec, actuator, shipper, say)
        say(
            f"autoscaler: {', '.join(f'{m} {p.min_replicas}..{p.max_replicas}' for m, p in scaler.policies.items())}, "
            f"every {scale.interval_s:g}s; events to {scale.events_url}"
        )
        shipping = asyncio.create_task(shipper.run(client))
        try:
            while not stop.is_set():
                try:
                    await scaler.step(client)
                except httpx.HTTPError as exc:
                    log.warning("evaluation skipped: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=scale.interval_s)
        finally:
            for task in [shipping, *actuator.tasks]:
                task.cancel()
            await asyncio.gather(shipping, *actuator.tasks, return_exceptions=True)
            await shipper.flush(client)
