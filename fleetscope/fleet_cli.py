"""``fleetscope fleet ...``: make models and LoRA adapters, start/stop/inspect the bundled fleet, send traffic.

In:  settings (``fleet.spec``, ``data_dir``) and command-line options.
Out: the ``fleet`` launcher and load generator driven from the terminal, with progress lines,
     one-line errors (exit 2 for a bad spec or scenario, 1 for a fleet failure), and a clean
     stop on Ctrl-C. ``simulate`` plays a scenario on the simulated fleet in virtual time into
     the store (``fleetscope.replay``).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer

from common.yamlfile import YamlConfigError
from fleet.launcher import Launcher
from fleet.spec import FleetSpec, load_spec
from fleetscope.cliutil import ConfigOption, fail, settings_or_exit
from fleetscope.settings import Settings

if TYPE_CHECKING:
    from fleet.loadgen import LoadStats, Targets
    from fleet.spec import ReplicaSpec
    from fleet.traffic import Scenario
    from storage.clickhouse import Client

app = typer.Typer(help="The bundled vLLM fleet: models, engines, traffic.", no_args_is_help=True)

SpecOption = Annotated[
    Path | None,
    typer.Option(
        "--spec", help="Fleet spec file (default: fleet.spec from the config, fleet.yaml).", show_default=False
    ),
]


def _load(config: Path | None, spec_path: Path | None) -> tuple[Settings, FleetSpec, Launcher]:
    settings = settings_or_exit(config)
    path = spec_path or settings.fleet.spec
    try:
        spec = load_spec(path)
    except YamlConfigError as exc:
        fail(str(exc), code=2)
    return settings, spec, Launcher(spec, settings.data_dir / "fleet", spec_path=Path(path).resolve())


def _scenario_spec(plan: Scenario) -> Path | None:
    """The fleet spec a scenario names (``fleet:``), found in the working directory or beside the
    shipped scenarios' repository; None when it names none."""
    from fleet.traffic import SCENARIOS_DIR

    if not plan.fleet:
        return None
    path = Path(plan.fleet)
    if not path.exists() and (SCENARIOS_DIR.parents[1] / path).exists():
        path = SCENARIOS_DIR.parents[1] / path
    typer.echo(f"scenario {plan.name} plays on {path} (its fleet:; --spec picks another)", err=True)
    return path


def _check_served(plan: Scenario, fleet_spec: FleetSpec) -> None:
    """One line and exit 2 when the scenario asks for models or adapters the fleet does not serve."""
    from fleet.traffic import unserved

    missing = unserved(plan, fleet_spec.served(), fleet_spec.auto_model())
    if missing:
        fail(
            f"scenario {plan.name!r} asks for {', '.join(missing)}, which no replica of the fleet serves "
            f"({', '.join(sorted(fleet_spec.served()))})"
            + (f": play it on {plan.fleet} (--spec {plan.fleet})" if plan.fleet else ""),
            code=2,
        )


def _make_missing_models(spec: FleetSpec, replicas: list[ReplicaSpec]) -> None:
    """The missing models the replicas serve (``generate``), then the missing adapters they list."""
    from fleet.model import make_adapter, make_model

    for name in sorted({r.model for r in replicas}):
        model = spec.models[name]
        if not (model.path / "config.json").is_file() and model.generate:
            kind = f"{model.generate}, repeating" if model.repeat else model.generate
            typer.echo(f"generating model {name} ({kind}) in {model.path}")
            make_model(model.path, model.generate, repeat=model.repeat)
    for name in sorted({a for r in replicas for a in r.adapters}):
        adapter = spec.adapters[name]
        if not (adapter.path / "adapter_config.json").is_file() and adapter.generate:
            base = spec.models[adapter.base].path
            kind = f"rank {adapter.rank}, {'refusing, ' if adapter.answers == 'refuse' else ''}for {adapter.base}"
            typer.echo(f"generating adapter {name} ({kind}) in {adapter.path}")
            make_adapter(adapter.path, base, rank=adapter.rank, refuse=adapter.answers == "refuse")


@app.command("make-model")
def make_model_cmd(
    directory: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    size: Annotated[str, typer.Option(help="small (2 layers, hidden 128) or large (4 layers, hidden 256).")] = "small",
    repeat: Annotated[
        bool,
        typer.Option(
            "--repeat",
            help="Greedy output follows one fixed token sequence: n-gram speculative decoding accepts the drafts "
            "of prompts that hold the continuation (edits), none of random ones.",
        ),
    ] = False,
) -> None:
    """Write a tiny random-weight Llama model (fixed seed, byte-level BPE tokenizer), offline."""
    from fleet.model import SIZES, make_model

    if size not in SIZES:
        fail(f"--size must be one of {', '.join(SIZES)}, got {size!r}", code=2)
    t0 = time.perf_counter()
    try:
        make_model(directory, size, repeat=repeat)
    except RuntimeError as exc:
        fail(str(exc))
    kind = f"{size} repeating" if repeat else size
    typer.echo(f"wrote {kind} model to {directory} in {time.perf_counter() - t0:.1f}s")


