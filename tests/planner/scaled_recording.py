"""An autoscaled scenario recorded into a chDB store, for the planner's backtest of a policy.

In:  a chDB directory, a scenario with ``autoscale: true`` (``scale-ramp``), its fleet spec
     (``fleet-autoscale.yaml``), a seed.
Out: ``Recording``: the client, the window, the phases' start times. The fleet is played by the
     simulator with the fleet's own virtual-time autoscaler (``fleet.sim.replay.play``, which runs
     ``fleet.autoscale.virtual.VirtualScaler``); its expositions go through the collector's parser
     and converter (targets made as replicas appear, as the collector's file_sd does), its request
     log through ``collector.requestlog`` and its scale events through ``collector.events``, all
     written by ``collector.writer``: what ``fleetscope fleet simulate`` stores, with the wiring
     for replicas that come and go done here until ``fleetscope.replay`` does it (then this is
     ``tests.analytics.scenario_data.play(chdb_dir, "scale-ramp", spec="fleet-autoscale.yaml")``).
"""

from __future__ import annotations

import json
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from collector.convert import Batch, SeriesConverter
from collector.events import parse_scale_events
from collector.exposition import SeriesCache, parse
from collector.requestlog import parse_request_log
from collector.scrape import ScrapeResult
from collector.service import REQUEST_COLUMNS
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from fleet.sim.replay import CPU_SPEED, play
from fleet.spec import load_spec
from fleet.traffic import load_scenario
from migrations import clickhouse_runner
from storage.clickhouse import connect

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 5.0


@dataclass
class Recording:
    client: Any
    start: datetime
    end: datetime
    phases: dict[str, datetime]
    events: int  # scale events written


def record(
    chdb_dir: Path, scenario: str = "scale-ramp", spec: str = "fleet-autoscale.yaml", seed: int = 1
) -> Recording:
    client = connect(f"chdb:{chdb_dir}", database=f"t_{uuid.uuid4().hex[:12]}", create_database=True)
    clickhouse_runner.apply(client)
    plan = load_scenario(scenario)
    fleet = load_spec(ROOT / spec)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    start = end - timedelta(seconds=plan.duration_s)
    t0 = start.timestamp()
    phases = {name: datetime.fromtimestamp(t0 + at, UTC) for at, name, _mix in plan.mixes()}
    events = 0
    with tempfile.TemporaryDirectory(prefix="fleetscope-planner-") as tmp:
        writer = Writer(client, WriterConfig(spool_dir=Path(tmp)))
        converters: dict[str, SeriesConverter] = {}
        caches: dict[str, SeriesCache] = {}
        targets: dict[str, Any] = {}
        for tick in play(fleet, plan, t0, interval_s=INTERVAL, seed=seed, speed=CPU_SPEED):
            for scrape in tick.scrapes:
                target = targets.setdefault(
                    scrape.replica,
                    make_target(
                        f"{fleet.host}:{scrape.port}",
                        job="vllm",
                        interval_s=INTERVAL,
                        timeout_s=5.0,
                        labels=scrape.labels,
                    ),
                )
                exposition = parse(scrape.text, cache=caches.setdefault(scrape.replica, SeriesCache()))
                batch = Batch()
                converters.setdefault(scrape.replica, SeriesConverter()).convert(
                    ScrapeResult(target, tick.ts, True, 0.01, len(exposition), "", exposition), batch
                )
                writer.add_tables(batch.tables)
            if tick.records:
                rows, errors = parse_request_log("\n".join(json.dumps(r) for r in tick.records))
                assert not errors, errors[:1]
                writer.add(
                    "requests", {n: [r.get(n, 1.0 if n == "weight" else None) for r in rows] for n in REQUEST_COLUMNS}
                )
            if tick.events:
                columns, errors = parse_scale_events("\n".join(json.dumps(e.row()) for e in tick.events))
                assert not errors, errors[:1]
                writer.add("scale_events", columns)
                events += len(tick.events)
        assert writer.flush()
    return Recording(client, start, end, phases, events)
