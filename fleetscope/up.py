"""``fleetscope up``: the whole product in one process over one store.

In:  settings (``fleetscope.yaml``), ``UpOptions`` (which fleet, scenario, replicas, port).
Out: until Ctrl-C or SIGTERM, in this process: the collector (its own asyncio loop in a thread),
     the alert evaluator (APScheduler's thread), a webhook sink when no receiver is configured
     (``alerts.sink``), a status line every ``status_every_s`` and the Streamlit dashboard (in the
     main thread: chDB allows one process per data directory), the collector, the evaluator and
     the dashboard each on a ClickHouse handle of its own (a handle serialises its calls; separate
     ones query in parallel); as children: the bundled fleet (real vLLM engines, or simulated
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
import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from common.yamlfile import YamlConfigError
from fleet.sim.engine import EngineConfigError, check_config, engine_config
from fleetscope.settings import Settings

__all__ = ["UpError", "UpOptions", "derived_spec", "record_slos", "seed_slos", "status_line", "up"]

ROOT = Path(__file__).resolve().parent.parent
ENGINE_NICE = 10  # CPU engines' lower priority under `up`: the product's own processes come first
FIRST_PASS_WAIT_S = 60.0  # the traffic waits for the rules' first evaluation at most this long
JUDGED_WINDOW_S = 300.0  # the built-in TTFT rules' window (TTFTOverSLO: latency_over_slo{window="5m"})
JUDGED_MARGIN = 1.25  # the calibrated rate gives the saturating pools this x the requests their p99 needs


class UpError(Exception):
    """``fleetscope up`` cannot start: the reason, in words."""


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
    made = []
    for i in range(count):
        r = dict(base[i % len(base)])
        if i >= len(base):
            stem = r["name"].rsplit("-", 1)[0]
            r.update(name=f"{stem}-{i}", port=top + 1 + i - len(base))
        if fleet == "sim":
            r["engine"] = "sim"
        made.append(r)
    raw["replicas"] = made
    for name, model in (raw.get("models") or {}).items():  # paths stay the spec's, wherever the copy lives
        if isinstance(model, dict) and "path" in model and not Path(model["path"]).is_absolute():
            model["path"] = str((Path(spec_path).resolve().parent / model["path"]).resolve())
        raw["models"][name] = model
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# written by `fleetscope up` from " + str(spec_path) + "\n" + yaml.safe_dump(raw, sort_keys=False))
    return out


def _gateway_name(spec: Any) -> str:
    """'' for fleetscope's own gateway, else its kind and a space."""
    return "" if spec.gateway is None or spec.gateway.kind == "fleetscope" else f"{spec.gateway.kind} "


