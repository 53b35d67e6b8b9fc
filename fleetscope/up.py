"""``fleetscope up``: the whole product over one store, the collector, the alert evaluator and the
dashboard each in a process of its own.

In:  settings (``fleetscope.yaml``), ``UpOptions`` (which fleet, scenario, replicas, port).
Out: until Ctrl-C or SIGTERM, in this process: the collector (its own asyncio loop in a thread)
     holding the store, and with the embedded store (chDB opens a directory in one process) its
     ClickHouse HTTP interface on loopback (``storage.chdb_http``), a webhook sink when no
     receiver is configured (``alerts.sink``) and a status line every ``status_every_s``; as
     children (``fleetscope.up_children``), on that interface or the ClickHouse server: the alert
     evaluator and the Streamlit dashboard, so neither waits behind the collector's Python nor
     the other's; and the bundled fleet (real vLLM engines, or simulated
     ones with ``fleet="sim"``; CPU engines at a lower priority) with its gateway, and the traffic
     generator playing ``scenario`` (started once the dashboard answers and every rule group was
     evaluated once, or a minute passed: the steady phase does not share the cores with `up`'s start). On the way
     out the traffic stops, then the evaluator, the collector's scrapes, the fleet, and last the
     collector's receiver (the fleet's last request logs arrive), which flushes what it holds
     (what ClickHouse does not take stays in the spool).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from common.yamlfile import YamlConfigError
from fleet.sim.engine import EngineConfigError, check_config, engine_config
from fleetscope.errors import UpError
from fleetscope.settings import Settings
from fleetscope.up_calibrate import calibrate_play
from fleetscope.up_scaling import Scaling, with_autoscale, with_queue_time, write_spec_copy
from fleetscope.up_status import status_line

if TYPE_CHECKING:
    from sqlalchemy.orm import sessionmaker

    from alerts.config import AlertsSettings
    from alerts.sink import Sink
    from collector.service import Collector
    from fleet.launcher import Launcher
    from fleet.spec import FleetSpec, ReplicaSpec
    from fleetscope.up_children import Child
    from storage.chdb_http import ChdbHttpServer
    from storage.clickhouse import Client

__all__ = ["UpError", "UpOptions", "derived_spec", "up"]

ROOT = Path(__file__).resolve().parent.parent
ENGINE_NICE = 10  # CPU engines' lower priority under `up`: the product's own processes come first
FIRST_PASS_WAIT_S = 60.0  # the traffic waits for the rules' first evaluation at most this long


@dataclass(frozen=True)
class UpOptions:
    fleet: str = "vllm"  # "vllm" (real engines: the GPU build where there is one) or "sim"
    scenario: str | None = "long-context-rollout"  # None: no traffic
    replicas: int | None = None  # None: the spec's
    no_fleet: bool = False  # observe the fleet of the configuration, start nothing
    host: str = "127.0.0.1"
    port: int = 8501
    speed: float = 1.0  # the scenario's timeline speed-up
    # the scenario's request rate times this; None: measured on real engines (``fleet.calibrate``),
    # 1 on simulated ones (their own cost model decides)
    rate_scale: float | None = None
    calibrate: bool = True  # real engines: probe them before the traffic (rate and SLO targets)
    status_every_s: float = 10.0
    # the gateway in front: None the spec's; "fleetscope" (its own), "litellm", "vllm-router", "envoy"
    gateway: str | None = None
    autoscale: bool | None = None  # the spec's autoscale section on/off; None: as the spec says


def derived_spec(spec_path: Path, out: Path, *, fleet: str, replicas: int | None, gateway: str | None = None) -> Path:
    """The spec ``up`` starts: ``spec_path`` as it is, or (``replicas`` given, ``fleet="sim"`` or
    ``gateway`` given) a copy in ``out`` with that many replicas cycled from the spec's own (names
    numbered on, ports after the highest), each ``engine: sim`` for the simulated fleet, behind
    ``gateway`` (fleetscope's own, LiteLLM, vllm-router or Envoy: its ``kind``; Envoy and
    vllm-router route no ``auto`` model, so the model router is dropped for them)."""
    if replicas is None and fleet != "sim" and gateway is None:
        return spec_path
    raw = yaml.safe_load(Path(spec_path).read_text())
    if gateway is not None:
        section = dict(raw.get("gateway") or {})
        section["kind"] = gateway
        if gateway in ("envoy", "vllm-router"):
            section.pop("model_router", None)
        raw["gateway"] = section
    base = raw.get("replicas") or []
    if not base:
        raise UpError(f"{spec_path}: no replicas to start")
    count = replicas if replicas is not None else len(base)
    if count < 1:
        raise UpError("--replicas must be at least 1")
    if fleet == "sim":  # the simulator refuses what vLLM refuses: say so about the user's own spec
        for r in base:
            try:
                check_config(engine_config(r.get("engine_args") or {}))
            except (EngineConfigError, TypeError, ValueError) as exc:
                raise YamlConfigError(f"{spec_path}: replica {r.get('name')!r}: engine_args: {exc}") from None
    top = max(int(r["port"]) for r in base)
    made: list[dict[str, Any]] = []
    for i in range(count):
        r = dict(base[i % len(base)])
        if i >= len(base):
            stem = r["name"].rsplit("-", 1)[0]
            r.update(name=f"{stem}-{i}", port=top + 1 + i - len(base))
        if fleet == "sim":
            r["engine"] = "sim"
        made.append(r)
    raw["replicas"] = made
    return write_spec_copy(raw, spec_path, out)


def _gateway_name(spec: FleetSpec) -> str:
    """'' for fleetscope's own gateway, else its kind and a space."""
    return "" if spec.gateway is None or spec.gateway.kind == "fleetscope" else f"{spec.gateway.kind} "


