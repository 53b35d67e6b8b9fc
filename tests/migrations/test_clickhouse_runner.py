"""ClickHouse migration runner on a real chDB store: order, idempotence, checksums, cluster DDL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from migrations import clickhouse_runner as runner
from storage import retention
from storage.errors import ChecksumMismatch, MigrationError


def tables(ch) -> set[str]:
    return {r[0] for r in ch.query("SELECT name FROM system.tables WHERE database = currentDatabase()").result_rows}


def make_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    d = tmp_path / "ch"
    d.mkdir(exist_ok=True)
    for name, body in files.items():
        (d / name).write_text(body)
    return d


def test_shipped_migrations_create_the_schema_once(ch) -> None:
    first = runner.apply(ch)
    assert [m.filename for m in first] == [m.filename for m in runner.discover()]
    assert {"series", "samples", "scrapes", "requests", "fleetscope_migrations"} <= tables(ch)
    assert runner.apply(ch) == []
    rows = ch.query("SELECT count() FROM fleetscope_migrations").result_rows
    assert rows[0][0] == len(first)


def test_files_apply_in_version_order_not_name_order(ch, tmp_path: Path) -> None:
    d = make_dir(
        tmp_path,
        {
            "0010_second.sql": "ALTER TABLE a ADD COLUMN IF NOT EXISTS b UInt8;\n",
            "0002_first.sql": "CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = {{engine:MergeTree}} ORDER BY x;\n",
        },
    )
    applied = runner.apply(ch, directory=d)
    assert [m.version for m in applied] == [2, 10]
    columns = [
        r[0]
        for r in ch.query(
            "SELECT name FROM system.columns WHERE table = 'a' AND database = currentDatabase()"
        ).result_rows
    ]
    assert columns == ["x", "b"]


def test_new_file_is_applied_alone(ch, tmp_path: Path) -> None:
    d = make_dir(tmp_path, {"0001_a.sql": "CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = MergeTree ORDER BY x;"})
    assert len(runner.apply(ch, directory=d)) == 1
    (d / "0002_b.sql").write_text("CREATE TABLE IF NOT EXISTS b (x UInt8) ENGINE = MergeTree ORDER BY x;")
    assert [m.filename for m in runner.apply(ch, directory=d)] == ["0002_b.sql"]
    assert {"a", "b"} <= tables(ch)


def test_edited_applied_file_is_a_checksum_error(ch, tmp_path: Path) -> None:
    d = make_dir(tmp_path, {"0001_a.sql": "CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = MergeTree ORDER BY x;"})
    runner.apply(ch, directory=d)
    (d / "0001_a.sql").write_text("CREATE TABLE IF NOT EXISTS a (x UInt16) ENGINE = MergeTree ORDER BY x;")
    (d / "0002_b.sql").write_text("CREATE TABLE IF NOT EXISTS b (x UInt8) ENGINE = MergeTree ORDER BY x;")
    with pytest.raises(ChecksumMismatch, match="0001_a.sql was changed after it was applied"):
        runner.apply(ch, directory=d)
    assert "b" not in tables(ch)  # nothing after the mismatch was applied


def test_store_newer_than_the_files_is_refused(ch, tmp_path: Path) -> None:
    d = make_dir(
        tmp_path,
        {
            "0001_a.sql": "CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = MergeTree ORDER BY x;",
            "0002_b.sql": "SELECT 1;",
        },
    )
    runner.apply(ch, directory=d)
    (d / "0002_b.sql").unlink()
    with pytest.raises(MigrationError, match="0002_b.sql applied, which this fleetscope does not have"):
        runner.apply(ch, directory=d)


def test_failed_statement_is_reported_and_not_recorded(ch, tmp_path: Path) -> None:
    d = make_dir(
        tmp_path,
        {
            "0001_bad.sql": "CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = MergeTree ORDER BY x;\nCREATE TABLE oops (;\n"
        },
    )
    with pytest.raises(MigrationError, match=r"0001_bad.sql, statement 2"):
        runner.apply(ch, directory=d)
    assert runner.applied(ch) == {}
    # fixed file: the half-applied migration simply runs again (DDL is IF NOT EXISTS)
    (d / "0001_bad.sql").write_text("CREATE TABLE IF NOT EXISTS a (x UInt8) ENGINE = MergeTree ORDER BY x;\n")
    assert len(runner.apply(ch, directory=d)) == 1


def test_bad_file_names_and_duplicate_versions(tmp_path: Path) -> None:
    d = make_dir(tmp_path, {"1_a.sql": "SELECT 1;"})
    with pytest.raises(MigrationError, match="NNNN_description.sql"):
        runner.discover(d)
    shutil.rmtree(d)
    d = make_dir(tmp_path, {"0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 1;"})
    with pytest.raises(MigrationError, match="two migrations have version 0001"):
        runner.discover(d)


def test_single_node_rendering_has_no_cluster_ddl() -> None:
    for migration in runner.discover():
        for statement in runner.render(migration.sql, None):
            assert "ON CLUSTER" not in statement
            assert "Replicated" not in statement and "Distributed" not in statement
            assert "{{" not in statement


def test_cluster_rendering_parses_and_uses_replicated_and_distributed_tables(ch) -> None:
    statements = [s for m in runner.discover() for s in runner.render(m.sql, "prod")]
    creates = [s for s in statements if s.startswith("CREATE TABLE")]
    assert all("ON CLUSTER 'prod'" in s for s in creates)
    local = [s for s in creates if "_local ON CLUSTER" in s]
    # every local table that keeps rows is replicated; the ingest table keeps none (a Null table)
    null = [s for s in local if "ENGINE = Null" in s]
    assert [s.split()[5] for s in null] == ["samples_ingest_local"]
    assert local and all("ENGINE = Replicated" in s for s in local if s not in null)
    distributed = [s for s in creates if "Distributed('prod'" in s]
    assert {s.split()[5] for s in distributed} == {
        "series",
        "samples",
        "samples_ingest",
        "scrapes",
        "requests",
        "samples_1m",
        "samples_1h",
        "requests_1m",
        "requests_1h",
        "alert_events",
        "samples_6h",
        "scale_events",
    }
    # sharded on the series fingerprint / the request id, as DESIGN.md section 6 says
    keys = {s.split()[5]: s.rsplit(",", 1)[1].strip()[:-1] for s in distributed}
    assert keys["samples"] == keys["series"] == keys["samples_1m"] == keys["samples_6h"] == "fingerprint"
    assert keys["requests"] == "cityHash64(request_id)"
    # every DDL statement is distributed to the cluster
    assert all("ON CLUSTER 'prod'" in s for s in statements if s.startswith(("CREATE", "ALTER", "DROP")))
    # the rollup views run on each shard: from its local raw table (the 6-hour one: from its local
    # 1-hour rollup) into its local rollup
    views = [s for s in statements if s.startswith("CREATE MATERIALIZED VIEW")]
    # OTLP exports land on any node and their rows go through the Distributed requests table,
    # sharded like the collector's own inserts
    (otlp,) = [v for v in views if v.startswith("CREATE MATERIALIZED VIEW IF NOT EXISTS otlp_exports_mv")]
    assert " TO requests AS" in otlp
    views.remove(otlp)
    # the ingest table's view stores each shard's samples in its local raw table (0016)
    (ingest,) = [v for v in views if v.startswith("CREATE MATERIALIZED VIEW IF NOT EXISTS samples_ingest_mv")]
    assert " TO samples_local AS" in ingest and "FROM samples_ingest_local" in ingest
    views.remove(ingest)
    # five rollup views, three of them made again by 0011 (with the stored increases) and the
    # 1-minute and 1-hour ones again by 0016 (from the ingest table)
    assert len(views) == 10 and len({v.split(" TO ", 1)[0] for v in views}) == 5
    latest = {v.split(" TO ", 1)[0]: v for v in views}  # the last definition of each
    for view in latest.values():
        target = view.split(" TO ", 1)[1].split()[0]
        assert target.endswith("_local") and target.startswith(("samples_1", "requests_1", "samples_6h"))
        if target == "samples_6h_local":
            source = "samples_1h_local"
        elif target.startswith("samples"):
            source = "samples_ingest_local"
        else:
            source = "requests_local"
        assert f"FROM {source}" in view, view
    ttl = retention.statements(retention.Days(), "prod")
    assert len(ttl) == len(retention.TABLES) and all("_local ON CLUSTER 'prod' MODIFY TTL" in s for s in ttl)
    for statement in statements + ttl:  # real ClickHouse parser; no cluster needed for EXPLAIN AST
        ast = ch.query(f"EXPLAIN AST {statement}").result_rows
        assert ast and ast[0][0].startswith(("CreateQuery", "AlterQuery", "InsertQuery", "TruncateQuery", "DropQuery"))


def test_engine_template_keeps_engine_arguments() -> None:
    (single,) = runner.render("CREATE TABLE t (v UInt8) ENGINE = {{engine:ReplacingMergeTree(v)}} ORDER BY v;")
    assert "ENGINE = ReplacingMergeTree(v)" in single
    (cluster,) = runner.render("CREATE TABLE t (v UInt8) ENGINE = {{engine:ReplacingMergeTree(v)}} ORDER BY v;", "c1")
    assert "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}', v)" in cluster


def test_the_6_hour_rollup_takes_the_history_once_and_then_follows(ch, tmp_path: Path) -> None:
    """0008 on a store with history: the 6-hour rollup gets every hour already rolled up (the
    current one too), a re-run after an interruption does not count it twice, and what is
    written afterwards reaches it through the view."""
    from datetime import UTC, datetime, timedelta

    import pandas as pd

    before = [m for m in runner.discover() if m.version < 8]
    (six,) = [m for m in runner.discover() if m.version == 8]
    d = tmp_path / "m"
    d.mkdir()
    for m in before:
        shutil.copy(m.path, d / m.filename)
    runner.apply(ch, directory=d)
    now = datetime.now(UTC).replace(microsecond=0)
    old = [now - timedelta(days=3), now - timedelta(minutes=2)]  # long ago, and in the current hour

    def write(times: list[datetime], value: float) -> None:
        ch.insert_df(
            "samples",
            pd.DataFrame(
                {
                    "metric": ["m"] * len(times),
                    "fingerprint": [7] * len(times),
                    "ts": times,
                    "value": [value] * len(times),
                }
            ),
        )

    def totals(table: str) -> tuple[int, float]:
        return tuple(ch.query(f"SELECT sum(value_count), sum(value_sum) FROM {table}").result_rows[0])

    write(old, 2.0)
    shutil.copy(six.path, d / six.filename)
    assert [m.filename for m in runner.apply(ch, directory=d)] == [six.filename]
    assert totals("samples_6h") == totals("samples_1h") == (2, 4.0)
    for statement in runner.render(six.sql):  # interrupted after its insert and run again
        ch.command(statement)
    assert totals("samples_6h") == (2, 4.0)
    write([now - timedelta(minutes=1)], 3.0)
    assert totals("samples_6h") == totals("samples_1h") == (3, 7.0)


def test_the_rollups_get_the_increases_of_their_history_once_and_then_follow(ch, tmp_path: Path) -> None:
    """0011 on a store whose rollups were filled before it: every bucket gets the increase the
    queries computed from its first and last values until now (across a marked reset), on the
    1-minute, 1-hour and 6-hour tiers; a re-run after an interruption adds nothing; gauges get
    none; and what is written afterwards with the collector's increases adds up the same way."""
    from datetime import UTC, datetime, timedelta

    import pandas as pd

    from analytics.metrics import counter_increase
    from analytics.timeseries import counter_rate_over_time

    before = [m for m in runner.discover() if m.version < 11]
    (it,) = [m for m in runner.discover() if m.version == 11]
    d = tmp_path / "m"
    d.mkdir()
    for m in before:
        shutil.copy(m.path, d / m.filename)
    runner.apply(ch, directory=d)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)

    def write(rows: list[tuple[str, int, float, float]], **extra: list[float]) -> None:
        ch.insert_df(
            "samples",
            pd.DataFrame(
                {
                    "metric": [m for m, _, _, _ in rows],
                    "fingerprint": [7 if m.endswith("_total") else 8 for m, _, _, _ in rows],
                    "ts": [hour + timedelta(seconds=s) for _, s, _, _ in rows],
                    "value": [v for _, _, v, _ in rows],
                    "reset": [r for _, _, _, r in rows],
                    **extra,
                }
            ),
        )

    c, g = "vllm:prompt_tokens_total", "vllm:num_requests_running"
    ch.insert_df(
        "series",
        pd.DataFrame(
            {
                "fingerprint": [7, 8],
                "metric": [c, g],
                "original_metric": [c, g],
                "labels": [{"replica": "r0"}, {"replica": "r0"}],
                "first_seen": [hour, hour],
                "last_seen": [hour, hour],
            }
        ),
    )
    # minute 0: 10 -> 20; minute 1: 25, then the engine restarts (5, marked); minute 2: 8
    write([(c, 5, 10.0, 0.0), (c, 55, 20.0, 0.0), (c, 70, 25.0, 0.0), (c, 100, 5.0, 25.0), (c, 130, 8.0, 0.0)])
    write([(g, 5, 3.0, 0.0), (g, 130, 1.0, 0.0)])
    shutil.copy(it.path, d / it.filename)
    assert [m.filename for m in runner.apply(ch, directory=d)] == [it.filename]
    window = (hour, hour + timedelta(hours=1))
    per_minute = counter_rate_over_time(ch, c, *window, by="replica", step=60, tier="1m")
    # 20 - 10; 25 - 20, then 5 from zero; 8 - 5
    assert per_minute["increase"].tolist() == [10.0, 10.0, 3.0]
    for tier in ("1m", "1h", "6h"):
        start = hour.replace(hour=hour.hour - hour.hour % 6) if tier == "6h" else hour
        got = counter_increase(ch, c, start, start + timedelta(hours=6), tier=tier)["increase"].tolist()
        assert got == [23.0], tier

    def stored(table: str) -> float:
        return ch.query(f"SELECT sum(increase) FROM {table} WHERE fingerprint = 8").result_rows[0][0]

    assert stored("samples_1m") == stored("samples_1h") == 0.0  # a gauge has no increase
    for statement in runner.render(it.sql):  # interrupted after its inserts and run again
        ch.command(statement)
    assert counter_increase(ch, c, *window, tier="1m")["increase"].tolist() == [23.0]
    assert counter_increase(ch, c, *window, tier="1h")["increase"].tolist() == [23.0]
    # then the collector's samples, with their increases: 8 -> 12 in minute 3
    write([(c, 190, 12.0, 0.0)], increase=[4.0])
    for tier in ("1m", "1h"):
        assert counter_increase(ch, c, *window, tier=tier)["increase"].tolist() == [27.0], tier


