"""``fleetscope alerts ...``: check and test rule files, run the evaluator, list alerts, silences.

In:  settings (``alerts``, ``clickhouse``, ``metadata``) and command-line arguments.
Out: ``check`` validates rule files (exit 2 with ``FILE:LINE: key: problem``); ``test`` runs
     promtool-style rule tests on a throwaway chDB store (exit 1 when a case fails); ``run``
     evaluates the configured rules on their intervals and delivers notifications until
     Ctrl-C; ``list`` shows the current states; ``silence add|list|expire`` manage silences;
     ``outbox`` shows the notification log; ``sink`` receives webhooks and prints them.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from fleetscope.cliutil import ConfigOption, fail, sessions_or_exit, settings_or_exit

app = typer.Typer(help="Alert rules, the evaluator, silences and notifications.", no_args_is_help=True)
silence_app = typer.Typer(help="Mute notifications of matching alerts for a while.", no_args_is_help=True)
app.add_typer(silence_app, name="silence")


def _until_stopped() -> None:
    """Block until Ctrl-C or SIGTERM."""
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass


@app.command()
def check(
    files: Annotated[
        list[Path] | None, typer.Argument(help="Rule files (default: the configured ones and the built-in pack).")
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Validate rule files: YAML, keys, durations, expressions and templates. Exit 2 on the first problem."""
    from alerts.config import rule_groups
    from alerts.rules import load_rules, merge
    from common.yamlfile import YamlConfigError

    try:
        groups = merge([load_rules(f) for f in files]) if files else rule_groups(settings_or_exit(config).alerts)
    except YamlConfigError as exc:
        fail(str(exc), code=2)
    rules = sum(len(g.rules) for g in groups)
    names = [r.name for g in groups for r in g.rules]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        fail(f"rule {dup[0]!r} is defined in more than one group: rule names must be unique", code=2)
    typer.echo(f"ok: {len(groups)} group(s), {rules} rule(s)")


@app.command("test")
def test_rules(
    files: Annotated[list[Path], typer.Argument(help="Rule test files (promtool style; see docs/alerts.md).")],
) -> None:
    """Run rule unit tests against a throwaway chDB store. Exit 1 when a case fails.

    Example: fleetscope alerts test alerts/packs/builtin_test.yaml
    """
    import tempfile
    import uuid

    from common.yamlfile import YamlConfigError
    from fleetscope.ruletest import run_tests
    from migrations import clickhouse_runner
    from storage.clickhouse import Client, connect

    failed = 0
    with tempfile.TemporaryDirectory(prefix="fleetscope-ruletest-") as tmp:

        def store() -> Client:  # a fresh database per case in one throwaway chDB directory
            client = connect(f"chdb:{tmp}/clickhouse", database=f"t_{uuid.uuid4().hex[:12]}", create_database=True)
            clickhouse_runner.apply(client)
            return client

        for path in files:
            began = time.monotonic()
            try:
                results = run_tests(path, store)
            except YamlConfigError as exc:
                fail(str(exc), code=2)
            for r in results:
                typer.echo(f"{'PASS' if r.ok else 'FAIL'}  {path}: {r.name}")
                for line in r.failures:
                    typer.echo(f"      {line}")
            bad = sum(not r.ok for r in results)
            failed += bad
            typer.echo(f"{path}: {len(results) - bad} passed, {bad} failed ({time.monotonic() - began:.1f} s)")
    if failed:
        raise typer.Exit(1)