def status_line(client: Any, sessions: Any, now: datetime | None = None) -> str:
    """Replicas up, requests/s, each model's p99 TTFT over the last 5 minutes beside its SLO target
    (where it has one; with fewer than 100 requests in the 5 minutes, "too few to judge": the
    rules do not compare such a p99 either), the fullest KV cache, alerts firing (and pending)."""
    from alerts.signals import min_requests_for
    from alerts.store import load_states
    from analytics.health import scrape_health
    from analytics.metrics import histogram_quantile
    from analytics.requests import prefer_source, request_totals
    from analytics.saturation import saturation
    from analytics.vllm import TTFT
    from storage.catalog import slo_targets

    end = now or datetime.now(UTC)
    health = scrape_health(client, end - timedelta(seconds=30), end)  # the targets scraped now (not a past run's)
    gateways = health[health["job"] == "gateway"] if len(health) else health
    health = health[health["job"] != "gateway"] if len(health) else health  # replicas: the engines
    up = int(health["up"].sum()) if len(health) else 0
    # each request once: the gateway's log when there is one, else the engines' spans
    totals = request_totals(client, end - timedelta(minutes=1), end, by=["source"], source=None)
    per_source = dict(zip(totals["source"], totals["requests"], strict=True)) if len(totals) else {}
    chosen = prefer_source(s for s, n in per_source.items() if n)
    rate = float(per_source[chosen]) / 60 if chosen else 0.0
    ttft = histogram_quantile(client, TTFT, 0.99, end - timedelta(minutes=5), end, "model")
    targets = {t.model: t.threshold_seconds for t in slo_targets(sessions) if t.metric == "ttft"}
    least = min_requests_for(0.99)  # fewer: their p99 is their slowest, as the SLO rules judge it

    def p99_of(model: str, q: float, n: float) -> str:
        slo = f"SLO {targets[model]:g}s" if model in targets else ""
        if n < least:
            return f"{model} too few to judge ({n:.0f} of {least} requests" + (f"; {slo})" if slo else ")")
        return f"{model} {q:.2f}s" + (f" ({slo})" if slo else "")

    p99 = ", ".join(
        p99_of(model, q, n)
        for model, q, n in sorted(zip(ttft["model"], ttft["quantile"], ttft["count"], strict=True))
        if not math.isnan(q)  # a model with no request in the 5 minutes is left out
    )
    sat = saturation(client, end - timedelta(minutes=1), end, "replica")
    kv = float(sat["kv_max"].max()) if len(sat) else float("nan")
    states = [i.state for found in load_states(sessions).values() for i in found.values()]
    firing, pending = states.count("firing"), states.count("pending")
    return (
        f"replicas up {up}/{len(health)} · {rate:.1f} req/s · p99 TTFT (5 min) {p99 or '–'} · KV max {kv:.0%} "
        f"(1 min) · firing alerts {firing}"
        + (f" (pending {pending})" if pending else "")
        + "".join(
            f" · gateway {row.instance} not scraped: {row.last_error}" for row in gateways.itertuples() if not row.up
        )
    ).replace("nan%", "–")


class _CollectorThread:
    """The collector on an asyncio loop of its own, in a thread (the main one serves the dashboard)."""

    def __init__(self, collector: Any) -> None:
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


def _make_models(spec: Any, replicas: list[Any], echo: Callable[[str], None]) -> None:
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
        echo(f"  generating adapter {name} (rank {adapter.rank}, for {adapter.base}) in {adapter.path}")
        run(
            f"adapter {name}",
            ["make-adapter", str(adapter.path), "--base", str(base), "--rank", str(adapter.rank)],
        )


def warm_up(spec: Any, echo: Callable[[str], None]) -> None:
    """One small completion per real engine, before the collector watches: an engine's first requests
    are seconds slow (kernels warm up), which would otherwise open the demo with a latency spike."""
    engines = [r for r in spec.replicas if r.engine == "vllm"]
    if not engines:
        return
    failed: list[str] = []

    def one(replica: Any) -> None:
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


def seed_slos(spec: Any, sessions: Any, ledger: Path | None = None) -> list[str]:
    """The spec's per-model ``slo`` targets recorded where the metadata DB has none for that model and
    latency (a target set by hand, or changed on the Fleet page, stays); the ones added, as labels.
    ``ledger`` (a JSON file) notes what was recorded, so that a later calibration may replace it."""
    from storage.catalog import SloTarget, set_slo, slo_targets

    have = {(t.model, t.metric) for t in slo_targets(sessions)}
    added = []
    for name, model in sorted(spec.models.items()):
        for metric, seconds in sorted(model.slo.items()):
            if (name, metric) not in have:
                target = SloTarget(name, metric, seconds)
                set_slo(sessions, target)
                added.append(target.label)
                if ledger is not None:
                    _note(ledger, {(name, metric): seconds})
    return added


