"""The autoscaler's hands: a decision -> replicas started or stopped, in an order nothing notices.

In:  the fleet spec, a ``Launcher`` (starts and stops processes), the gateway's admin API
     (``fleet.gateway.admin``), the collector's ``file_sd`` targets file and an ``EventShipper``.
Out: ``scale_out`` / ``scale_in`` (run as tasks: the loop never waits for them) and the scale
     events of each step; ``members`` (the pools' replicas as the gateway has them, with the
     state of those the autoscaler is starting or draining) for the next decision.

Scale-out: start the replica (the pool's first spec replica copied: the next name and a port from
``autoscale.first_port``) -> poll its ``/health`` (``start_failed`` when it exits or misses
``health_timeout_s``) -> add it to the gateway (in once the gateway's own probe passes) -> add it
to the targets file (scraped only once healthy: no failed scrape while it loads) -> ``ready`` ->
poll the gateway until the replica streamed its first token -> ``serving``.
Scale-in (only replicas the autoscaler added; the spec's stay): ``draining`` -> the gateway sends
it nothing new -> wait until its in-flight requests are done (``drain_timeout_s``) -> out of the
targets file -> wait one ``file_sd`` poll and one scrape (``file_sd_wait_s``: its last scrape is a
good one, not a failed one) -> removed from the gateway -> stopped -> ``removed``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from fleet.autoscale.events import ScaleEvent
from fleet.autoscale.shipper import EventShipper
from fleet.errors import LaunchError
from fleet.launcher import Launcher
from fleet.spec import FleetSpec, ReplicaSpec

__all__ = ["TARGETS_FILE", "Actuator", "Member", "clock_time", "write_targets"]

log = logging.getLogger("fleetscope.autoscale")
TARGETS_FILE = "targets.json"  # in the launcher's state directory; the collector's file_sd reads it


def clock_time(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


@dataclass
class Member:
    name: str
    model: str
    url: str
    added: bool  # started by the autoscaler (only those are scaled in)
    status: Literal["starting", "ready", "draining"]
    started_at: float = 0.0
    gpu_type: str = ""
    gpu_count: int = 1


def write_targets(path: Path, host: str, members: list[Member]) -> None:
    """The ``file_sd`` file: one group per replica, labelled as the collector labels the spec's."""
    groups = [
        {
            "targets": [f"{host}:{m.url.rsplit(':', 1)[1]}"],
            "labels": {"replica": m.name, "model": m.model, "gpu_type": m.gpu_type, "gpu_count": str(m.gpu_count)},
        }
        for m in members
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=2))
    tmp.replace(path)


