"""Engine launcher: ``FleetSpec`` -> one real vLLM OpenAI server per replica, as child processes.

In:  a validated ``FleetSpec`` and a state directory (``data/fleet``).
Out: running replicas, each in its own process group, logging to ``<state>/<replica>.log``,
     recorded in ``<state>/state.json`` so that ``status``/``down`` work from another shell;
     ``ReplicaStatus`` rows for ``fleetscope fleet status``.

Each engine's command line and environment come from ``fleet.engine_command``; the processes
are started, watched and signalled through ``fleet.processes``. Simulated replicas (``engine:
sim``) share one ``python -m fleet.sim`` process; the spec's gateway (fleetscope's own, or a
third-party one planned by ``fleet.gateways``) starts once every replica is healthy.
Replicas that are not in the spec (``start_replica``: the autoscaler's) are recorded beside the
others and shown by ``status``; the autoscaler itself runs as a recorded process too
(``start_autoscaler``), and ``stop`` stops it first, so that it starts nothing while the fleet
goes down. The state file is read-modified-written under a file lock (``state.lock``): the
launcher of ``fleetscope up`` and the autoscaler's write it at the same time.
Stopping sends SIGTERM to the whole process group (API server, engine core, workers), waits,
then SIGKILLs what is left: no orphans. A replica that dies is reported, never restarted
behind the user's back. Errors are ``fleet.errors.LaunchError`` (a ``FleetError``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleet.engine_command import EngineBuild, check_adapters, detect_engine, engine_command, feature_flags
from fleet.errors import LaunchError
from fleet.processes import (
    group_members,
    healthy,
    log_tail,
    lower_priority,
    lower_session_priority,
    signal_group,
    spawn,
)
from fleet.spec import FleetSpec, ReplicaSpec, check_gateway_port, check_ready, port_free

__all__ = ["Launcher", "ReplicaRecord", "ReplicaStatus"]

STATE_FILE = "state.json"
AUTOSCALER = "autoscaler"  # the record of the autoscaler's process
_NOT_REPLICAS = ("gateway", AUTOSCALER)


@dataclass
class ReplicaRecord:
    """What the state file remembers about a started replica."""

    name: str
    model: str
    port: int
    pid: int
    started_at: float
    log: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_url: str = ""  # where it answers when healthy ('': <its port>/health)
    flush_s: float = 0.0  # a third-party gateway: how long its last telemetry takes to leave it


@dataclass(frozen=True)
class ReplicaStatus:
    name: str
    model: str
    port: int
    pid: int | None
    health: str  # healthy | starting | unhealthy | dead | stopped
    uptime_s: float | None
    log: str | None


class Launcher:
    """Start, watch and stop the replicas of one fleet."""

    def __init__(
        self, spec: FleetSpec, state_dir: Path, engine: EngineBuild | None = None, spec_path: Path | None = None
    ) -> None:
        self.spec = spec
        self.spec_path = spec_path  # needed to start the gateway process
        self.state_dir = state_dir
        self._engine = engine
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ----------------------------------------------------------------- state file
    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    def records(self) -> dict[str, ReplicaRecord]:
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        return {name: ReplicaRecord(**rec) for name, rec in data.get("replicas", {}).items()}

    def _save(self, records: dict[str, ReplicaRecord]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"replicas": {n: asdict(r) for n, r in records.items()}}, indent=2))
        tmp.replace(self.state_path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, ReplicaRecord]]:
        """The records, saved on the way out, with the state file locked against other processes."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "state.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                records = self.records()
                yield records
                self._save(records)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _record(self, *records: ReplicaRecord) -> None:
        with self._locked() as saved:
            saved.update({r.name: r for r in records})

    # ----------------------------------------------------------------- commands
    @property
    def engine(self) -> EngineBuild:
        if self._engine is None:
            self._engine = detect_engine()
        return self._engine

    def command(self, replica: ReplicaSpec) -> tuple[list[str], dict[str, str]]:
        """The vLLM server command line and the environment it adds, for one replica."""
        return engine_command(self.spec, replica, self.engine.device)

    def feature_flags(self, replica: ReplicaSpec) -> list[str]:
        """Speculative decoding and the LoRA adapters a replica serves (``engine_command.feature_flags``)."""
        return feature_flags(self.spec, replica)

    def _select(self, names: Iterable[str] | None) -> list[ReplicaSpec]:
        if names is None:
            return list(self.spec.replicas)
        return [self.spec.replica(n) for n in names]

    def start(
        self,
        names: Iterable[str] | None = None,
        *,
        attach: bool = True,
        progress: Callable[[str], None] = lambda _m: None,
        make_models: Callable[[FleetSpec, list[ReplicaSpec]], None] | None = None,
        cpu_nice: int = 0,
    ) -> list[ReplicaRecord]:
        """Start replicas and wait until every one answers ``/health``.

        ``attach``: replicas get SIGTERM if this process dies (foreground use). ``cpu_nice``: CPU
        engines run at that lower priority (``fleetscope up`` shares the cores with them). On a replica
        that exits or misses the health timeout, its log tail is shown and all replicas
        started by this call are stopped.
        """
        with_gateway = (
            names is None and self.spec.gateway is not None and self.spec.gateway.enabled and self.spec_path is not None
        )
        replicas = self._select(names)
        sims = [r for r in replicas if r.engine == "sim"]
        self._check_startable(replicas, sims, with_gateway)
        if make_models is not None:
            make_models(self.spec, [r for r in replicas if r.engine == "vllm"])
        check_adapters(self.spec, [r for r in replicas if r.engine == "vllm"])
        self.state_dir.mkdir(parents=True, exist_ok=True)
        started: list[ReplicaRecord] = []
        if sims:
            started.extend(self._start_sims(sims, attach, progress))
        for replica in replicas:
            if replica.engine == "sim":
                continue
            started.append(self._start_engine(replica, attach, cpu_nice, progress))
        self._record(*started)
        try:
            self._wait_healthy(started, progress)
            if with_gateway:
                gateway = self._start_gateway(attach, progress)
                started.append(gateway)
                # fleetscope's gateway shares the cores with the engines on their terms; a third-party one
                # keeps its own: LiteLLM's Python proxy at the engines' priority added seconds to every
                # request's first token on 2 cores (p50 3.2 s beside the engines' 0.05 s)
                if cpu_nice > 0 and self.engine.device == "cpu" and gateway.model == "-":
                    lower_priority(gateway.pid, cpu_nice)
        except BaseException:
            # a gateway that missed its health check is not in `started` yet: stopped all the same
            stopping = [r.name for r in started]
            if with_gateway and "gateway" not in stopping:
                stopping.append("gateway")
            self.stop(stopping, progress=progress)
            raise
        return started

    def _check_startable(self, replicas: list[ReplicaSpec], sims: list[ReplicaSpec], with_gateway: bool) -> None:
        """Refuse, before anything starts: sims without the spec file, no vLLM for real engines,
        replicas already running, a model directory or port not ready, a gateway that cannot
        serve the spec."""
        if sims and self.spec_path is None:
            raise LaunchError("simulated replicas need the spec file (Launcher(spec_path=...))")
        if any(r.engine == "vllm" for r in replicas):
            self.engine  # noqa: B018 - fail early if vLLM is missing
        running = {n for n, s in self.live().items() if s}
        already = [r.name for r in replicas if r.name in running]
        if already:
            raise LaunchError(f"replicas already running: {', '.join(already)} (`fleetscope fleet down` stops them)")
        from common.yamlfile import YamlConfigError

        try:
            check_ready(self.spec, [r for r in replicas if r.engine == "vllm"])
            for r in sims:  # simulated replicas need no model directory, only a free port
                if not port_free(self.spec.host, r.port):
                    raise YamlConfigError(f"replica {r.name!r}: port {r.port} on {self.spec.host} is already in use")
            if with_gateway:
                check_gateway_port(self.spec)
        except YamlConfigError as exc:
            raise LaunchError(str(exc)) from None
        if with_gateway and self.spec.gateway is not None and self.spec.gateway.kind != "fleetscope":
            from fleet.gateways import GatewayError, gateway_plan

            try:  # a gateway that cannot serve this spec says so before any engine starts
                gateway_plan(self.spec, self.state_dir)
            except GatewayError as exc:
                raise LaunchError(f"gateway {self.spec.gateway.kind}: {exc}") from None

    def _start_engine(
        self, replica: ReplicaSpec, attach: bool, cpu_nice: int, progress: Callable[[str], None]
    ) -> ReplicaRecord:
        """One vLLM server for ``replica``, in a session of its own (niced on CPU builds)."""
        cmd, extra_env = self.command(replica)
        log_path = self.state_dir / f"{replica.name}.log"
        nice = cpu_nice if self.engine.device == "cpu" else 0
        proc = spawn(cmd, log_path, replica.name, attach, nice=nice, env=extra_env)
        self._children[replica.name] = proc
        if cpu_nice > 0 and self.engine.device == "cpu" and not lower_session_priority(proc.pid, cpu_nice):
            progress(f"{replica.name}: its session's CPU priority could not be lowered (no autogroups here)")
        progress(f"started {replica.name} ({replica.model}) pid {proc.pid} on port {replica.port}")
        return ReplicaRecord(
            replica.name, replica.model, replica.port, proc.pid, time.time(), str(log_path), cmd, extra_env
        )

    def _start_sims(
        self, sims: list[ReplicaSpec], attach: bool, progress: Callable[[str], None]
    ) -> list[ReplicaRecord]:
        """One process hosts every simulated replica (``python -m fleet.sim --spec``)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "fleet.sim", "--spec", str(self.spec_path)]
        log_path = self.state_dir / "sim.log"
        proc = spawn(cmd, log_path, f"{len(sims)} simulated replica(s)", attach)
        for r in sims:
            self._children[r.name] = proc
        progress(f"started {len(sims)} simulated replica(s) pid {proc.pid}")
        return [ReplicaRecord(r.name, r.model, r.port, proc.pid, time.time(), str(log_path), cmd, {}) for r in sims]

    def _start_gateway(self, attach: bool, progress: Callable[[str], None]) -> ReplicaRecord:
        """The spec's gateway: fleetscope's own, or LiteLLM, vllm-router or Envoy in its place
        (``fleet.gateways``); its record's model is ``-`` for fleetscope's, else its kind."""
        from fleet.gateways import GatewayError, GatewayPlan, gateway_plan

        gw = self.spec.gateway
        assert gw is not None and self.spec_path is not None
        if gw.kind == "fleetscope":
            cmd = [sys.executable, "-m", "fleet.gateway", "--spec", str(self.spec_path)]
            plan = GatewayPlan("-", cmd, {}, health_url="", metrics_url=None)
            what, started = "gateway", f"started gateway pid {{pid}} on port {gw.port} ({gw.policy})"
        else:
            try:
                plan = gateway_plan(self.spec, self.state_dir)
            except GatewayError as exc:
                raise LaunchError(f"gateway {gw.kind}: {exc}") from None
            what, started = f"gateway ({plan.kind})", f"started gateway {plan.kind} pid {{pid}} on port {gw.port}"
        log_path = self.state_dir / "gateway.log"
        proc = spawn(plan.cmd, log_path, what, attach, env=plan.env)
        self._children["gateway"] = proc
        record = ReplicaRecord(
            "gateway",
            plan.kind,
            gw.port,
            proc.pid,
            time.time(),
            str(log_path),
            plan.cmd,
            plan.env,
            health_url=plan.health_url,
            flush_s=plan.flush_s,
        )
        self._record(record)
        progress(started.format(pid=proc.pid))
        self._wait_healthy([record], progress)
        return record

    def start_replica(
        self,
        replica: ReplicaSpec,
        *,
        cold_start_s: float = 0.0,
        cpu_nice: int = 0,
        progress: Callable[[str], None] = lambda _m: None,
    ) -> ReplicaRecord:
        """Start one replica that is not in the spec (the autoscaler's), without waiting for it:
        a vLLM engine as the spec's are started, a simulated one in a process of its own that
        binds its port after ``cold_start_s``. The caller polls its ``/health``."""
        if replica.name in self.records() and group_members(self.records()[replica.name].pid):
            raise LaunchError(f"replica {replica.name} is already running")
        if not port_free(self.spec.host, replica.port):
            raise LaunchError(f"replica {replica.name!r}: port {replica.port} on {self.spec.host} is already in use")
        if replica.engine == "vllm":
            record = self._start_engine(replica, False, cpu_nice, progress)
        else:
            if self.spec_path is None:
                raise LaunchError("a simulated replica needs the spec file (Launcher(spec_path=...))")
            cmd = [sys.executable, "-m", "fleet.sim", "--spec", str(self.spec_path)]
            cmd += ["--replica-json", replica.model_dump_json(), "--cold-start-s", f"{cold_start_s:g}"]
            log_path = self.state_dir / f"{replica.name}.log"
            proc = spawn(cmd, log_path, replica.name, False)
            self._children[replica.name] = proc
            progress(f"started {replica.name} ({replica.model}, simulated) pid {proc.pid} on port {replica.port}")
            record = ReplicaRecord(
                replica.name, replica.model, replica.port, proc.pid, time.time(), str(log_path), cmd, {}
            )
        self._record(record)
        return record

    def exited(self, name: str) -> str | None:
        """Why a recorded replica is gone (None while its processes live), with its log's tail."""
        record = self.records().get(name)
        if record is None:
            return f"replica {name} is not recorded"
        if group_members(record.pid) and self._exit_code(record) is None:
            return None
        return f"replica {name} exited (exit code {self._exit_code(record)}); last lines of {record.log}:\n" + log_tail(
            Path(record.log)
        )

    def start_autoscaler(
        self, *, cpu_nice: int = 0, file_sd_wait_s: float = 12.0, progress: Callable[[str], None] = lambda _m: None
    ) -> ReplicaRecord:
        """The autoscaler (``python -m fleet.autoscale``) in a process of its own, recorded as
        ``autoscaler``; its decisions go to ``<state>/autoscaler.log``. ``file_sd_wait_s``: how
        long a replica taken out of the collector's targets file still runs (a file_sd poll and a
        scrape: its last scrape is a good one)."""
        if self.spec_path is None:
            raise LaunchError("the autoscaler needs the spec file (Launcher(spec_path=...))")
        scale = self.spec.autoscale
        if scale is None or not scale.enabled:
            raise LaunchError(f"{self.spec_path}: no enabled autoscale section: nothing to scale")
        current = self.records().get(AUTOSCALER)
        if current is not None and group_members(current.pid):
            raise LaunchError(f"the autoscaler is already running (pid {current.pid})")
        cmd = [sys.executable, "-m", "fleet.autoscale", "--spec", str(self.spec_path), "--state", str(self.state_dir)]
        cmd += ["--cpu-nice", str(cpu_nice), "--file-sd-wait-s", f"{file_sd_wait_s:g}"]
        log_path = self.state_dir / f"{AUTOSCALER}.log"
        proc = spawn(cmd, log_path, AUTOSCALER, True, env={"PYTHONUNBUFFERED": "1"})
        self._children[AUTOSCALER] = proc
        record = ReplicaRecord(AUTOSCALER, "-", 0, proc.pid, time.time(), str(log_path), cmd, {})
        self._record(record)
        progress(f"started the autoscaler pid {proc.pid} ({', '.join(scale.pools)}; every {scale.interval_s:g}s)")
        return record

    def _exit_code(self, record: ReplicaRecord) -> int | None:
        proc = self._children.get(record.name)
        return proc.poll() if proc is not None and proc.pid == record.pid else None

    def _wait_healthy(self, records: list[ReplicaRecord], progress: Callable[[str], None]) -> None:
        deadline = time.monotonic() + self.spec.health_timeout_s
        waiting = {r.name: r for r in records}
        t0 = time.monotonic()
        while waiting:
            for name, record in list(waiting.items()):
                if healthy(record.health_url or f"http://{self.spec.host}:{record.port}", timeout=1.0):
                    progress(f"{name} healthy after {time.monotonic() - t0:.0f}s")
                    del waiting[name]
                    continue
                code = self._exit_code(record)
                if code is not None or not group_members(record.pid):
                    raise LaunchError(
                        f"replica {name} exited during start-up (exit code {code}); "
                        f"last lines of {record.log}:\n{log_tail(Path(record.log))}"
                    )
            if waiting and time.monotonic() > deadline:
                name, record = next(iter(waiting.items()))
                raise LaunchError(
                    f"replica {name} not healthy after {self.spec.health_timeout_s:.0f}s "
                    f"(health_timeout_s); last lines of {record.log}:\n{log_tail(Path(record.log))}"
                )
            if waiting:
                time.sleep(0.5)

    # ----------------------------------------------------------------- watching
    def live(self) -> dict[str, bool]:
        """Replica name -> whether its process group is alive (from the state file)."""
        return {name: bool(group_members(rec.pid)) for name, rec in self.records().items()}

    def status(self) -> list[ReplicaStatus]:
        records = self.records()
        rows = []
        spec_names = {r.name for r in self.spec.replicas}
        added = [(rec.name, rec.model, rec.port) for rec in records.values() if rec.name not in spec_names]
        for name, model, port in [(r.name, r.model, r.port) for r in self.spec.replicas] + added:
            if name in _NOT_REPLICAS:
                continue
            rec = records.get(name)
            if rec is None:
                rows.append(ReplicaStatus(name, model, port, None, "stopped", None, None))
                continue
            alive = bool(group_members(rec.pid))
            if not alive:
                health = "dead"
            elif healthy(f"http://{self.spec.host}:{rec.port}"):
                health = "healthy"
            else:
                health = "starting" if time.time() - rec.started_at < self.spec.health_timeout_s else "unhealthy"
            uptime = time.time() - rec.started_at if alive else None
            rows.append(ReplicaStatus(rec.name, rec.model, rec.port, rec.pid, health, uptime, rec.log))
        for gateway in [records[n] for n in _NOT_REPLICAS if n in records]:
            alive = bool(group_members(gateway.pid))
            if not alive:
                health = "dead"
            elif gateway.name == AUTOSCALER:
                health = "healthy"  # a loop with no port: alive is all there is to say
            else:
                url = gateway.health_url or f"http://{self.spec.host}:{gateway.port}"
                health = "healthy" if healthy(url) else "unhealthy"
            rows.append(
                ReplicaStatus(
                    gateway.name,
                    gateway.model,
                    gateway.port,
                    gateway.pid,
                    health,
                    time.time() - gateway.started_at if alive else None,
                    gateway.log,
                )
            )
        return rows

    def dead(self) -> list[str]:
        """Replicas recorded as started whose processes are gone."""
        return [name for name, alive in self.live().items() if not alive]

    # ----------------------------------------------------------------- stopping
    def kill(self, name: str) -> None:
        """SIGKILL one replica's whole process group (the replica-crash scenario)."""
        rec = self.records().get(name)
        if rec is None:
            raise LaunchError(f"replica {name} is not running")
        signal_group(rec.pid, signal.SIGKILL)
        self._reap(name)

    def stall(self, name: str, stalled: bool = True) -> None:
        """Freeze (or resume) a simulated replica's engine with its requests running: the
        simulator's test hook (``POST /sim/stall``) for the stall scenarios; real engines have none."""
        replica = self.spec.replica(name)
        if replica.engine != "sim":
            raise LaunchError(f"replica {name} is a real engine: stalling one is a simulator test hook")
        import httpx

        try:
            httpx.post(f"{self.spec.url(replica)}/sim/stall", json={"stalled": stalled}, timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            raise LaunchError(f"replica {name}: {exc}") from None

    def restart(self, name: str, progress: Callable[[str], None] = lambda _m: None) -> None:
        """Start a stopped or crashed replica again (scenarios; never automatic)."""
        rec = self.records().get(name)
        if rec is not None and group_members(rec.pid):
            raise LaunchError(f"replica {name} is still running")
        self.start([name], attach=True, progress=progress)

    def stop(
        self,
        names: Iterable[str] | None = None,
        *,
        timeout_s: float = 20.0,
        progress: Callable[[str], None] = lambda _m: None,
    ) -> list[str]:
        """Stop replicas (all recorded ones by default): SIGTERM, wait, SIGKILL. Returns names.
        The autoscaler goes first (it would start or stop replicas meanwhile); the records are
        read again after it stopped, so a replica it started just before is stopped too."""
        stopped: list[str] = []
        records = self.records()
        if AUTOSCALER in records and (names is None or AUTOSCALER in names):
            stopped += self._stop_group([AUTOSCALER], records, timeout_s, progress)
            records = self.records()
        targets = [n for n in (names if names is not None else list(records)) if n in records and n != AUTOSCALER]
        gateway = records.get("gateway")
        if gateway is not None and "gateway" in targets and gateway.flush_s > 0 and group_members(gateway.pid):
            # a third-party gateway first, once its last telemetry left it (Envoy drops what it holds at SIGTERM)
            time.sleep(gateway.flush_s)
            targets = ["gateway", *[n for n in targets if n != "gateway"]]
        return stopped + self._stop_group(targets, records, timeout_s, progress)

    def _stop_group(
        self, targets: list[str], records: dict[str, ReplicaRecord], timeout_s: float, progress: Callable[[str], None]
    ) -> list[str]:
        for name in targets:
            signal_group(records[name].pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name in targets:
            pgid = records[name].pid
            while group_members(pgid) and time.monotonic() < deadline:
                self._reap(name)
                time.sleep(0.2)
            if group_members(pgid):
                progress(f"{name} did not stop within {timeout_s:.0f}s: killing it")
                signal_group(pgid, signal.SIGKILL)
                for _ in range(50):
                    if not group_members(pgid):
                        break
                    time.sleep(0.1)
            self._reap(name)
            progress(f"stopped {name}")
        with self._locked() as saved:
            for name in targets:
                if name in saved and saved[name].pid == records[name].pid:
                    del saved[name]
        return targets

    def _reap(self, name: str) -> None:
        proc = self._children.get(name)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
