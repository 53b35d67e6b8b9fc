"""ClickHouse client factory: real chDB round trips and clear errors for unreachable stores."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from migrations import clickhouse_runner
from storage.clickhouse import connect, parse_url
from storage.errors import StoreUnavailable


def test_insert_and_query_round_trip_on_the_real_schema(ch) -> None:
    clickhouse_runner.apply(ch)
    ts = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
    ch.insert(
        "samples",
        [["vllm:num_requests_running", 42, ts, 3.0], ["vllm:num_requests_running", 42, ts.replace(second=5), 5.0]],
        column_names=["metric", "fingerprint", "ts", "value"],
    )
    ch.insert_df(
        "series",
        pd.DataFrame(
            {
                "fingerprint": [42],
                "metric": ["vllm:num_requests_running"],
                "labels": [{"instance": "127.0.0.1:8001", "replica": "small-0", "model_name": "tiny-small"}],
            }
        ),
    )
    rows = ch.query(
        """SELECT s.replica, s.model, avg(v.value), max(v.ts)
           FROM samples AS v INNER JOIN series AS s USING (fingerprint)
           GROUP BY s.replica, s.model"""
    ).result_rows
    assert rows == [("small-0", "tiny-small", 4.0, ts.replace(second=5))]


def test_insert_deduplication_token_drops_a_repeated_batch(ch) -> None:
    """The writer's retry path relies on this: the same batch inserted twice lands once."""
    clickhouse_runner.apply(ch)
    batch = pd.DataFrame(
        {
            "ts": [datetime(2026, 11, 29, tzinfo=UTC)] * 2,
            "job": ["vllm"] * 2,
            "instance": ["a", "b"],
            "replica": ["a", "b"],
            "up": [1, 0],
            "duration_seconds": [0.01, 0.5],
            "samples_scraped": [430, 0],
            "error": ["", "timeout"],
        }
    )
    for _ in range(2):
        ch.insert_df("scrapes", batch, settings={"insert_deduplication_token": "batch-1"})
    assert ch.query("SELECT count() FROM scrapes").result_rows[0][0] == 2


def test_parse_url_forms(tmp_path: Path) -> None:
    rel = parse_url("chdb:data/ch", base_dir=tmp_path)
    assert rel.kind == "chdb" and rel.path == tmp_path / "data" / "ch"
    assert parse_url("chdb:///var/lib/fs").path == Path("/var/lib/fs")
    server = parse_url("https://user:secret@ch.example:8443/fleet")
    assert server.kind == "server" and server.database == "fleet"
    assert "secret" not in server.describe()
    with pytest.raises(StoreUnavailable, match="unsupported ClickHouse URL"):
        parse_url("tcp://ch:9000")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_one_clear_error() -> None:
    port = free_port()
    with pytest.raises(StoreUnavailable) as info:
        connect(f"http://default:pw@127.0.0.1:{port}/fleet", connect_timeout_s=2)
    message = str(info.value)
    assert f"cannot reach ClickHouse server http://127.0.0.1:{port}/fleet" in message
    assert "pw" not in message