class Actuator:
    def __init__(
        self,
        spec: FleetSpec,
        launcher: Launcher,
        shipper: EventShipper,
        say: Callable[[str], None],
        *,
        cpu_nice: int = 0,
        file_sd_wait_s: float = 12.0,
        poll_s: float = 0.5,
    ) -> None:
        gateway = spec.gateway_url()
        if gateway is None:
            raise LaunchError("the autoscaler needs the fleet's gateway (gateway.enabled): it adds replicas to it")
        self.spec, self.launcher, self.shipper, self.say = spec, launcher, shipper, say
        self.admin = f"{gateway}/admin/replicas"
        self.targets_path = launcher.state_dir / TARGETS_FILE
        self.cpu_nice, self.file_sd_wait_s, self.poll_s = cpu_nice, file_sd_wait_s, poll_s
        self.members: dict[str, Member] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ what there is
    async def sync(self, client: httpx.AsyncClient) -> None:
        """The members from the gateway (at start: the spec's replicas, healthy or not)."""
        response = await client.get(self.admin, timeout=5)
        response.raise_for_status()
        spec_names = {r.name for r in self.spec.replicas}
        for r in response.json()["replicas"]:
            if r["name"] not in self.members:
                template = self.spec.pool_template(r["model"]) if r["model"] in self.spec.served() else None
                self.members[r["name"]] = Member(
                    r["name"], r["model"], r["url"], r["name"] not in spec_names,
                    "draining" if r["draining"] else "ready", time.time(),
                    template.gpu_type if template else "", template.gpu_count if template else 1,
                )  # fmt: skip
        self.write_targets()

    def count(self, model: str) -> tuple[int, int, int]:
        """(ready, starting, draining) replicas of a pool."""
        pool = [m for m in self.members.values() if m.model == model]
        return tuple(sum(1 for m in pool if m.status == s) for s in ("ready", "starting", "draining"))  # type: ignore[return-value]

    def ready_urls(self, model: str) -> dict[str, str]:
        return {m.name: m.url for m in self.members.values() if m.model == model and m.status == "ready"}

    def write_targets(self) -> None:
        added = [m for m in self.members.values() if m.added and m.status == "ready"]
        write_targets(self.targets_path, self.spec.host, added)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------------ out
    def new_replica(self, model: str) -> ReplicaSpec:
        """The pool's first spec replica copied: the next free ``<stem>-<n>`` and port."""
        scale = self.spec.autoscale
        assert scale is not None
        template = self.spec.pool_template(model)
        stem = template.name.rsplit("-", 1)[0] if "-" in template.name else template.name
        taken = {r.name for r in self.spec.replicas} | set(self.members) | set(self.launcher.records())
        n = next(i for i in range(1, 10_000) if f"{stem}-{i}" not in taken)
        used = {int(m.url.rsplit(":", 1)[1]) for m in self.members.values()}
        port = next((p for p in scale.ports() if p not in used), None)
        if port is None:
            raise LaunchError(f"no free port left in autoscale's range {scale.ports().start}-{scale.ports().stop - 1}")
        return template.model_copy(update={"name": f"{stem}-{n}", "port": port})

    def scale_out(self, client: httpx.AsyncClient, decision: ScaleEvent, replica: ReplicaSpec) -> None:
        url = self.spec.url(replica)
        self.members[replica.name] = Member(
            replica.name, replica.model, url, True, "starting", time.time(), replica.gpu_type, replica.gpu_count
        )
        self._spawn(self._out(client, decision, replica))

    async def _out(self, client: httpx.AsyncClient, decision: ScaleEvent, replica: ReplicaSpec) -> None:
        name, url = replica.name, self.spec.url(replica)
        policy = self.spec.autoscale.pools[replica.model]  # type: ignore[union-attr]
        try:
            await asyncio.to_thread(
                self.launcher.start_replica, replica, cold_start_s=policy.cold_start_s, cpu_nice=self.cpu_nice
            )
            await self._healthy(client, name, url)
            response = await client.post(
                self.admin, json={"name": name, "model": replica.model, "url": url, "adapters": replica.adapters}
            )
            if response.status_code != 201:
                raise LaunchError(f"the gateway refused {name}: {response.text}")
            state = await self._until(client, name, lambda r: bool(r["healthy"]), self.spec.health_timeout_s)
        except (LaunchError, httpx.HTTPError, TimeoutError) as exc:
            self.shipper.add(decision.step("start_failed", time.time(), name, str(exc)[:2000]))
            self.say(f"{decision.pool}: {name} failed to start: {exc}")
            self.members.pop(name, None)
            await asyncio.to_thread(self.launcher.stop, [name])
            return
        # when the gateway took it in, not when this poll saw it: a request may reach it in between, and
        # its first token must not come before it was ready
        ready = float(state.get("healthy_since") or time.time())
        self.members[name].status = "ready"
        self.write_targets()
        self.shipper.add(decision.step("ready", ready, name, f"healthy and in the gateway's pool at {url}"))
        first = await self._first_token(client, name)
        if first is None:
            return
        self.shipper.add(decision.step("serving", first, name, "first token streamed through the gateway"))
        self.say(
            f"{decision.pool} {decision.from_replicas} -> {decision.to_replicas}: decided {clock_time(decision.ts)} "
            f"({decision.signal} {decision.value:.3g} > {decision.threshold:g}), healthy +{ready - decision.ts:.0f} s, "
            f"first token +{first - decision.ts:.0f} s ({name})"
        )

    async def _healthy(self, client: httpx.AsyncClient, name: str, url: str) -> None:
        deadline = time.monotonic() + self.spec.health_timeout_s
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"{url}/health", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            why = await asyncio.to_thread(self.launcher.exited, name)
            if why is not None:
                raise LaunchError(why)
            await asyncio.sleep(self.poll_s)
        raise LaunchError(f"replica {name} not healthy after {self.spec.health_timeout_s:.0f}s (health_timeout_s)")

    async def _state(self, client: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
        response = await client.get(self.admin, timeout=5)
        response.raise_for_status()
        return next((r for r in response.json()["replicas"] if r["name"] == name), None)

    async def _until(
        self, client: httpx.AsyncClient, name: str, test: Callable[[dict[str, Any]], bool], timeout_s: float
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            state = await self._state(client, name)
            if state is None:
                raise LaunchError(f"replica {name} is not in the gateway")
            if test(state):
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica {name}: still {state} after {timeout_s:g}s")
            await asyncio.sleep(self.poll_s)

    async def _first_token(self, client: httpx.AsyncClient, name: str) -> float | None:
        """When the replica's first token passed the gateway (None: it left before one did)."""
        while (member := self.members.get(name)) is not None and member.status == "ready":
            try:
                state = await self._state(client, name)
            except httpx.HTTPError:
                state = {}
            if state is None:
                return None
            if state and state.get("first_token_at"):
                return float(state["first_token_at"])
            await asyncio.sleep(self.poll_s)
        return None

    # ------------------------------------------------------------------ in
    def victim(self, model: str) -> Member | None:
        """The replica a scale-in takes: the newest ready one the autoscaler added."""
        added = [m for m in self.members.values() if m.model == model and m.added and m.status == "ready"]
        return max(added, key=lambda m: m.started_at, default=None)

    def scale_in(self, client: httpx.AsyncClient, decision: ScaleEvent, member: Member) -> None:
        member.status = "draining"
        self._spawn(self._in(client, decision, member))

    async def _in(self, client: httpx.AsyncClient, decision: ScaleEvent, member: Member) -> None:
        name = member.name
        policy = self.spec.autoscale.pools[member.model]  # type: ignore[union-attr]
        self.shipper.add(decision.step("draining", time.time(), name, "the gateway sends it no new request"))
        detail = "drained"
        try:
            (await client.post(f"{self.admin}/{name}/drain", timeout=5)).raise_for_status()
            try:
                await self._until(client, name, lambda r: r["in_flight"] == 0, policy.drain_timeout_s)
            except TimeoutError:
                detail = f"drain_timeout_s {policy.drain_timeout_s:g} ran out with requests in flight"
            drained = time.time()
            self.write_targets()  # ready ones only: out of the collector's targets now
            await asyncio.sleep(self.file_sd_wait_s)  # the collector lets go of it, its last scrape a good one
            for _ in range(20):
                response = await client.delete(f"{self.admin}/{name}", timeout=5)
                if response.status_code != 409:
                    break
                await asyncio.sleep(self.poll_s)
        except httpx.HTTPError as exc:
            detail, drained = f"the gateway did not answer ({exc}): stopped anyway", time.time()
        await asyncio.to_thread(self.launcher.stop, [name])
        self.members.pop(name, None)
        removed = time.time()
        self.shipper.add(decision.step("removed", removed, name, detail))
        self.say(
            f"{decision.pool} {decision.from_replicas} -> {decision.to_replicas}: decided {clock_time(decision.ts)} "
            f"({decision.signal} {decision.value:.3g} < {decision.threshold:g}), {name} drained "
            f"+{drained - decision.ts:.0f} s, removed +{removed - decision.ts:.0f} s ({detail})"
        )
