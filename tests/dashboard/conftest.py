"""Fixtures of the dashboard tests: a migrated metadata DB (SQLite) and a played tenant-shift run."""

from __future__ import annotations

import pytest

from tests.analytics.scenario_data import play
from tests.conftest import migrated_sessions


@pytest.fixture
def sessions(sqlite_url: str):
    yield from migrated_sessions(sqlite_url)


@pytest.fixture(scope="module")
def shift(chdb_dir):
    return play(chdb_dir, "tenant-shift", seed=1)
