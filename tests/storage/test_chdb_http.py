"""The embedded store served over ClickHouse's HTTP interface (``storage.chdb_http``): another
process's clickhouse-connect client (``http://``) reads and writes the chDB directory this process
holds, as it would a ClickHouse server, with server-side parameters, settings (``readonly``
enforced), compressed inserts, ClickHouse's errors, and a password."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from storage.chdb_http import ChdbHttpServer
from storage.clickhouse import connect
from storage.errors import StoreUnavailable


@dataclass
class Served:
    server: ChdbHttpServer
    own: Any  # this process's own client on the store
    url: str  # the server's URL, with the test's database


@pytest.fixture(scope="module")
def served(chdb_dir: Path) -> Iterator[Served]:
    """The session's chDB directory (one per process) served, on a database of this module's."""
    database = f"t_http_{uuid.uuid4().hex[:8]}"
    own = connect(f"chdb:{chdb_dir}", database=database, create_database=True)
    own.command(
        "CREATE TABLE IF NOT EXISTS events (ts DateTime64(3, 'UTC'), name String, value Float64) "
        "ENGINE = MergeTree ORDER BY ts"
    )
    server = ChdbHttpServer(chdb_dir).start()
    yield Served(server, own, f"{server.url}/{database}")
    server.stop()
    own.command(f"DROP DATABASE IF EXISTS {database}")
    own.close()


def test_another_process_writes_and_reads_the_store_this_one_holds(served: Served) -> None:
    _server, own = served.server, served.own
    script = f"""
import pandas as pd
from datetime import datetime, UTC
from storage.clickhouse import connect
c = connect({served.url!r})
c.insert("events", [[datetime(2026, 1, 1, tzinfo=UTC), "a", 1.5]], column_names=["ts", "name", "value"])
c.insert_df("events", pd.DataFrame({{"ts": [pd.Timestamp("2026-01-02", tz="UTC")], "name": ["b"], "value": [2.5]}}))
rows = c.query("SELECT name, value FROM events WHERE value > {{v:Float64}} ORDER BY ts", parameters={{"v": 1.0}})
print(rows.result_rows)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, cwd=Path.cwd()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('a', 1.5), ('b', 2.5)]"
    # what the other process wrote is in this process's store
    rows = own.query("SELECT name, value FROM events ORDER BY ts").result_rows
    assert [r for r in rows if r[0] in ("a", "b")] == [("a", 1.5), ("b", 2.5)]


def test_answers_as_a_clickhouse_server(served: Served) -> None:
    server = served.server
    client = connect(served.url)
    assert client.server_version.split(".")[0].isdigit()
    frame = client.query_df("SELECT number AS n, toString(number) AS s FROM numbers(5)")
    assert frame["n"].tolist() == [0, 1, 2, 3, 4] and frame["s"].tolist() == ["0", "1", "2", "3", "4"]
    # parameters too long for the URL go as a form; they are bound all the same
    names = [f"replica-{i}" for i in range(3000)]
    counted = client.query(
        "SELECT count() FROM (SELECT arrayJoin({names:Array(String)}) AS name) WHERE name LIKE 'replica-2%'",
        parameters={"names": names},
    ).result_rows[0][0]
    assert counted == sum(1 for n in names if n.startswith("replica-2"))
    assert client.command("SELECT 40 + 2") == 42
    stamp = client.query("SELECT toDateTime64('2026-12-06 01:02:03', 3, 'UTC')").result_rows[0][0]
    assert stamp == datetime(2026, 12, 6, 1, 2, 3, tzinfo=UTC)
    host, port = server.address
    assert httpx.get(f"http://{host}:{port}/ping").text == "Ok.\n"
    client.close()


def test_bad_queries_get_clickhouses_errors_and_readonly_holds(served: Served) -> None:
    _server, own = served.server, served.own
    client = connect(served.url)
    with pytest.raises(Exception, match=r"Code: 62.*Syntax error"):
        client.query("SELEC 1")
    with pytest.raises(Exception, match=r"Code: 60.*(missing_table|UNKNOWN_TABLE)"):
        client.query("SELECT * FROM missing_table")
    with pytest.raises(Exception, match=r"Code: 164.*readonly"):
        client.command("DROP TABLE events", settings={"readonly": 1})
    assert own.command("EXISTS TABLE events") == 1  # still there
    # a setting holds for its own request only: the next one may write again
    client.command("CREATE TABLE IF NOT EXISTS scratch (x UInt8) ENGINE = Memory")
    client.command("DROP TABLE scratch")
    client.close()


def test_a_wrong_password_is_refused(served: Served) -> None:
    server = served.server
    with pytest.raises(StoreUnavailable, match="516"):
        connect(served.url.replace(server.password, "not-it"))
    answer = httpx.post(f"http://{server.address[0]}:{server.address[1]}/", content=b"SELECT 1")
    assert answer.status_code == 401 and answer.headers["X-ClickHouse-Exception-Code"] == "516"


def test_queries_from_threads_run_at_once(served: Served) -> None:
    """Each request runs on a connection of its own, outside the interpreter's lock: a slow query
    does not hold up a quick one."""
    slow, quick = connect(served.url), connect(served.url)
    finished: dict[str, float] = {}

    def run_slow() -> None:
        slow.query("SELECT sum(sleepEachRow(0.5)) FROM numbers(4) SETTINGS max_block_size = 1")
        finished["slow"] = time.monotonic()

    thread = threading.Thread(target=run_slow)
    thread.start()
    time.sleep(0.3)
    assert quick.query("SELECT 1").result_rows == [(1,)]
    finished["quick"] = time.monotonic()
    thread.join(30)
    assert finished["quick"] < finished["slow"]


def test_an_insert_frame_with_many_rows_arrives_whole(served: Served) -> None:
    _server, own = served.server, served.own
    client = connect(served.url)
    frame = pd.DataFrame(
        {
            "ts": pd.date_range("2025-01-01", periods=50_000, freq="s", tz="UTC"),
            "name": [f"bulk-{i % 7}" for i in range(50_000)],
            "value": [float(i) for i in range(50_000)],
        }
    )
    client.insert_df("events", frame)
    got = own.query("SELECT count(), sum(value) FROM events WHERE name LIKE 'bulk-%'").result_rows[0]
    assert got == (50_000, float(sum(range(50_000))))
    client.close()


def test_ad_hoc_sql_through_the_interface_stays_read_only(served: Served) -> None:
    """The dashboard's SQL page under `up` runs on this interface: its limits ride on each request,
    readonly last, and a query cannot lift them."""
    from adhoc.runner import Limits, ReadOnlyRunner

    runner = ReadOnlyRunner(served.url, limits=Limits(timeout_s=10, max_rows=3))
    result = runner.run("SELECT number FROM numbers(10)")
    assert [row[0] for row in result.rows] == [0, 1, 2] and result.truncated
    with pytest.raises(Exception, match="(?i)readonly|not allowed|refused"):
        runner.run("SELECT * FROM events SETTINGS readonly = 0")
    direct = connect(served.url)
    with pytest.raises(Exception, match="Code: 164"):  # the checks aside, the store itself refuses
        direct.command(
            "INSERT INTO events SELECT now64(3), 'sneaky', 1 SETTINGS readonly = 0",
            settings={"max_result_rows": 4, "readonly": 1},
        )
    assert served.own.command("SELECT count() FROM events WHERE name = 'sneaky'") == 0