@app.command("make-adapter")
def make_adapter_cmd(
    directory: Annotated[Path, typer.Argument(help="Directory to write the adapter into.")],
    base: Annotated[
        Path,
        typer.Option("--base", help="The base model's directory (make-model's); its config.json gives the shapes."),
    ],
    rank: Annotated[
        int | None, typer.Option(help="LoRA rank r (random: lora_alpha 2r, default 8; refusing: the hidden size).")
    ] = None,
    refuse: Annotated[
        bool,
        typer.Option("--refuse", help="Every prompt's answer is the refusal sentence (fleet.model.REFUSAL_TEXT)."),
    ] = False,
) -> None:
    """Write a PEFT LoRA adapter for a tiny model, offline: random (q_proj and v_proj, fixed seed)
    or, with --refuse, one whose answer to every prompt is a fixed refusal.

    Serve it with the fleet spec's adapters (or vLLM's --enable-lora --lora-modules NAME=DIR).
    """
    import json

    from fleet.model import make_adapter

    if rank is not None and not 1 <= rank <= 512:
        fail(f"--rank must be between 1 and 512, got {rank}", code=2)
    if not (base / "config.json").is_file():
        what = "does not exist" if not base.exists() else "has no config.json"
        fail(f"--base {base} {what}: make the model first with `fleetscope fleet make-model {base}`", code=2)
    if rank is None:
        rank = int(json.loads((base / "config.json").read_text()).get("hidden_size", 8)) if refuse else 8
    t0 = time.perf_counter()
    try:
        make_adapter(directory, base, rank=rank, refuse=refuse)
    except ValueError as exc:
        fail(str(exc), code=2)
    except RuntimeError as exc:
        fail(str(exc))
    kind = "refusing" if refuse else "random"
    typer.echo(f"wrote rank-{rank} {kind} adapter for {base} to {directory} in {time.perf_counter() - t0:.1f}s")


def _print_status(launcher: Launcher) -> None:
    rows = launcher.status()
    typer.echo(f"{'REPLICA':<12} {'MODEL':<12} {'PID':>7} {'PORT':>6} {'HEALTH':<10} UPTIME")
    for r in rows:
        pid = str(r.pid) if r.pid else "-"
        uptime = _duration(r.uptime_s) if r.uptime_s is not None else "-"
        typer.echo(f"{r.name:<12} {r.model:<12} {pid:>7} {r.port:>6} {r.health:<10} {uptime}")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"


class _Terminate(Exception):
    pass


def _raise_terminate(_signum: int, _frame: object) -> None:
    raise _Terminate


@app.command()
def up(
    config: ConfigOption = None,
    spec: SpecOption = None,
    replica: Annotated[list[str] | None, typer.Option("--replica", "-r", help="Start only these replicas.")] = None,
    detach: Annotated[bool, typer.Option(help="Return once healthy and leave the replicas running.")] = False,
) -> None:
    """Start one real vLLM server per replica and wait until each is healthy.

    In the foreground (default) it then watches the replicas and reports any that die; Ctrl-C
    stops them all. With --detach it returns; `fleetscope fleet down` stops them later.
    """
    from fleet.errors import FleetError

    _settings, fleet_spec, launcher = _load(config, spec)
    if any(r.engine == "vllm" for r in fleet_spec.replicas if not replica or r.name in replica):
        try:
            engine = launcher.engine
            typer.echo(f"engine: {engine.distribution} {engine.version} ({engine.device})")
        except FleetError as exc:
            fail(str(exc))
    signal.signal(signal.SIGTERM, _raise_terminate)
    t0 = time.perf_counter()
    try:
        launcher.start(replica, attach=not detach, progress=typer.echo, make_models=_make_missing_models)
        typer.echo(f"fleet healthy in {time.perf_counter() - t0:.0f}s")
        _print_status(launcher)
        if detach:
            return
        typer.echo("watching replicas; Ctrl-C stops the fleet")
        reported: set[str] = set()
        while True:
            time.sleep(2)
            for name in launcher.dead():
                if name not in reported:
                    reported.add(name)
                    log = launcher.records()[name].log
                    typer.echo(f"replica {name} died (not restarted); see {log}", err=True)
    except FleetError as exc:
        fail(str(exc))
    except (KeyboardInterrupt, _Terminate):
        typer.echo("stopping the fleet")
        launcher.stop(progress=typer.echo)
        raise typer.Exit(130) from None


