"""``fleetscope bench ...``: write synthetic fleet history into the store, for benchmarks and demos.

In:  settings (ClickHouse URL, cluster) and command-line options (fleet size, days, resolution).
Out: ``fleetscope.history.seed`` run against the configured store (after its schema migrations),
     with a progress bar on stderr and a summary of what was written. A store that already
     holds samples is refused unless ``--force``: seeded history must not mix silently with a
     real fleet's.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from fleetscope.cliutil import ConfigOption, fail, settings_or_exit

if TYPE_CHECKING:
    from fleetscope.history import SeedReport
    from storage.clickhouse import Client

app = typer.Typer(help="Benchmark helpers: synthetic history at fleet scale.", no_args_is_help=True)


class ProgressBar:
    """A one-line bar with ETA on a terminal; a line per 10 % elsewhere (logs, CI)."""

    def __init__(self, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.stream, self.width = stream, width
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.shown = -1

    def __call__(self, message: str, fraction: float) -> None:
        elapsed = time.monotonic() - self.started
        eta = f" ETA {elapsed / fraction - elapsed:4.0f}s" if 0.02 < fraction < 1 else ""
        filled = int(self.width * fraction)
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {fraction:4.0%} {message}{eta}"
        if self.tty:
            self.stream.write(f"\r{line:<100}" + ("\n" if fraction >= 1 else ""))
            self.stream.flush()
        elif int(fraction * 10) > self.shown:
            self.shown = int(fraction * 10)
            self.stream.write(f"{line} ({elapsed:.0f}s)\n")
            self.stream.flush()


@app.command()
def seed(
    config: ConfigOption = None,
    replicas: Annotated[int, typer.Option(min=1, max=5000, help="Simulated engines in the fleet.")] = 200,
    days: Annotated[float, typer.Option(min=0.1, help="Days of history, ending now.")] = 30,
    raw_hours: Annotated[
        float, typer.Option(min=0.05, help="Recent hours written as raw samples (every --interval).")
    ] = 1.0,
    minute_hours: Annotated[
        float, typer.Option(min=0, help="Hours before those written at 1-minute resolution; older history is hourly.")
    ] = 24.0,
    interval: Annotated[float, typer.Option(min=1, help="Scrape interval of the raw samples, seconds.")] = 5.0,
    request_sample_rate: Annotated[
        float, typer.Option(min=0.0001, max=1, help="Share of requests in the request log (rows weigh 1/rate).")
    ] = 0.01,
    seed_value: Annotated[int, typer.Option("--seed", help="Random seed: the same seed writes the same history.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Write even though the store already holds samples.")] = False,
) -> None:
    """Write realistic history of a simulated vLLM fleet straight into the store.

    Every number comes from the simulator's engine model run in virtual time (not random noise): counters,
    histograms and gauges of the vLLM exposition, and a sampled request log with tenants, a long-context rollout and
    a tenant shift.

    Recent hours are raw samples (the materialized views roll them up); older history is written into the 1-minute
    and 1-hour rollups directly, as a store looks once raw rows have expired.

    Example: fleetscope bench seed --replicas 200 --days 30
    """
    from fleetscope.history import seed as write_history
    from fleetscope.stores import migrate_all, open_clickhouse
    from storage.errors import StoreError

    settings = settings_or_exit(config)
    if days * 24 <= raw_hours + minute_hours + 1:
        fail(f"--days {days:g} is too short for --raw-hours {raw_hours:g} + --minute-hours {minute_hours:g}", code=2)
    try:
        migrate_all(settings, metadata=False)
        client = open_clickhouse(settings)
    except StoreError as exc:
        fail(str(exc))
    try:
        if not force:
            _refuse_to_mix(client)
        typer.echo(f"seeding {days:g} days of {replicas} simulated replicas into {settings.clickhouse.url}", err=True)
        # the embedded ClickHouse takes SIGINT for itself when it starts: take Ctrl-C back
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            report = write_history(
                client,
                replicas=replicas,
                days=days,
                raw_hours=raw_hours,
                minute_hours=minute_hours,
                interval_s=interval,
                request_sample_rate=request_sample_rate,
                seed_value=seed_value,
                progress=ProgressBar(),
            )
        except KeyboardInterrupt:
            typer.echo(
                "\ninterrupted: the store holds part of the history; seed a fresh store "
                "(another clickhouse.url) or run again with --force",
                err=True,
            )
            raise typer.Exit(130) from None
    finally:
        client.close()
    typer.echo(_summary(report, interval, request_sample_rate))


def _refuse_to_mix(client: Client) -> None:
    """Exit 2 when the store already holds samples: seeded history would mix with them."""
    rows = int(client.query("SELECT count() FROM samples").result_rows[0][0])
    if rows:
        fail(
            f"the store already holds {rows:,} samples; seeded history would mix with them "
            "(use another clickhouse.url, or --force)",
            code=2,
        )


def _summary(report: SeedReport, interval: float, request_sample_rate: float) -> str:
    """What ``seed`` wrote, a line per table."""
    return (
        f"wrote {report.series:,} series of {report.replicas} replicas from {report.start:%Y-%m-%d %H:%M} to "
        f"{report.end:%Y-%m-%d %H:%M} UTC in {report.seconds:.0f}s:\n"
        f"  raw samples      {report.raw_samples:>14,}  (since {report.raw_start:%Y-%m-%d %H:%M}, every "
        f"{interval:g}s)\n"
        f"  1-minute rows    {report.minute_rows:>14,}  (+ what the raw samples rolled up)\n"
        f"  1-hour rows      {report.hour_rows:>14,}\n"
        f"  request-log rows {report.requests:>14,}  (sampled at {request_sample_rate:g})"
    )
