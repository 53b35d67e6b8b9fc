"""A scenario played on the simulated fleet in virtual time, stored the way the collector stores
a live fleet.

In:  a ClickHouse client (schema migrated), a fleet spec, a scenario, a start time, the scrape
     interval, a seed, and optionally a progress callback ``(message, fraction)``.
Out: the simulator's expositions parsed by ``collector.exposition`` and converted by
     ``collector.convert`` (series, samples with counter-reset marks, scrapes rows), and the
     gateway request-log records validated by ``collector.requestlog``, and the autoscaler's
     scale events (``scale_events``; a replica it adds is scraped under a target made when it
     first answers, labelled as the pool's template), written through ``collector.writer``;
     returns a ``ReplayReport`` (counts, the window, phase start times).

This is the wiring ``fleetscope fleet simulate`` and the analytics tests use: fleet ->
collector -> storage, with only the clock replaced.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collector.convert import Batch, SeriesConverter
from collector.exposition import SeriesCache, parse
from collector.requestlog import parse_request_log
from collector.scrape import ScrapeResult
from collector.service import REQUEST_COLUMNS
from collector.targets import Target, make_target
from collector.writer import Writer, WriterConfig
from fleet.autoscale.events import ScaleEvent
from fleet.sim.replay import CPU_SPEED, ReplicaScrape, play
from fleet.spec import FleetSpec
from fleet.traffic import Scenario
from storage.clickhouse import Client

__all__ = ["ReplayReport", "replay", "scale_columns"]


@dataclass
class ReplayReport:
    scenario: str
    start: datetime
    end: datetime
    scrapes: int = 0
    samples: int = 0
    requests: int = 0
    scale_events: int = 0
    phases: dict[str, datetime] = field(default_factory=dict)  # phase name -> when it began
    seconds: float = 0.0


def replay(
    client: Client,
    spec: FleetSpec,
    scenario: Scenario,
    start: datetime,
    *,
    interval_s: float = 5.0,
    seed: int = 0,
    speed: float = CPU_SPEED,
    duration_s: float | None = None,
    autoscale: bool | None = None,
    spool_dir: Path | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> ReplayReport:
    """Play ``scenario`` from ``start`` and write what a collector would have written
    (``autoscale``: scale the spec's pools; None: as the scenario, else the spec, says)."""
    began = time.monotonic()
    t0 = start.timestamp()
    total = duration_s if duration_s is not None else scenario.duration_s
    report = ReplayReport(scenario.name, start, datetime.fromtimestamp(t0 + total, UTC))
    report.phases = {name: datetime.fromtimestamp(t0 + at, UTC) for at, name, _mix in scenario.mixes() if at < total}
    with tempfile.TemporaryDirectory(prefix="fleetscope-replay-") as tmp:
        writer = Writer(client, WriterConfig(spool_dir=spool_dir or Path(tmp)))
        converters: dict[str, SeriesConverter] = {}
        caches: dict[str, SeriesCache] = {}
        targets = {}

        def target(scrape: ReplicaScrape) -> Target:
            """The collector's target for a replica (one the autoscaler added: made when first seen)."""
            if scrape.replica not in targets:
                targets[scrape.replica] = make_target(
                    f"{spec.host}:{scrape.port}",
                    job="vllm",
                    interval_s=interval_s,
                    timeout_s=min(interval_s, 10.0),
                    labels=dict(scrape.labels),
                )
            return targets[scrape.replica]

        ticks = play(
            spec,
            scenario,
            t0,
            interval_s=interval_s,
            seed=seed,
            speed=speed,
            duration_s=duration_s,
            autoscale=autoscale,
        )
        for tick in ticks:
            for scrape in tick.scrapes:
                exposition = parse(scrape.text, cache=caches.setdefault(scrape.replica, SeriesCache()))
                batch = Batch()
                converter = converters.setdefault(scrape.replica, SeriesConverter())
                converter.convert(
                    ScrapeResult(target(scrape), tick.ts, True, 0.01, len(exposition), "", exposition), batch
                )
                writer.add_tables(batch.tables)
                report.scrapes += 1
                report.samples += len(exposition)
            if tick.records:
                rows, errors = parse_request_log("\n".join(json.dumps(r) for r in tick.records))
                if errors:  # the simulator writes what the gateway writes: a mismatch is a bug
                    raise ValueError(f"simulated request-log line {errors[0][0]}: {errors[0][1]}")
                columns = {
                    name: [row.get(name, 1.0 if name == "weight" else None) for row in rows] for name in REQUEST_COLUMNS
                }
                writer.add("requests", columns)
                report.requests += len(rows)
            if tick.events:
                writer.add("scale_events", scale_columns(tick.events))
                report.scale_events += len(tick.events)
            if progress is not None:
                progress(f"{tick.phase} {tick.ts - t0:,.0f}s", min(1.0, (tick.ts - t0 + interval_s) / total))
        if not writer.flush():
            raise RuntimeError(f"could not write the replay into the store (spooled under {writer.config.spool_dir})")
    report.seconds = time.monotonic() - began
    return report


def scale_columns(events: list[ScaleEvent]) -> dict[str, list[Any]]:
    """Scale events as the writer's columns for ``scale_events`` (``ts`` in epoch seconds, which the
    writer converts; ``crossed_at`` as a UTC datetime or None)."""
    rows = [e.row() for e in events]
    columns: dict[str, list[Any]] = {name: [row[name] for row in rows] for name in rows[0]}
    columns["crossed_at"] = [None if t is None else datetime.fromtimestamp(t, UTC) for t in columns["crossed_at"]]
    return columns