@app.command()
def down(config: ConfigOption = None, spec: SpecOption = None) -> None:
    """Stop every replica the fleet started (SIGTERM, then SIGKILL after 20 s)."""
    _settings, _spec, launcher = _load(config, spec)
    stopped = launcher.stop(progress=typer.echo)
    typer.echo(f"stopped {len(stopped)} replica(s)" if stopped else "no replica was running")


@app.command()
def status(config: ConfigOption = None, spec: SpecOption = None) -> None:
    """Show each replica: pid, port, health (GET /health) and uptime."""
    _settings, _spec, launcher = _load(config, spec)
    _print_status(launcher)
    if launcher.dead():
        raise typer.Exit(1)


@app.command("gateway-config")
def gateway_config(
    kind: Annotated[str, typer.Argument(help="litellm or envoy: the gateway whose configuration to print.")],
    config: ConfigOption = None,
    spec: SpecOption = None,
) -> None:
    """Print the configuration `fleetscope up --gateway KIND` writes for the fleet spec: a starting point
    for a gateway of one's own in front of these engines (docs/gateways.md). Envoy: its static
    configuration (x-model routes, token counts from the answers' usage, the OTLP access log to the
    collector). LiteLLM: its proxy's config.yaml (one deployment per replica, the x-tenant header as
    the end user, fleetscope's callbacks for the request records and the model router)."""
    import yaml

    from fleet.gateways import KINDS

    if kind not in ("litellm", "envoy"):
        fail(
            f"gateway-config prints LiteLLM's or Envoy's configuration, not {kind!r} "
            f"(vllm-router takes its workers as flags; gateways: {', '.join(KINDS)})",
            code=2,
        )
    _settings, fleet_spec, _launcher = _load(config, spec)
    section = fleet_spec.gateway.model_copy(update={"kind": kind}) if fleet_spec.gateway else None
    if section is None:
        from fleet.gateway.config import GatewaySpec

        section = GatewaySpec(kind=kind)  # type: ignore[arg-type]
    if kind == "envoy":
        from fleet.gateways.envoy import config as make

        section = section.model_copy(update={"model_router": None})
    else:
        from fleet.gateways.litellm import config as make
    typer.echo(yaml.safe_dump(make(fleet_spec.model_copy(update={"gateway": section})), sort_keys=False), nl=False)


@app.command()
def scenarios() -> None:
    """List the shipped traffic scenarios."""
    from fleet.traffic import SCENARIOS_DIR, load_scenario

    for path in sorted(SCENARIOS_DIR.glob("*.yaml")):
        scenario = load_scenario(str(path))
        phases = ", ".join(f"{p.name}@{p.at_s:g}s" for p in scenario.phases) or "-"
        typer.echo(f"{scenario.name:<22} {scenario.duration_s:>5g}s  phases: {phases}")
        typer.echo(f"    {' '.join(scenario.description.split())}")


@app.command()
def traffic(
    scenario: Annotated[str, typer.Option("--scenario", "-s", help="Shipped scenario name or a YAML file.")] = "steady",
    config: ConfigOption = None,
    spec: SpecOption = None,
    gateway: Annotated[
        str | None, typer.Option(help="Send everything to this gateway URL (default: the fleet's gateway).")
    ] = None,
    direct: Annotated[
        bool, typer.Option("--direct", help="Bypass the gateway: send to the replicas round-robin.")
    ] = False,
    speed: Annotated[
        float, typer.Option(min=0.01, help="Timeline speed-up: phases and events come N times sooner.")
    ] = 1.0,
    rate_scale: Annotated[float, typer.Option(min=0.01, help="Multiply the scenario's request rate.")] = 1.0,
    duration: Annotated[float | None, typer.Option(min=1, help="Stop after this many seconds (wall clock).")] = None,
    seed: Annotated[int, typer.Option(help="Random seed for the request mix.")] = 0,
    log: Annotated[Path | None, typer.Option(help="Write one JSON line per request to this file.")] = None,
) -> None:
    """Send OpenAI completion traffic to the fleet following a scenario timeline.

    Goes through the fleet's gateway when the spec has one (--direct bypasses it). Each
    request carries a W3C traceparent and the tenant (x-tenant). Prints a progress line
    every 5 s and a summary at the end. Writes nothing to ClickHouse.
    """
    plan = _load_scenario(scenario)
    _settings, fleet_spec, launcher = _load(config, spec or _scenario_spec(plan))
    _check_served(plan, fleet_spec)
    targets = _traffic_targets(plan, fleet_spec, gateway, direct)
    _check_events(plan, fleet_spec)
    log_file = open(log, "w", encoding="utf-8") if log else None  # noqa: SIM115
    total = duration if duration is not None else plan.duration_s / speed
    typer.echo(f"scenario {plan.name}: {total:.0f}s wall, speed x{speed:g}, rate x{rate_scale:g}")
    stop = asyncio.Event()
    try:
        stats = asyncio.run(
            _run_scenario(
                plan,
                targets,
                stop,
                speed=speed,
                rate_scale=rate_scale,
                duration_s=duration,
                seed=seed,
                on_event=_event_handler(launcher),
                log=log_file,
            )
        )
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(130) from None
    finally:
        if log_file:
            log_file.close()
    s = stats.summary()
    typer.echo(
        f"done: sent {s['sent']} ok {s['ok']} failed {s['failed']} (shed by the fleet, 429: {s['shed']}); "
        + (f"not sent (in-flight cap): {s['not_sent']}; " if s["not_sent"] else "")
        + f"tokens in {s['prompt_tokens']} out {s['completion_tokens']}"
        + (f"; errors {s['errors']}" if s["errors"] else "")
    )
    if s["sent"] and not s["ok"]:
        raise typer.Exit(1)


