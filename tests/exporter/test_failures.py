"""A failing read never breaks /metrics: a store that cannot be opened, a store that goes away
after a good read, a GPU type without a price. The scrape still answers (parsed, and passed by
promtool), each failed read is counted per figure, the last good values stay with their own
timestamp, and the failure is logged once, not every refresh. Reads run in the background: a
scrape does not wait for one under way."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from datetime import timedelta

import pytest

from exporter.families import FIGURES
from exporter.read import Params, Stores
from exporter.refresh import Refresher
from fleetscope.collect import exporter_stores
from fleetscope.settings import Settings
from migrations import clickhouse_runner
from storage.catalog import delete_gpu_price, gpu_prices
from tests.analytics.scenario_data import play
from tests.conftest import migrated_sessions
from tests.exporter.conftest import STALL_AT
from tests.exporter.exposition import key, of, samples, text
from tests.promtools import binary, free_port

FIGURE_FAMILIES = (
    "fleetscope_model_cost_usd_per_million_tokens",
    "fleetscope_pool_headroom_ratio",
    "fleetscope_prefix_cache_prompt_tokens_ratio",
    "fleetscope_replica_stalled",
)


def promtool_passes(body: str) -> None:
    done = subprocess.run(
        [binary("promtool"), "check", "metrics"], input=body, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fleetscope.exporter" and r.levelno >= logging.WARNING]


def test_a_store_that_cannot_be_opened_leaves_metrics_serving(tmp_path, caplog) -> None:
    settings = Settings.model_validate(
        {
            "clickhouse": {"url": f"http://127.0.0.1:{free_port()}/fleetscope", "connect_timeout_s": 2},
            "metadata": {"url": f"sqlite:///{tmp_path / 'metadata.db'}"},
        }
    )
    refresher = Refresher(exporter_stores(settings), Params())  # what `fleetscope collect` opens
    caplog.set_level(logging.INFO, logger="fleetscope.exporter")
    for _ in range(3):
        failed = refresher.refresh()
        assert set(failed) == set(FIGURES) and "could not be opened" in str(failed["cost"])
    body = text(refresher)
    promtool_passes(body)
    found = samples(body)
    assert of(found, "fleetscope_exporter_refresh_errors_total") == {key(figure=f): 3.0 for f in FIGURES}
    assert of(found, "fleetscope_exporter_refreshes_total") == {key(): 3.0}
    assert of(found, "fleetscope_exporter_figure_timestamp_seconds") == {}  # never read
    assert all(not of(found, name) for name in FIGURE_FAMILIES)
    (said,) = warnings(caplog)  # once, for the three refreshes
    assert "could not read cost (the store could not be opened (StoreUnavailable" in said


def test_a_store_that_goes_away_keeps_the_last_good_values(chdb_dir, sessions, caplog) -> None:
    run = play(chdb_dir, "engine-stall", seed=3)
    first, later = run.start + STALL_AT, run.start + STALL_AT + timedelta(seconds=30)
    clock = iter([first, later, later + timedelta(seconds=30)])
    refresher = Refresher(lambda: Stores(run.client, sessions), Params(), clock=lambda: next(clock))
    caplog.set_level(logging.INFO, logger="fleetscope.exporter")
    assert not refresher.refresh()
    good = samples(text(refresher))
    database = run.client.database
    run.client.command(f"DROP DATABASE {database}")  # the store's data is gone: every query fails
    assert set(refresher.refresh()) == set(FIGURES)
    assert set(refresher.refresh()) == set(FIGURES)
    body = text(refresher)
    promtool_passes(body)
    found = samples(body)
    for name in FIGURE_FAMILIES:
        assert of(found, name) and of(found, name) == of(good, name), name
    assert of(found, "fleetscope_exporter_last_refresh_timestamp_seconds") == {key(): later.timestamp() + 30}
    assert of(found, "fleetscope_exporter_figure_timestamp_seconds") == {
        key(figure=f): first.timestamp() for f in FIGURES
    }
    assert of(found, "fleetscope_exporter_refresh_errors_total") == {key(figure=f): 2.0 for f in FIGURES}
    assert len(warnings(caplog)) == 1


def test_one_figure_failing_leaves_the_others_read(stall, tmp_path, caplog) -> None:
    at = stall.start + STALL_AT
    for unpriced in migrated_sessions(f"sqlite:///{tmp_path / 'metadata.db'}"):
        assert delete_gpu_price(unpriced, "cpu-demo") and "cpu-demo" not in gpu_prices(unpriced)
        refresher = Refresher(lambda s=unpriced: Stores(stall.client, s), Params(), clock=lambda: at)
        caplog.set_level(logging.INFO, logger="fleetscope.exporter")
        failed = refresher.refresh()
    assert set(failed) == {"cost"} and "cpu-demo" in str(failed["cost"])  # a missing price must not read as free
    found = samples(text(refresher))
    assert not of(found, "fleetscope_model_cost_usd_per_million_tokens")
    assert of(found, "fleetscope_pool_headroom_ratio") and of(found, "fleetscope_replica_stalled")
    assert of(found, "fleetscope_exporter_refresh_errors_total")[key(figure="cost")] == 1.0
    assert of(found, "fleetscope_exporter_refresh_errors_total")[key(figure="stalls")] == 0.0
    (said,) = warnings(caplog)
    assert said.startswith("fleetscope's numbers: could not read cost (NoPrice")


def test_a_scrape_does_not_wait_for_a_refresh_under_way(stall) -> None:
    release, reading, closed = threading.Event(), threading.Event(), threading.Event()

    def slow(stores, at, params):
        reading.set()
        release.wait(60)
        return []

    refresher = Refresher(
        lambda: Stores(stall.client, close=closed.set), Params(), interval_s=3600, readers={"cost": slow}
    )
    refresher.start()
    try:
        assert reading.wait(30)
        found = samples(text(refresher))  # answered while the read still waits
        assert not release.is_set() and of(found, "fleetscope_exporter_refreshes_total") == {key(): 0.0}
        release.set()
        deadline = time.monotonic() + 30
        while refresher.snapshot.refreshes < 1:
            assert time.monotonic() < deadline, "the refresh did not finish"
            time.sleep(0.05)
        assert of(samples(text(refresher)), "fleetscope_exporter_refreshes_total") == {key(): 1.0}
    finally:
        release.set()
        refresher.stop()
    assert closed.is_set()  # stop() gives the stores back


def test_a_new_empty_store_reads_without_errors(ch, sessions) -> None:
    """A fleet not scraped yet is no failure: every figure reads, none has a sample."""
    clickhouse_runner.apply(ch)
    refresher = Refresher(lambda: Stores(ch, sessions), Params())
    assert refresher.refresh() == {}
    found = samples(text(refresher))
    assert of(found, "fleetscope_exporter_refresh_errors_total") == {key(figure=f): 0.0 for f in FIGURES}
    assert all(not of(found, name) for name in FIGURE_FAMILIES)