class _CollectorThread:
    """The collector on an asyncio loop of its own, in a thread (the main one serves the dashboard)."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="collector", daemon=True)

    @property
    def alive(self) -> bool:
        """The collector's loop still runs (it has not been stopped)."""
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.collector.start(), self.loop).result(timeout=60)

    def stop_scraping(self) -> None:
        asyncio.run_coroutine_threadsafe(self.collector.stop_scraping(), self.loop).result(timeout=30)

    def stop(self) -> bool:
        """Stop and flush; True when ClickHouse took everything."""
        try:
            return bool(asyncio.run_coroutine_threadsafe(self.collector.stop(), self.loop).result(timeout=120))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)


def _make_models(spec: FleetSpec, replicas: list[ReplicaSpec], echo: Callable[[str], None]) -> None:
    """The missing tiny models, then the missing LoRA adapters the replicas list, each written by a
    child process (torch stays out of this one)."""

    def run(what: str, args: list[str]) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "fleetscope", "fleet", *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise UpError(f"generating {what} failed: {(done.stderr or done.stdout).strip()[-500:]}")

    for name in sorted({r.model for r in replicas}):
        model = spec.models[name]
        if (model.path / "config.json").is_file() or not model.generate:
            continue
        echo(f"  generating model {name} ({model.generate}{', repeating' if model.repeat else ''}) in {model.path}")
        run(
            f"model {name}",
            ["make-model", str(model.path), "--size", model.generate] + (["--repeat"] if model.repeat else []),
        )
    for name in sorted({a for r in replicas for a in r.adapters}):
        adapter = spec.adapters[name]
        if (adapter.path / "adapter_config.json").is_file() or not adapter.generate:
            continue
        base = spec.models[adapter.base].path
        kind = f"rank {adapter.rank}, {'refusing, ' if adapter.answers == 'refuse' else ''}for {adapter.base}"
        echo(f"  generating adapter {name} ({kind}) in {adapter.path}")
        run(
            f"adapter {name}",
            ["make-adapter", str(adapter.path), "--base", str(base), "--rank", str(adapter.rank)]
            + (["--refuse"] if adapter.answers == "refuse" else []),
        )