def _ledger(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _note(path: Path, recorded: dict[tuple[str, str], float]) -> None:
    data = _ledger(path)
    data.update({f"{model}|{metric}": seconds for (model, metric), seconds in recorded.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


def record_slos(sessions: Any, wanted: dict[tuple[str, str], float], ledger: Path) -> tuple[list[str], list[str]]:
    """Record ``wanted`` ((model, metric) -> seconds) as SLO targets, except where the metadata DB
    holds one that ``up`` did not record (``ledger`` says what it did): a target set by hand stays.
    Returns (the targets recorded, the ones kept), as labels."""
    from dataclasses import replace

    from storage.catalog import SloTarget, set_slo, slo_targets

    have = {(t.model, t.metric): t for t in slo_targets(sessions)}
    ours = _ledger(ledger)
    recorded, kept, noted = [], [], {}
    for (model, metric), seconds in sorted(wanted.items()):
        current = have.get((model, metric))
        if current is not None and ours.get(f"{model}|{metric}") != current.threshold_seconds:
            kept.append(current.label)  # set by a person (fleetscope slo set, the Fleet page)
            continue
        target = SloTarget(model, metric, seconds) if current is None else replace(current, threshold_seconds=seconds)
        if current != target:
            set_slo(sessions, target)
        recorded.append(target.label)
        noted[(model, metric)] = seconds
    _note(ledger, noted)
    return recorded, kept


def _calibrate(spec: Any, scenario_name: str, echo: Callable[[str], None]) -> Any:
    """``fleet.calibrate`` on the spec's real engines with the scenario's first mix; None (and a
    line saying why) when it cannot tell: the scenario's own rate and the spec's targets then."""
    from alerts.signals import min_requests_for
    from fleet.calibrate import CalibrationError, calibrate
    from fleet.traffic import load_scenario

    pools: dict[str, list[str]] = {}
    for replica in spec.replicas:
        if replica.engine == "vllm":
            pools.setdefault(replica.model, []).append(spec.url(replica))
    try:
        # the pools the rollout saturates get requests enough for their p99 to be judged: the TTFT
        # rules' 5-minute window holding the 100 requests a p99 needs, a quarter to spare
        floor = JUDGED_MARGIN * min_requests_for(0.99) / JUDGED_WINDOW_S
        cal = calibrate(
            pools, load_scenario(scenario_name).mix, pool_floor_rps=floor, progress=lambda line: echo(f"  {line}")
        )
    except (CalibrationError, OSError) as exc:
        echo(f"  calibration failed ({exc}): playing the scenario's own rate, SLO targets from the spec")
        return None
    echo(cal.line())
    return cal


def _strengthened(spec: Any, scenario_name: str, cal: Any, work: Path, echo: Callable[[str], None]) -> str | None:
    """Where the calibrated rate leaves the scenario's rollout too weak to saturate the small caches
    (``fleet.rollout.strengthen_rollout``), its stronger copy written to ``work/scenario.yaml`` (the
    path, and a line saying so); None: the scenario as shipped."""
    from fleet.rollout import strengthen_rollout
    from fleet.traffic import load_scenario

    replicas = Counter(r.model for r in spec.replicas if r.engine == "vllm")
    scenario, line = strengthen_rollout(load_scenario(scenario_name), cal, dict(replicas))
    if not line:
        return None
    path = work / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    echo(f"  {line} (as played: {path})")
    return str(path)


def _serve_dashboard(host: str, port: int) -> None:
    """Streamlit in this (the main) thread until it is stopped (SIGINT/SIGTERM: its own handlers)."""
    from streamlit.web import bootstrap

    from dashboard.launch import preload

    preload()  # what `up` did not import yet (nothing, once its preloading thread is done)
    gc.freeze()  # the libraries' objects out of the collector's passes (dashboard.launch says why)
    flags = {
        "server.address": host,
        "server.port": port,
        "server.headless": True,
        "browser.gatherUsageStats": False,
        "server.fileWatcherType": "none",
        "server.runOnSave": False,
        "runner.magicEnabled": False,
        "runner.postScriptGC": False,
        "client.toolbarMode": "minimal",
        "logger.level": "warning",
    }
    if hasattr(bootstrap, "_print_url"):  # `up` says where the dashboard is, once it answers
        bootstrap._print_url = lambda *_args, **_kwargs: None  # noqa: SLF001
    bootstrap.load_config_options(flag_options=flags)
    bootstrap.run(str(ROOT / "dashboard" / "app.py"), False, [], flags)


def _check_served(scenario_name: str, spec: Any, spec_path: Path) -> None:
    """``UpError`` (one line) when the scenario asks for models or adapters the fleet does not serve."""
    from fleet.traffic import load_scenario, unserved

    scenario = load_scenario(scenario_name)
    missing = unserved(scenario, spec.served(), spec.auto_model())
    if missing:
        hint = f"; it plays on {scenario.fleet}: FLEETSCOPE_FLEET_SPEC={scenario.fleet}" if scenario.fleet else ""
        raise UpError(
            f"scenario {scenario.name!r} asks for {', '.join(missing)}, which no replica of {spec_path} serves{hint}"
        )


def up(settings: Settings, opts: UpOptions, echo: Callable[[str], None] = print) -> bool:
    """Run everything until stopped (see the module docstring); True when everything was written."""
    # gRPC (the OTLP receiver) says at INFO level, on every child started, that it skips its fork handlers
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    from alerts.config import Route, rule_groups
    from alerts.evaluator import Evaluator
    from alerts.receivers import ReceiverConfig
    from alerts.signals import Context
    from alerts.sink import Sink
    from dashboard.context import use_stores
    from fleet.launcher import FleetError, Launcher, lower_priority
    from fleet.spec import load_spec
    from fleetscope.collect import build_collector
    from fleetscope.stores import migrate_all, open_clickhouse
    from storage.metadata import make_engine, make_sessionmaker

    work = settings.data_dir / "up"
    work.mkdir(parents=True, exist_ok=True)
    spec_path = derived_spec(
        settings.fleet.spec, work / "fleet.yaml", fleet=opts.fleet, replicas=opts.replicas, gateway=opts.gateway
    )
    settings = settings.model_copy(update={"fleet": settings.fleet.model_copy(update={"spec": spec_path})})
    spec = load_spec(spec_path)
    if opts.scenario is not None and not opts.no_fleet:
        _check_served(opts.scenario, spec, settings.fleet.spec)
    launcher = Launcher(spec, settings.data_dir / "fleet", spec_path=Path(spec_path).resolve())
    if not opts.no_fleet and any(r.engine == "vllm" for r in spec.replicas):
        try:  # the install check: is there a vLLM to start?
            engine = launcher.engine
        except FleetError as exc:
            raise UpError(f"{exc} (or try `fleetscope up --fleet sim`)") from None
        echo(f"engine: {engine.distribution} {engine.version} ({engine.device})")
    echo("migrations ...")
    migrate_all(settings, progress=lambda line: echo(f"  {line}"))
    sessions = make_sessionmaker(make_engine(settings.metadata.url))
    ledger = work / "slo-recorded.json"  # the targets `up` recorded (not a person): a calibration may renew them
    calibrating = (
        opts.calibrate
        and opts.rate_scale is None
        and not opts.no_fleet
        and opts.scenario is not None
        and any(r.engine == "vllm" for r in spec.replicas)
    )

    def seed() -> None:
        if added := seed_slos(spec, sessions, ledger):
            echo(
                f"SLO targets from {spec_path}: "
                + ", ".join(added)
                + " (change them: fleetscope slo set, or the Fleet page)"
            )

    if not calibrating:
        seed()
    rate_scale = opts.rate_scale if opts.rate_scale is not None else 1.0
    played_scenario = opts.scenario  # or the calibration's copy of it, with a stronger rollout
    url = f"http://{opts.host}:{opts.port}"
    sink = None
    alerts = (
        settings.alerts.model_copy(update={"external_url": url})
        if settings.alerts.external_url == "http://127.0.0.1:8501"
        else settings.alerts
    )
    if not alerts.receivers:  # the alert path ends somewhere visible
        sink = Sink(out=lambda line: echo(f"webhook ← {line}"), record=work / "notifications.jsonl").start()
        update: dict[str, Any] = {"receivers": [ReceiverConfig(name="sink", type="webhook", url=sink.url)]}
        if alerts.route is None:  # a demo shows a firing alert within seconds, not after Alertmanager's 30
            update["route"] = Route.model_validate({"receiver": "sink", "group_wait": "5s", "group_interval": "1m"})
        alerts = alerts.model_copy(update=update)
        echo(f"no alert receiver configured: notifications go to a local webhook sink at {sink.url} (printed here)")
    settings = settings.model_copy(update={"alerts": alerts})

    handles = contextlib.ExitStack()  # closed last on the way out, or at once if the set-up fails
    try:
        # one chDB handle serialises its calls: the collector, the evaluator (with the status line)
        # and the dashboard get one each, so a page does not wait behind a rule's query or an insert
        client = handles.enter_context(contextlib.closing(open_clickhouse(settings)))
        evaluator_client = handles.enter_context(contextlib.closing(open_clickhouse(settings)))
        dashboard_client = handles.enter_context(contextlib.closing(open_clickhouse(settings)))
        collector = _CollectorThread(build_collector(settings, client))
        evaluator = Evaluator(
            rule_groups(alerts), Context(evaluator_client, sessions, settings.cost.weights()), sessions, alerts
        )
    except BaseException:
        handles.close()
        if sink is not None:
            sink.stop()
        raise
    traffic: subprocess.Popen[bytes] | None = None
    # CPU engines, their gateway and their traffic run below the product's own processes
    niced_fleet = (
        not opts.no_fleet and any(r.engine == "vllm" for r in spec.replicas) and launcher.engine.device == "cpu"
    )
    traffic_lock = threading.Lock()  # started from the announcing thread, stopped from this one
    stop_status = threading.Event()
    started_fleet = False
    flushed = False
    # the dashboard's imports (6 s on an idle 2-core machine, three times that beside busy engines)
    # while the engines load: the dashboard answers that much sooner
    from dashboard.launch import preload

    preloading = threading.Thread(target=preload, name="preload", daemon=True)
    preloading.start()
    try:
        if not opts.no_fleet:  # healthy before the collector scrapes it: no "target down" while engines load
            started_fleet = True
            launcher.start(
                None,
                attach=True,
                progress=lambda line: echo(f"  {line}"),
                make_models=lambda spec_, replicas_: _make_models(spec_, replicas_, echo),
                # CPU engines share the cores with the collector and the dashboard: they get what
                # is left (a page rendered during the incident took 19 s on 2 cores beside them)
                cpu_nice=ENGINE_NICE,
            )
            warm_up(spec, echo)
            if calibrating:
                assert opts.scenario is not None
                cal = _calibrate(spec, opts.scenario, echo)
                if cal is None:
                    seed()
                else:
                    rate_scale = cal.rate_scale
                    played_scenario = _strengthened(spec, opts.scenario, cal, work, echo) or played_scenario
                    wanted = {(model, "ttft"): seconds for model, seconds in cal.slo_ttft_s.items()}
                    recorded, kept = record_slos(sessions, wanted, ledger)
                    if kept:
                        echo(f"  SLO targets kept as set: {', '.join(kept)} (fleetscope slo set, or the Fleet page)")
                    if recorded:
                        echo(f"  SLO targets recorded: {', '.join(recorded)}")
            echo(
                f"fleet: {len(spec.replicas)} replica(s) healthy"
                + (f", gateway {_gateway_name(spec)}on :{spec.gateway.port}" if spec.gateway else "")
            )
        collector.start()
        c = collector.collector.config
        echo(
            f"collector: {len(collector.collector.targets())} target(s), OTLP and request logs on http://{c.host}:{c.http_port}"
        )
        evaluator.start()
        echo(
            f"alerts: {sum(len(g.rules) for g in rule_groups(alerts))} rule(s) evaluated; notifications to "
            + ", ".join(r.name for r in alerts.receivers)
        )

        def report() -> None:
            while not stop_status.wait(opts.status_every_s):
                try:
                    echo(status_line(evaluator_client, sessions))
                except Exception as exc:  # noqa: BLE001 - a status line must not stop the product
                    echo(f"status unavailable: {exc}")

        threading.Thread(target=report, name="status", daemon=True).start()
        readers = [  # the dashboard's pages read their panels at once on these (dashboard.readers)
            handles.enter_context(contextlib.closing(open_clickhouse(settings)))
            for _ in range(settings.dashboard.reader_count() if settings.dashboard.reader_count() > 1 else 0)
        ]
        use_stores(dashboard_client, sessions, settings, readers)

        def start_traffic() -> None:
            """The scenario, once everything that watches it runs: its first seconds are the steady
            phase, not `up`'s own start-up (the dashboard's server, the rules' first pass) taking
            the cores from the engines."""
            nonlocal traffic
            assert played_scenario is not None
            log = work / "traffic.log"
            cmd = [
                sys.executable,
                "-m",
                "fleetscope",
                "fleet",
                "traffic",
                "--scenario",
                played_scenario,
                "--spec",
                str(spec_path),
                "--speed",
                str(opts.speed),
                "--rate-scale",
                f"{rate_scale:.4g}",
            ]
            with traffic_lock:
                if stop_status.is_set():
                    return
                with log.open("w") as out:
                    traffic = subprocess.Popen(
                        cmd,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    )
                if niced_fleet:  # the fleet's users share the cores with its engines, on their terms
                    lower_priority(traffic.pid, ENGINE_NICE)
            echo(f"traffic: scenario {opts.scenario} (speed x{opts.speed:g}, rate x{rate_scale:.3g}; its log: {log})")

        def announce() -> None:  # once it answers, not before; then the traffic
            local = f"http://{'127.0.0.1' if opts.host in ('0.0.0.0', '::') else opts.host}:{opts.port}"
            for _ in range(600):
                if stop_status.is_set():
                    return
                try:
                    if httpx.get(f"{local}/_stcore/health", timeout=2).text == "ok":
                        echo(f"dashboard at {url} (Ctrl-C stops everything)")
                        break
                except httpx.HTTPError:
                    pass
                stop_status.wait(0.2)
            if opts.no_fleet or not opts.scenario:
                return
            groups = {g.name for g in evaluator.groups}
            for _ in range(int(FIRST_PASS_WAIT_S / 0.2)):  # each rule group evaluated once (or a minute gone)
                if stop_status.is_set() or groups <= set(evaluator.last):
                    break
                stop_status.wait(0.2)
            start_traffic()

        threading.Thread(target=announce, name="announce", daemon=True).start()
        try:
            preloading.join()
            _serve_dashboard(opts.host, opts.port)
        except KeyboardInterrupt:
            pass
    finally:
        with traffic_lock:
            stop_status.set()
        echo("stopping ...")
        if traffic is not None and traffic.poll() is None:
            os.killpg(traffic.pid, signal.SIGINT)
            try:
                traffic.wait(5)  # what is still in flight after that is cut off (the gateway logs it)
            except subprocess.TimeoutExpired:
                os.killpg(traffic.pid, signal.SIGKILL)
                traffic.wait()
        evaluator.stop()
        if started_fleet:
            if collector.alive:
                collector.stop_scraping()  # its last scrapes would find the engines gone; its receiver stays
            launcher.stop(progress=lambda line: echo(f"  {line}"))
        if collector.alive:
            flushed = collector.stop()
        if sink is not None:
            sink.stop()
        handles.close()
    count, size = collector.collector.writer.spool_size()
    echo(
        "stopped; everything written"
        if flushed
        else f"stopped; ClickHouse did not take everything: {count} batch(es) ({size} B) stay in the spool "
        "for the next start"
    )
    return flushed
