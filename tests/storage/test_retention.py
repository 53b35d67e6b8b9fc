"""Retention: per-tier TTLs from the config, applied by `fleetscope migrate`, dropping whole parts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from migrations import clickhouse_runner
from storage import retention
from tests.conftest import run_cli


def create_query(client, table: str) -> str:
    return client.command(
        f"SELECT create_table_query FROM system.tables WHERE database = currentDatabase() AND name = '{table}'"
    )


def test_ttls_follow_the_config_and_only_change_what_differs(ch) -> None:
    clickhouse_runner.apply(ch)
    changed = retention.apply(ch, retention.Days(raw=7, requests=30, minute=90, hour=730))
    assert sorted(changed) == sorted(retention.TABLES)
    assert "TTL toDateTime(ts) + toIntervalDay(7)" in create_query(ch, "samples")
    assert "TTL ts + toIntervalDay(90)" in create_query(ch, "samples_1m")
    assert "TTL ts + toIntervalDay(730)" in create_query(ch, "requests_1h")
    for table in retention.TABLES:  # expired data leaves as whole parts, never by rewriting them
        assert "ttl_only_drop_parts = 1" in create_query(ch, table), table
    assert retention.apply(ch, retention.Days(raw=7, requests=30, minute=90, hour=730)) == []
    assert retention.apply(ch, retention.Days(raw=3, requests=30, minute=0, hour=730)) == [
        "samples",
        "scrapes",
        "samples_1m",
        "requests_1m",
    ]
    assert "toIntervalDay(3)" in create_query(ch, "scrapes")
    assert "TTL" not in create_query(ch, "samples_1m")  # 0 keeps forever


def test_expired_raw_days_are_dropped_while_the_rollups_keep_them(ch) -> None:
    clickhouse_runner.apply(ch)
    now = datetime.now(UTC).replace(microsecond=0)
    old = now.replace(second=0) - timedelta(days=10)  # both old samples in one minute
    ch.insert_df(
        "samples_ingest",  # where the collector inserts: stored in samples and rolled up (migration 0016)
        pd.DataFrame(
            {
                "metric": ["vllm:prompt_tokens_total"] * 4,
                "fingerprint": [1, 1, 1, 1],
                "ts": [old, old + timedelta(seconds=5), now - timedelta(seconds=5), now],
                "value": [10.0, 15.0, 100.0, 130.0],
                "reset": [0.0, 0.0, 0.0, 0.0],
            }
        ),
    )
    retention.apply(ch, retention.Days(raw=7, minute=90, hour=730))
    ch.command("OPTIMIZE TABLE samples FINAL")
    ch.command("OPTIMIZE TABLE samples_1m FINAL")
    assert ch.command("SELECT count() FROM samples") == 2  # the day ten days ago is gone
    assert ch.command("SELECT count() FROM samples_1m WHERE ts < now() - INTERVAL 7 DAY") == 1
    assert ch.command("SELECT max(value_last).2 FROM samples_1m WHERE ts < now() - INTERVAL 7 DAY") == 15


def test_negative_days_are_refused() -> None:
    with pytest.raises(ValueError, match="raw must be >= 0 days"):
        retention.statements(retention.Days(raw=-1))


def test_migrate_applies_the_configured_retention(tmp_path: Path) -> None:
    env = {"FLEETSCOPE_CLICKHOUSE_RETENTION_RAW_DAYS": "3"}
    first = run_cli("migrate", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert "set the retention of samples" in first.stdout
    second = run_cli("migrate", cwd=tmp_path, env=env)
    assert "nothing to apply" in second.stdout
    third = run_cli("migrate", cwd=tmp_path, env={"FLEETSCOPE_CLICKHOUSE_RETENTION_RAW_DAYS": "5"})
    assert "set the retention of samples" in third.stdout and "set the retention of samples_1m" not in third.stdout
    bad = run_cli("migrate", cwd=tmp_path, env={"FLEETSCOPE_CLICKHOUSE_RETENTION_HOUR_DAYS": "2"})
    assert bad.returncode == 2
    assert "hour_days (2) is shorter than minute_days (90 days)" in bad.stderr


def test_keeping_forever_is_the_longest_retention() -> None:
    from fleetscope.settings import RetentionSettings

    with pytest.raises(ValueError, match=r"hour_days \(30\) is shorter than minute_days \(forever \(0\)\)"):
        RetentionSettings(minute_days=0, hour_days=30)
    with pytest.raises(ValueError, match=r"minute_days \(5\) is shorter than raw_days \(forever"):
        RetentionSettings(raw_days=0, minute_days=5)
    assert RetentionSettings(raw_days=0, minute_days=0, hour_days=0).days() == retention.Days(0, 30, 0, 0)