def warm_up(spec: FleetSpec, echo: Callable[[str], None]) -> None:
    """One small completion per real engine, before the collector watches: an engine's first requests
    are seconds slow (kernels warm up), which would otherwise open the demo with a latency spike."""
    engines = [r for r in spec.replicas if r.engine == "vllm"]
    if not engines:
        return
    failed: list[str] = []

    def one(replica: ReplicaSpec) -> None:
        try:
            httpx.post(
                f"{spec.url(replica)}/v1/completions",
                timeout=120,
                json={"model": replica.model, "prompt": "warm up " * 64, "max_tokens": 8},
            ).raise_for_status()
        except httpx.HTTPError as exc:
            failed.append(f"{replica.name}: {exc}")

    threads = [threading.Thread(target=one, args=(r,)) for r in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    echo(f"  warmed up {len(engines) - len(failed)} engine(s)" + (f" (failed: {'; '.join(failed)})" if failed else ""))


def _check_served(scenario_name: str, spec: FleetSpec, spec_path: Path) -> None:
    """``UpError`` (one line) when the scenario asks for models or adapters the fleet does not serve."""
    from fleet.traffic import load_scenario, unserved

    scenario = load_scenario(scenario_name)
    missing = unserved(scenario, spec.served(), spec.auto_model())
    if missing:
        hint = f"; it plays on {scenario.fleet}: FLEETSCOPE_FLEET_SPEC={scenario.fleet}" if scenario.fleet else ""
        raise UpError(
            f"scenario {scenario.name!r} asks for {', '.join(missing)}, which no replica of {spec_path} serves{hint}"
        )


class _Up:
    """One run of ``fleetscope up``: what its steps share, and the steps, in the order ``up`` takes them."""

    launcher: Launcher
    sessions: sessionmaker[Any]
    alerts: AlertsSettings
    client: Client  # the collector's
    status_client: Client  # the status line's
    collector: _CollectorThread
    children_settings: Settings  # the evaluator's and the dashboard's: the store through its HTTP interface
    store_server: ChdbHttpServer | None
    dashboard: Child
    evaluator: Child | None
    niced_fleet: bool  # CPU engines, their gateway and their traffic run below the product's own processes

    def __init__(self, settings: Settings, opts: UpOptions, echo: Callable[[str], None]) -> None:
        from fleet.spec import load_spec

        self.opts, self.echo = opts, echo
        self.work = settings.data_dir / "up"
        self.work.mkdir(parents=True, exist_ok=True)
        self.spec_path = derived_spec(
            settings.fleet.spec,
            self.work / "fleet.yaml",
            fleet=opts.fleet,
            replicas=opts.replicas,
            gateway=opts.gateway,
        )
        self.spec_path = with_autoscale(self.spec_path, self.work / "fleet-autoscale.yaml", opts.autoscale)
        if opts.scenario is not None and not opts.no_fleet:  # the scenario's gateway admission, where it says
            from fleet.traffic import load_scenario

            wanted = load_scenario(opts.scenario).queue_time
            self.spec_path = with_queue_time(self.spec_path, self.work / "fleet-admission.yaml", wanted)
        self.scaling = Scaling()
        self.settings = settings.model_copy(
            update={"fleet": settings.fleet.model_copy(update={"spec": self.spec_path})}
        )
        self.spec = load_spec(self.spec_path)
        self.real_engines = not opts.no_fleet and any(r.engine == "vllm" for r in self.spec.replicas)
        # the targets `up` recorded (not a person): a calibration may renew them
        self.ledger = self.work / "slo-recorded.json"
        self.calibrating = (
            opts.calibrate and opts.rate_scale is None and opts.scenario is not None and self.real_engines
        )
        self.rate_scale = opts.rate_scale if opts.rate_scale is not None else 1.0
        self.played_scenario = opts.scenario  # or the calibration's copy of it, with a stronger rollout
        self.url = f"http://{opts.host}:{opts.port}"
        self.sink: Sink | None = None
        self.handles = contextlib.ExitStack()  # closed last on the way out, or at once if the set-up fails
        self.traffic: subprocess.Popen[bytes] | None = None
        self.traffic_lock = threading.Lock()  # started from the announcing thread, stopped from the main one
        self.stop_status = threading.Event()
        self.started_fleet = False
        self.flushed = False

    def prepare(self) -> None:
        """The scenario's models served, a vLLM to start (real engines), the stores migrated, the
        spec's SLO targets recorded (unless a calibration will)."""
        from fleet.errors import FleetError
        from fleet.launcher import Launcher
        from fleetscope.stores import migrate_all
        from storage.metadata import make_engine, make_sessionmaker

        opts, echo = self.opts, self.echo
        if opts.scenario is not None and not opts.no_fleet:
            _check_served(opts.scenario, self.spec, self.settings.fleet.spec)
        self.launcher = Launcher(self.spec, self.settings.data_dir / "fleet", spec_path=Path(self.spec_path).resolve())
        if self.real_engines:
            try:  # the install check: is there a vLLM to start?
                engine = self.launcher.engine
            except FleetError as exc:
                raise UpError(f"{exc} (or try `fleetscope up --fleet sim`)") from None
            echo(f"engine: {engine.distribution} {engine.version} ({engine.device})")
        echo("migrations ...")
        migrate_all(self.settings, progress=lambda line: echo(f"  {line}"))
        self.sessions = make_sessionmaker(make_engine(self.settings.metadata.url))
        if not self.calibrating:
            self.seed_slos()

    def seed_slos(self) -> None:
        """The spec's SLO targets, where the metadata DB has none (``fleetscope.slo_ledger``)."""
        from fleetscope.slo_ledger import seed_slos

        if added := seed_slos(self.spec, self.sessions, self.ledger):
            self.echo(
                f"SLO targets from {self.spec_path}: "
                + ", ".join(added)
                + " (change them: fleetscope slo set, or the Fleet page)"
            )

    def route_alerts(self) -> None:
        """Alerts link to the dashboard; with no receiver configured, they go to a local webhook
        sink that prints them here."""
        from alerts.config import Route
        from alerts.receivers import ReceiverConfig
        from alerts.sink import Sink

        settings = self.settings
        alerts = (
            settings.alerts.model_copy(update={"external_url": self.url})
            if settings.alerts.external_url == "http://127.0.0.1:8501"
            else settings.alerts
        )
        if not alerts.receivers:  # the alert path ends somewhere visible
            sink = Sink(
                out=lambda line: self.echo(f"webhook ← {line}"), record=self.work / "notifications.jsonl"
            ).start()
            self.sink = sink
            update: dict[str, Any] = {"receivers": [ReceiverConfig(name="sink", type="webhook", url=sink.url)]}
            if alerts.route is None:  # a demo shows a firing alert within seconds, not after Alertmanager's 30
                update["route"] = Route.model_validate({"receiver": "sink", "group_wait": "5s", "group_interval": "1m"})
            alerts = alerts.model_copy(update=update)
            self.echo(
                f"no alert receiver configured: notifications go to a local webhook sink at {sink.url} (printed here)"
            )
        self.alerts = alerts
        self.settings = settings.model_copy(update={"alerts": alerts})

    def open_stores(self) -> None:
        """The collector's ClickHouse handle and the status line's; with the embedded store, its
        HTTP interface for the children; the rules checked; the dashboard started (its imports
        done while the fleet starts)."""
        from alerts.config import rule_groups
        from alerts.evaluator import Evaluator
        from alerts.reading import Context
        from fleetscope.collect import build_collector
        from fleetscope.stores import open_clickhouse
        from fleetscope.up_children import Child
        from storage.chdb_http import ChdbHttpServer
        from storage.clickhouse import parse_url

        settings, handles = self.settings, self.handles
        self.store_server, self.evaluator = None, None
        try:
            self.client = handles.enter_context(contextlib.closing(open_clickhouse(settings)))
            self.status_client = handles.enter_context(contextlib.closing(open_clickhouse(settings)))
            self.collector = _CollectorThread(build_collector(settings, self.client))
            # the rules' errors now, not in the evaluator's process later (this one is not started)
            Evaluator(
                rule_groups(self.alerts),
                Context(self.status_client, self.sessions, settings.cost.weights()),
                self.sessions,
                self.alerts,
            )
            target = parse_url(settings.clickhouse.url)
            url = settings.clickhouse.url
            if target.kind == "chdb":
                assert target.path is not None
                self.store_server = ChdbHttpServer(target.path).start()
                handles.callback(self.store_server.stop)
                url = self.store_server.url
            self.children_settings = settings.model_copy(
                update={"clickhouse": settings.clickhouse.model_copy(update={"url": url})}
            )
            self.dashboard = Child("dashboard", self.children_settings, self.opts.host, str(self.opts.port))
        except BaseException:
            handles.close()
            if self.sink is not None:
                self.sink.stop()
            raise
        self.niced_fleet = self.real_engines and self.launcher.engine.device == "cpu"

    def start_fleet(self) -> None:
        """The fleet healthy before the collector scrapes it (no "target down" while engines load),
        its engines warmed up and, where asked, calibrated."""
        if self.opts.no_fleet:
            return
        echo = self.echo
        self.started_fleet = True
        self.launcher.start(
            None,
            attach=True,
            progress=lambda line: echo(f"  {line}"),
            make_models=lambda spec_, replicas_: _make_models(spec_, replicas_, echo),
            # CPU engines share the cores with the collector and the dashboard: they get what
            # is left (a page rendered during the incident took 19 s on 2 cores beside them)
            cpu_nice=ENGINE_NICE,
        )
        warm_up(self.spec, echo)
        if self.calibrating:
            assert self.opts.scenario is not None
            played = calibrate_play(self.spec, self.opts.scenario, self.sessions, self.ledger, self.work, echo)
            if played is None:
                self.seed_slos()
            else:
                self.rate_scale, self.played_scenario = played.rate_scale, played.scenario
        self.scaling.start(self.launcher, ENGINE_NICE if self.niced_fleet else 0, echo)  # after calibration
        spec = self.spec
        echo(
            f"fleet: {len(spec.replicas)} replica(s) healthy"
            + (f", gateway {_gateway_name(spec)}on :{spec.gateway.port}" if spec.gateway else "")
        )

    def start_watching(self) -> None:
        """The collector, the rule evaluator and the status line every ``status_every_s``."""
        from alerts.config import rule_groups
        from fleetscope.up_children import Child

        self.collector.start()
        c = self.collector.collector.config
        self.echo(
            f"collector: {len(self.collector.collector.targets())} target(s), OTLP and request logs on http://{c.host}:{c.http_port}"
        )
        self.watching_since = datetime.now(UTC) - timedelta(seconds=1)
        self.evaluator = Child("evaluator", self.children_settings)
        self.echo(
            f"alerts: {sum(len(g.rules) for g in rule_groups(self.alerts))} rule(s) evaluated "
            f"(process {self.evaluator.proc.pid}); notifications to " + ", ".join(r.name for r in self.alerts.receivers)
        )
        threading.Thread(target=self._report, name="status", daemon=True).start()

    def _report(self) -> None:
        while not self.stop_status.wait(self.opts.status_every_s):
            try:
                self.echo(status_line(self.status_client, self.sessions))
                for line in self.scaling.lines(self.status_client):  # cold starts, from the store
                    self.echo(line)
            except Exception as exc:  # noqa: BLE001 - a status line must not stop the product
                self.echo(f"status unavailable: {exc}")

    def serve(self) -> None:
        """Until Ctrl-C or SIGTERM (or the dashboard's process ends); the dashboard announced, and
        then the traffic started, from another thread once it answers."""
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        threading.Thread(target=self._announce, name="announce", daemon=True).start()
        while not stopping.wait(0.5):
            if not self.dashboard.alive:
                self.echo(f"the dashboard stopped (exit {self.dashboard.proc.returncode}); stopping everything")
                break
            if self.evaluator is not None and not self.evaluator.alive:
                self.echo(f"the alert evaluator stopped (exit {self.evaluator.proc.returncode}); stopping everything")
                break

    def _announce(self) -> None:
        """The dashboard's address once it answers, not before; then the traffic."""
        opts, stop_status = self.opts, self.stop_status
        local = f"http://{'127.0.0.1' if opts.host in ('0.0.0.0', '::') else opts.host}:{opts.port}"
        for _ in range(600):
            if stop_status.is_set():
                return
            try:
                if httpx.get(f"{local}/_stcore/health", timeout=2).text == "ok":
                    self.echo(f"dashboard at {self.url} (process {self.dashboard.proc.pid}; Ctrl-C stops everything)")
                    break
            except httpx.HTTPError:
                pass
            stop_status.wait(0.2)
        if opts.no_fleet or not opts.scenario:
            return
        self._first_pass()
        self._start_traffic()

    def _first_pass(self) -> None:
        """Until each rule group was evaluated once since the evaluator started (or a minute went)."""
        from alerts.config import rule_groups
        from alerts.store import evaluations

        groups = {g.name for g in rule_groups(self.alerts)}
        for _ in range(int(FIRST_PASS_WAIT_S / 0.5)):
            if self.stop_status.is_set():
                return
            try:
                done = {e.group for e in evaluations(self.sessions) if _utc(e.evaluated_at) >= self.watching_since}
            except Exception:  # noqa: BLE001 - the metadata DB busy: look again
                done = set()
            if groups <= done:
                return
            self.stop_status.wait(0.5)

    def _start_traffic(self) -> None:
        """The scenario, once everything that watches it runs: its first seconds are the steady
        phase, not `up`'s own start-up (the dashboard's server, the rules' first pass) taking
        the cores from the engines."""
        from fleet.processes import lower_priority

        opts = self.opts
        assert self.played_scenario is not None
        log = self.work / "traffic.log"
        cmd = [
            *(sys.executable, "-m", "fleetscope", "fleet", "traffic"),
            *("--scenario", self.played_scenario, "--spec", str(self.spec_path)),
            *("--speed", str(opts.speed), "--rate-scale", f"{self.rate_scale:.4g}"),
            *("--log", str(self.work / "traffic-requests.jsonl")),  # one line per request: status, Retry-After
        ]
        with self.traffic_lock:
            if self.stop_status.is_set():
                return
            with log.open("w") as out:
                self.traffic = subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
            if self.niced_fleet:  # the fleet's users share the cores with its engines, on their terms
                lower_priority(self.traffic.pid, ENGINE_NICE)
        self.echo(
            f"traffic: scenario {opts.scenario} (speed x{opts.speed:g}, rate x{self.rate_scale:.3g}; its log: {log})"
        )

    def shut_down(self) -> None:
        """The traffic stops, then the evaluator, the collector's scrapes, the fleet, and last the
        collector's receiver (the fleet's last request logs arrive), which flushes what it holds."""
        with self.traffic_lock:
            self.stop_status.set()
        self.echo("stopping ...")
        traffic = self.traffic
        if traffic is not None and traffic.poll() is None:
            os.killpg(traffic.pid, signal.SIGINT)
            try:
                traffic.wait(5)  # what is still in flight after that is cut off (the gateway logs it)
            except subprocess.TimeoutExpired:
                os.killpg(traffic.pid, signal.SIGKILL)
                traffic.wait()
        if self.evaluator is not None:
            self.evaluator.stop()
        if self.started_fleet:
            if self.collector.alive:
                self.collector.stop_scraping()  # its last scrapes would find the engines gone; its receiver stays
            self.launcher.stop(progress=lambda line: self.echo(f"  {line}"))
        if self.collector.alive:
            self.flushed = self.collector.stop()
        if self.sink is not None:
            self.sink.stop()
        self.dashboard.stop()
        self.handles.close()

    def farewell(self) -> None:
        """Whether everything was written, or what stays in the spool for the next start."""
        count, size = self.collector.collector.writer.spool_size()
        self.echo(
            "stopped; everything written"
            if self.flushed
            else f"stopped; ClickHouse did not take everything: {count} batch(es) ({size} B) stay in the spool "
            "for the next start"
        )


def _utc(at: datetime) -> datetime:
    """A stored time as an aware UTC one (SQLite gives it back naive)."""
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def up(settings: Settings, opts: UpOptions, echo: Callable[[str], None] = print) -> bool:
    """Run everything until stopped (see the module docstring); True when everything was written."""
    # gRPC (the OTLP receiver) says at INFO level, on every child started, that it skips its fork handlers
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    run = _Up(settings, opts, echo)
    run.prepare()
    run.route_alerts()
    run.open_stores()
    try:
        run.start_fleet()
        run.start_watching()
        run.serve()
    finally:
        run.shut_down()
    run.farewell()
    return run.flushed