@app.command()
def run(
    config: ConfigOption = None,
    once: Annotated[bool, typer.Option("--once", help="Evaluate every group once, print the result and exit.")] = False,
) -> None:
    """Run the evaluator alone: evaluate the rules on their intervals and deliver notifications (Ctrl-C stops).

    With the embedded store (chDB) no other fleetscope process may hold it. Only one evaluator works at a time (the
    `alerts` lease in the metadata DB); others stand by.
    """
    import logging

    from alerts.config import rule_groups
    from alerts.evaluator import Evaluator
    from alerts.reading import Context
    from common.yamlfile import YamlConfigError
    from fleetscope.stores import migrate_all, open_clickhouse
    from storage.errors import StoreError

    settings = settings_or_exit(config)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.log_level != "DEBUG":  # not a line per job run: the evaluator logs the state changes itself
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        groups = rule_groups(settings.alerts)
    except YamlConfigError as exc:
        fail(str(exc), code=2)
    try:
        migrate_all(settings)
        client = open_clickhouse(settings)
    except StoreError as exc:
        fail(str(exc))
    sessions = sessions_or_exit(settings)
    weights = settings.cost.weights()
    try:
        evaluator = Evaluator(groups, Context(client, sessions, weights), sessions, settings.alerts)
    except ValueError as exc:
        fail(str(exc), code=2)
    rules = sum(len(g.rules) for g in groups)
    receivers = ", ".join(f"{r.name} ({r.type})" for r in settings.alerts.receivers)
    typer.echo(
        f"{len(groups)} group(s), {rules} rule(s); notifications to "
        + (receivers or "nobody: no receivers configured (alerts.receivers), states and history are still kept"),
        err=True,
    )
    if once:
        from storage.leases import holder_of, release

        if not evaluator.holding():
            fail(
                f"another evaluator holds the alerts lease ({holder_of(sessions.kw['bind'], 'alerts')}): "
                "--once would race it; its results are on the dashboard's Alerts page and in `fleetscope alerts list`"
            )
        try:
            for report in evaluator.evaluate_all():
                typer.echo(
                    f"{report.group:<20} {report.rules} rules  {report.firing} firing  {report.pending} pending  "
                    f"{len(report.errors)} errors  {report.seconds * 1000:.0f} ms"
                )
                for rule, error in report.errors.items():
                    typer.echo(f"  {rule}: {error}")
            if settings.alerts.receivers:
                from alerts.delivery import Deliverer

                with Deliverer(sessions, {r.name: r for r in settings.alerts.receivers}) as deliverer:
                    sent = deliverer.run_once()
                typer.echo(f"notifications: {sent.delivered} delivered, {sent.retrying} to retry, {sent.failed} failed")
        finally:
            release(sessions.kw["bind"], "alerts", evaluator.holder)
        return
    evaluator.start()
    typer.echo("evaluator running; Ctrl-C stops it", err=True)
    try:
        _until_stopped()
    finally:
        evaluator.stop()
        client.close()
    typer.echo("evaluator stopped", err=True)


@app.command("list")
def list_alerts(config: ConfigOption = None) -> None:
    """Show every pending, firing and recently resolved alert."""
    from alerts.store import load_states

    states = load_states(sessions_or_exit(settings_or_exit(config)))
    rows = [(inst.state, rule, inst) for rule, instances in states.items() for inst in instances.values()]
    if not rows:
        typer.echo("no alerts pending or firing")
        return
    order = {"firing": 0, "pending": 1, "resolved": 2}
    for state, rule, inst in sorted(rows, key=lambda r: (order[r[0]], r[1])):
        since = inst.fired_at if state == "firing" else inst.resolved_at if state == "resolved" else inst.active_at
        labels = ",".join(f"{k}={v}" for k, v in sorted(inst.labels.items()) if k != "alertname")
        value = "" if inst.value is None else f" value={inst.value:.4g}"
        typer.echo(f"{state:<9} {rule:<22} since {since:%Y-%m-%d %H:%M:%S} UTC  {labels}{value}")


