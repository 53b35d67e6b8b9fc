"""Seeded stores for the exporter's tests: scenarios replayed on the simulated fleet
(``tests.analytics.scenario_data.play``) into chDB, and a migrated metadata DB (SQLite) with the
seeded GPU prices and a few SLO targets.

- ``stall``: ``engine-stall`` on fleet.yaml, read as of 7 minutes in (``STALL_AT``): small-1 has
  held its requests without a token since minute 3, tenants and both pools have spent;
- ``drafts``: ``acceptance-collapse`` on fleet-spec-lora.yaml: spec-0 decodes speculatively;
- ``adapters``: ``adapter-thrash`` on fleet-spec-lora.yaml: four LoRA adapters on small-0.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from storage.catalog import SloTarget, set_slo
from tests.analytics.scenario_data import Run, play
from tests.conftest import migrated_sessions

STALL_AT = timedelta(minutes=7)  # engine-stall freezes small-1 at minute 3, resumes it at minute 9
TARGETS = (
    SloTarget("tiny-small", "ttft", 4.0, 0.99),
    SloTarget("tiny-large", "ttft", 6.0, 0.99),
    SloTarget("tiny-small", "e2e", 30.0, 0.95, percentile=0.9),
    SloTarget("tiny-repeat", "itl", 0.2, 0.99),
)


@pytest.fixture(scope="session")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The metadata DB: migrated (GPU prices seeded: cpu-demo at $0.10 an hour) with ``TARGETS``."""
    url = f"sqlite:///{tmp_path_factory.mktemp('exporter-metadata') / 'metadata.db'}"
    for made in migrated_sessions(url):
        for target in TARGETS:
            set_slo(made, target)
        yield made


@pytest.fixture(scope="session")
def stall(chdb_dir: Path) -> Run:
    return play(chdb_dir, "engine-stall", seed=1)


@pytest.fixture(scope="session")
def drafts(chdb_dir: Path) -> Run:
    return play(chdb_dir, "acceptance-collapse", seed=1, spec="fleet-spec-lora.yaml")


@pytest.fixture(scope="session")
def adapters(chdb_dir: Path) -> Run:
    return play(chdb_dir, "adapter-thrash", seed=1, spec="fleet-spec-lora.yaml")


def stall_at(run: Run) -> datetime:
    return run.start + STALL_AT
