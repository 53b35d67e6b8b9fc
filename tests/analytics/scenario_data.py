"""Scenario runs on the simulated fleet, stored the way the collector stores a live fleet, for
the analytics tests (``fleetscope.replay``: sim engines + the gateway's router -> expositions and
request-log records -> collector parser/converter/writer -> chDB)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleet.spec import load_spec
from fleet.traffic import load_scenario
from fleetscope.replay import ReplayReport, replay
from migrations import clickhouse_runner
from storage.clickhouse import connect

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 5.0
PRICES = {"cpu-demo": 0.10}  # the seeded price of the bundled fleet's replicas


@dataclass
class Run:
    client: object
    report: ReplayReport

    @property
    def start(self) -> datetime:
        return self.report.start

    @property
    def end(self) -> datetime:
        return self.report.end

    def phase(self, name: str) -> datetime:
        return self.report.phases[name]


def play(chdb_dir: Path, scenario: str, seed: int = 1, spec: str = "fleet.yaml") -> Run:
    """``scenario`` played on the bundled fleet (``spec``: fleet.yaml) ending 10 minutes ago."""
    client = connect(f"chdb:{chdb_dir}", database=f"t_{uuid.uuid4().hex[:12]}", create_database=True)
    clickhouse_runner.apply(client)
    plan = load_scenario(scenario)
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    start = end - timedelta(seconds=plan.duration_s)
    report = replay(client, load_spec(ROOT / spec), plan, start, interval_s=INTERVAL, seed=seed)
    return Run(client, report)
