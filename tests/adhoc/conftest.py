"""A store with a simulated incident for the ad-hoc SQL tests: the long-context rollout held for
15 minutes at three times the shipped rate (so the small replicas' KV caches stay saturated for
more than 10: at the shipped rate their 16 blocks saturate in waves), ending a few minutes ago."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from adhoc.runner import Limits, ReadOnlyRunner
from fleet.spec import load_spec
from fleet.traffic import Scenario, load_scenario
from fleetscope.replay import replay
from migrations import clickhouse_runner
from storage.clickhouse import connect

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Store:
    client: object  # a writing client, for the before/after checks
    url: str
    database: str

    def runner(self, **limits: float) -> ReadOnlyRunner:
        return ReadOnlyRunner(self.url, database=self.database, limits=Limits(**limits))

    def snapshot(self) -> dict[str, int]:
        """Every table of the store and its row count: what a hostile query must leave alone."""
        tables = self.client.query(
            "SELECT name, engine FROM system.tables WHERE database = currentDatabase()"
        ).result_rows
        return {
            name: (int(self.client.command(f"SELECT count() FROM `{name}`")) if not engine.endswith("View") else -1)
            for name, engine in sorted(tables)
        }  # views: listed (a new one would show), not counted


@pytest.fixture(scope="session")
def incident(chdb_dir: Path) -> Store:
    database = f"t_{uuid.uuid4().hex[:12]}"
    client = connect(f"chdb:{chdb_dir}", database=database, create_database=True)
    clickhouse_runner.apply(client)
    data = load_scenario("long-context-rollout").model_dump()
    data["duration_s"] = 1500.0
    for phase in data["phases"]:
        if phase["name"] == "rollback":
            phase["at_s"] = 1080.0
        if phase["name"] == "rollout":
            phase["set"]["rate"] = 6
    plan = Scenario.model_validate(data)
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(seconds=1500 + 300)
    replay(client, load_spec(ROOT / "fleet.yaml"), plan, start, interval_s=5.0, seed=3)
    return Store(client, f"chdb:{chdb_dir}", database)