def test_the_raw_samples_store_their_fingerprints_in_fewer_bytes_than_the_default_codec(ch) -> None:
    """Migration 0018: the fingerprint of a raw sample, the same hash on every sample of a
    series, compressed with ZSTD instead of the default LZ4 (the warehouse bench: 0.097 -> 0.063
    bytes a sample)."""
    runner.apply(ch)
    rows = (  # 500 series, 400 samples each
        "SELECT 'm' AS metric, cityHash64(number % 500) AS fingerprint, "
        "toDateTime64('2026-12-01', 3) + intDiv(number, 500) * 5 AS ts, number AS value, 0 AS reset, "
        "0 AS increase FROM numbers(200000)"
    )
    ch.command(f"INSERT INTO samples_ingest {rows}")
    ch.command("CREATE TABLE lz4 AS samples")
    ch.command("ALTER TABLE lz4 MODIFY COLUMN fingerprint UInt64 CODEC(LZ4)")
    ch.command("INSERT INTO lz4 SELECT * FROM samples")
    sizes = {}
    for table in ("samples", "lz4"):  # the same rows, the parts differing only in the fingerprint's codec
        ch.command(f"OPTIMIZE TABLE {table} FINAL")
        sizes[table] = ch.command(
            "SELECT sum(data_compressed_bytes) FROM system.parts WHERE database = currentDatabase() "
            f"AND table = '{table}' AND active"
        )
    assert ch.command("SELECT count() FROM samples") == 200000
    assert sizes["samples"] < 0.9 * sizes["lz4"], sizes