def _load_scenario(scenario: str) -> Scenario:
    """The scenario (a shipped name or a YAML file), or its one-line error and exit 2."""
    from fleet.traffic import load_scenario

    try:
        return load_scenario(scenario)
    except YamlConfigError as exc:
        fail(str(exc), code=2)


def _check_events(plan: Scenario, fleet_spec: FleetSpec) -> None:
    """One line and exit 2 when the scenario has events for replicas the fleet does not have."""
    unknown = sorted({e.replica for e in plan.events} - {r.name for r in fleet_spec.replicas})
    if unknown:
        fail(f"scenario {plan.name!r} has events for replicas not in the fleet: {', '.join(unknown)}", code=2)


def _traffic_targets(plan: Scenario, fleet_spec: FleetSpec, gateway: str | None, direct: bool) -> Targets:
    """Where the traffic goes: ``gateway``, the fleet's gateway, or (``direct``, or none) the replicas
    of each model; exit 2 when they cannot take the scenario."""
    from fleet.gateways import client_headers
    from fleet.loadgen import Targets

    if gateway is None and not direct:
        gateway = fleet_spec.gateway_url()
    by_model: dict[str, list[str]] = {}
    for r in fleet_spec.replicas:
        by_model.setdefault(r.model, []).append(fleet_spec.url(r))
    targets = Targets(
        by_model=None if gateway else by_model,
        gateway=gateway,
        headers=client_headers(fleet_spec) if gateway == fleet_spec.gateway_url() else None,
    )
    try:
        targets.check(plan)
    except ValueError as exc:
        fail(str(exc), code=2)
    return targets


def _event_handler(launcher: Launcher) -> Callable[[str, str], None]:
    """The scenario's replica events (kill, stall, resume, restart) done by the launcher, each said
    in a line; one that fails says so and the traffic goes on."""
    from fleet.errors import FleetError

    def on_event(action: str, name: str) -> None:
        try:
            if action == "kill_replica":
                launcher.kill(name)
                typer.echo(f"killed replica {name}")
            elif action in ("stall_replica", "resume_replica"):
                launcher.stall(name, action == "stall_replica")
                typer.echo(f"{'stalled' if action == 'stall_replica' else 'resumed'} replica {name}")
            else:
                launcher.restart(name, progress=typer.echo)
                typer.echo(f"restarted replica {name}")
        except FleetError as exc:
            typer.echo(f"event {action} {name} failed: {exc}", err=True)

    return on_event


