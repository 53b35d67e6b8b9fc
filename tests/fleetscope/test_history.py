"""`fleetscope bench seed`: synthetic fleet history from the simulator's model, written into a store."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from analytics.metrics import counter_increase, gauge_summary, histogram_quantile
from analytics.requests import request_totals
from fleetscope.history_calibration import CHAT, LONG, PROFILES, calibrate
from storage.clickhouse import connect
from tests.conftest import in_own_process, run_cli

TTFT = "vllm:time_to_first_token_seconds"


def test_calibration_follows_the_engine_model() -> None:
    chat = calibrate(PROFILES[0], CHAT, minutes=1)
    long = calibrate(PROFILES[0], LONG, minutes=1)
    tokens = [i for i, (m, _) in enumerate(chat.series) if m == "vllm:prompt_tokens_total"][0]
    kv = [i for i, (m, _) in enumerate(chat.series) if m == "vllm:kv_cache_usage_perc"][0]
    # more traffic, more prompt tokens per minute; long prompts fill more of the KV cache
    assert np.all(np.diff(chat.increase[:, tokens]) > 0)
    assert long.gauge[-1, kv] > chat.gauge[-1, kv]
    ttft = [float(np.median(pool["ttft"])) for pool in long.requests]
    assert ttft[-1] > ttft[0]  # a busier engine answers later


@pytest.mark.timeout(300)
def test_seed_writes_a_consistent_history_and_refuses_to_mix(tmp_path: Path) -> None:
    env = {
        "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{tmp_path / 'ch'}",
        "FLEETSCOPE_METADATA_URL": f"sqlite:///{tmp_path / 'm.db'}",
    }
    args = ("bench", "seed", "--replicas", "3", "--days", "1", "--raw-hours", "0.25", "--minute-hours", "2")
    first = run_cli(*args, cwd=tmp_path, env=env, timeout=280)
    assert first.returncode == 0, first.stderr
    assert "wrote 1,296 series of 3 replicas" in first.stdout
    assert "100%" in first.stderr  # the progress bar finished
    again = run_cli(*args, cwd=tmp_path, env=env, timeout=60)
    assert again.returncode == 2 and "already holds" in again.stderr and "--force" in again.stderr

    in_own_process(_check_seeded_store, tmp_path / "ch")


def _check_seeded_store(path: Path) -> None:
    """The checks on the seeded store; run in a process of its own (chDB opens one directory per process)."""
    client = connect(f"chdb:{path}")
    try:
        raw_start = client.query("SELECT min(ts) FROM samples").result_rows[0][0].replace(tzinfo=UTC)
        end = raw_start.replace(minute=0, second=0, microsecond=0)
        window = (end - timedelta(hours=2), end)  # written at 1-minute resolution, hourly too
        by_tier = {
            tier: counter_increase(client, "vllm:generation_tokens_total", *window, by="replica", tier=tier)
            for tier in ("1m", "1h")
        }
        assert by_tier["1m"]["increase"].tolist() == pytest.approx(by_tier["1h"]["increase"].tolist())
        assert (by_tier["1h"]["increase"] > 0).all() and len(by_tier["1h"]) == 3
        p99 = histogram_quantile(client, TTFT, 0.99, end - timedelta(hours=23), end, by="model", tier="1h")
        assert set(p99["model"]) == {p.name for p in PROFILES} and (p99["quantile"] > 0).all()
        kv = gauge_summary(client, "vllm:kv_cache_usage_perc", raw_start, datetime.now(UTC), by="replica", tier="raw")
        assert ((kv["min"] >= 0) & (kv["max"] <= 1)).all()
        # one replica restarted in the raw window: its counters start again from zero there
        assert (
            client.command("SELECT countIf(reset > 0) FROM samples WHERE metric = 'vllm:generation_tokens_total'") == 1
        )
        tenants = request_totals(client, end - timedelta(hours=23), end, by=["tenant"], tier="1h")
        assert len(tenants) >= 4 and (tenants["requests"] > 0).all()
    finally:
        client.close()


@pytest.mark.timeout(300)
def test_a_pinned_story_clock_seeds_the_same_samples_whenever_it_runs(chdb_dir: Path) -> None:
    """The warehouse bench pins the load's daily and weekly cycle (``story_end``): its bytes per
    sample follow the load at the raw samples, and moved 0.735 -> 0.841 B with the hour it ran."""
    from fleetscope.history import seed
    from migrations import clickhouse_runner

    story_end = datetime(2026, 12, 2, 21, 24, tzinfo=UTC)
    values = {}
    for name, end, pinned in (
        ("now", datetime(2026, 12, 6, 8, 24, tzinfo=UTC), story_end),  # a Sunday morning, pinned
        ("then", story_end, None),  # the history that really ended at that Wednesday's 21:24
        ("unpinned", datetime(2026, 12, 6, 8, 24, tzinfo=UTC), None),
    ):
        db = f"t_{uuid.uuid4().hex[:12]}"
        client = connect(f"chdb:{chdb_dir}", database=db, create_database=True)
        try:
            clickhouse_runner.apply(client)
            seed(client, replicas=2, days=0.2, raw_hours=0.1, minute_hours=0.5, end=end, story_end=pinned)
            values[name] = client.query(
                "SELECT groupArray(value) FROM (SELECT value FROM samples "
                "WHERE metric = 'vllm:generation_tokens_total' ORDER BY fingerprint, ts)"
            ).result_rows[0][0]
        finally:
            client.command(f"DROP DATABASE IF EXISTS {db}")
            client.close()
    assert len(values["now"]) > 100
    assert values["now"] == values["then"]  # the same samples, four days apart
    assert values["unpinned"] != values["now"]  # a Sunday morning's load is not that Wednesday evening's