@silence_app.command("add")
def silence_add(
    matchers: Annotated[
        list[str], typer.Argument(help="Matchers, e.g. alertname=KVCacheSaturated 'replica=~\"r-1.*\"'.")
    ],
    comment: Annotated[str, typer.Option("--comment", "-m", help="Why (shown with the silence).")],
    author: Annotated[str, typer.Option(help="Who silences.")] = "",
    duration: Annotated[str, typer.Option(help="How long, from now (or from --start): 30m, 2h, 1d.")] = "2h",
    start: Annotated[str | None, typer.Option(help="Start time (ISO 8601, UTC), default now.")] = None,
    config: ConfigOption = None,
) -> None:
    """Silence the alerts that match every matcher.

    Example: fleetscope alerts silence add replica=r1 -m "draining r1 for maintenance"
    """
    import getpass

    from alerts.model import parse_matchers
    from alerts.store import add_silence
    from common.durations import parse_duration

    try:
        parsed = [m for text in matchers for m in parse_matchers(text)]
        begins = datetime.fromisoformat(start).replace(tzinfo=UTC) if start else datetime.now(UTC)
        ends = begins + timedelta(seconds=parse_duration(duration))
        silence_id = add_silence(
            sessions_or_exit(settings_or_exit(config)), parsed, begins, ends, author or getpass.getuser(), comment
        )
    except ValueError as exc:
        fail(str(exc), code=2)
    typer.echo(f"silence #{silence_id}: {', '.join(map(str, parsed))} until {ends:%Y-%m-%d %H:%M} UTC")


@silence_app.command("list")
def silence_list(
    all_: Annotated[bool, typer.Option("--all", help="Also the expired ones.")] = False,
    config: ConfigOption = None,
) -> None:
    """Show the active silences (or all)."""
    from alerts.store import silences

    now = datetime.now(UTC)
    rows = silences(sessions_or_exit(settings_or_exit(config)), active_at=None if all_ else now)
    if not rows:
        typer.echo("no silences" if all_ else "no active silences")
    for s in rows:
        state = "active" if s.active(now) else "expired" if s.ends_at <= now else "pending"
        typer.echo(
            f"#{s.id:<4} {state:<8} until {s.ends_at:%Y-%m-%d %H:%M} UTC  {', '.join(map(str, s.matchers))}  "
            f"({s.created_by}: {s.comment})"
        )


@silence_app.command("expire")
def silence_expire(
    silence_id: Annotated[int, typer.Argument(help="The silence's number.")], config: ConfigOption = None
) -> None:
    """End a silence now."""
    from alerts.store import expire_silence

    if not expire_silence(sessions_or_exit(settings_or_exit(config)), silence_id):
        fail(f"no active silence #{silence_id}", code=2)
    typer.echo(f"silence #{silence_id} expired")


@app.command()
def outbox(
    limit: Annotated[int, typer.Option(min=1, help="How many, newest first.")] = 20,
    config: ConfigOption = None,
) -> None:
    """Show the notification log: what was sent to which receiver, and what is still being retried."""
    from alerts import outbox as box

    sessions = sessions_or_exit(settings_or_exit(config))
    counts = box.counts(sessions)
    typer.echo(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no notifications yet")
    for row in box.log(sessions, limit=limit):
        when = row.delivered_at or row.next_attempt_at
        status = f"HTTP {row.last_status}" if row.last_status else ""
        error = f"  {row.last_error}" if row.last_error and row.status != "delivered" else ""
        typer.echo(
            f"{row.created_at:%Y-%m-%d %H:%M:%S}  {row.status:<9} {row.receiver:<16} attempts {row.attempts}  "
            f"{status} {when:%H:%M:%S}{error}"
        )


@app.command()
def sink(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: a free one).")] = 9095,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    record: Annotated[
        Path | None, typer.Option(help="Also append every body received to this file (JSON lines).")
    ] = None,
) -> None:
    """Receive webhooks and print them: a local end of the alert path, to see what a receiver gets (Ctrl-C stops).

    Point a receiver at it in fleetscope.yaml: `alerts.receivers: [{name: sink, type: webhook, url: http://127.0.0.1:9095/}]`.
    Alertmanager v4 messages print a line per alert (status, name, labels, summary, Investigate link); Slack and
    PagerDuty bodies their text; any other JSON as it came.
    """

    from alerts.sink import Sink

    try:
        server = Sink(host, port, out=typer.echo, record=record).start()
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    typer.echo(
        f"webhook sink on {server.url}; receiver config: {{name: sink, type: webhook, url: {server.url}}}. "
        "Ctrl-C stops it",
        err=True,
    )
    try:
        _until_stopped()
    finally:
        server.stop()
    typer.echo(f"sink stopped: {len(server.received)} message(s) received", err=True)