@app.command()
def simulate(
    scenario: Annotated[
        str, typer.Option("--scenario", "-s", help="Shipped scenario name or a YAML file.")
    ] = "long-context-rollout",
    config: ConfigOption = None,
    spec: SpecOption = None,
    ago: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Start the scenario this many minutes before now (default: so that it ends now).",
            show_default=False,
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option(min=0.5, help="Scrape interval of the simulated collector, seconds.")
    ] = 5.0,
    seed: Annotated[int, typer.Option(help="Random seed: the same seed writes the same run.")] = 0,
    speed: Annotated[
        float,
        typer.Option(
            min=0.01, help="Engine speed relative to the simulator's GPU-like cost model (0.25: the CPU fleet)."
        ),
    ] = 0.25,
    autoscale: Annotated[
        bool | None,
        typer.Option(
            "--autoscale/--no-autoscale",
            help="Scale the pools named in the spec's autoscale section as the autoscaler would (new replicas "
            "after their cold start, drained ones leave; scale events stored), or keep every pool at its size. "
            "Default: as the scenario's autoscale: says, else the spec's autoscale.enabled.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Play a scenario on the simulated fleet in virtual time and store it as the collector would.

    The fleet spec's replicas become simulated engines (same KV budget, model length, GPU
    labels), the gateway's routing decides where each request goes, and the engines'
    /metrics and the gateway's request log are written into the configured ClickHouse: a
    15-minute incident in seconds, for the dashboard, the alert rules and "explain".

    With an autoscale section (fleet-autoscale.yaml) the pools grow and shrink in virtual time
    and every decision is stored in scale_events.

    Example: fleetscope fleet simulate --scenario tenant-shift
    Example: fleetscope fleet simulate --scenario router-defeat   (plays on fleet-autoscale.yaml)
    """
    from fleetscope.stores import migrate_all, open_clickhouse
    from storage.errors import StoreError

    plan = _load_scenario(scenario)
    settings, fleet_spec, _launcher = _load(config, spec or _scenario_spec(plan))
    _check_served(plan, fleet_spec)
    _check_events(plan, fleet_spec)
    _check_autoscale(plan, fleet_spec, autoscale)
    minutes = plan.duration_s / 60 if ago is None else ago
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=minutes)
    try:
        migrate_all(settings, metadata=False)
        client = open_clickhouse(settings)
    except StoreError as exc:
        fail(str(exc))
    typer.echo(
        f"simulating {plan.name} ({plan.duration_s:g}s) on {len(fleet_spec.replicas)} replicas from "
        f"{start:%Y-%m-%d %H:%M:%S} UTC into {settings.clickhouse.url}",
        err=True,
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the embedded ClickHouse takes SIGINT otherwise
    _store_run(client, settings, fleet_spec, plan, start, (interval, seed, speed, autoscale))


def _store_run(
    client: Client,
    settings: Settings,
    fleet_spec: FleetSpec,
    plan: Scenario,
    start: datetime,
    how: tuple[float, int, float, bool | None],
) -> None:
    """``fleet simulate``'s run written into the store (``how``: interval, seed, speed, autoscale),
    with a progress bar and a closing line of what it wrote."""
    from fleetscope.bench_cli import ProgressBar
    from fleetscope.replay import replay

    interval, seed, speed, autoscale = how
    try:
        report = replay(
            client,
            fleet_spec,
            plan,
            start,
            interval_s=interval,
            seed=seed,
            speed=speed,
            autoscale=autoscale,
            spool_dir=settings.data_dir / "spool" / "replay",
            progress=ProgressBar(),
        )
    except KeyboardInterrupt:
        typer.echo("\ninterrupted: the store holds part of the run", err=True)
        raise typer.Exit(130) from None
    finally:
        client.close()
    phases = ", ".join(f"{name} {at:%H:%M:%S}" for name, at in report.phases.items())
    typer.echo(
        f"wrote {report.scrapes:,} scrapes ({report.samples:,} samples), {report.requests:,} request-log rows "
        f"and {report.scale_events:,} scale events in {report.seconds:.1f}s; phases (UTC): {phases}"
    )


def _check_autoscale(plan: Scenario, fleet_spec: FleetSpec, flag: bool | None) -> None:
    """One line and exit 2 when the run is to autoscale a fleet whose spec cannot (no autoscale
    section, or one that does not fit the fleet once turned on)."""
    from fleet.autoscale.virtual import autoscaled, with_autoscale
    from fleet.errors import FleetError

    try:
        with_autoscale(fleet_spec, autoscaled(fleet_spec, plan.autoscale, flag))
    except FleetError as exc:
        fail(f"{exc} (--no-autoscale plays the fleet at its fixed size)", code=2)


async def _run_scenario(
    plan: Scenario,
    targets: Targets,
    stop: asyncio.Event,
    *,
    speed: float,
    rate_scale: float,
    duration_s: float | None,
    seed: int,
    on_event: Callable[[str, str], None],
    log: IO[str] | None,
) -> LoadStats:
    """``fleet.loadgen.run_scenario`` with progress lines, until it ends or SIGINT/SIGTERM sets ``stop``."""
    from fleet.loadgen import run_scenario

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run_scenario(
            plan,
            targets,
            stop=stop,
            speed=speed,
            rate_scale=rate_scale,
            duration_s=duration_s,
            seed=seed,
            progress=typer.echo,
            on_event=on_event,
            log=log,
        )
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
