"""The ways in: output formats that parse back to the same rows, the HTTP endpoint (token,
refusals, errors), and ``fleetscope sql`` run as a user runs it — against a store it opens
itself, and against a store another process holds (through that process's endpoint)."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from adhoc.formats import render
from tests.conftest import run_cli, stop_loop

QUERY = (
    "SELECT toStartOfMinute(ts) AS minute, model, tenant, count() AS n, round(avg(ttft_seconds), 6) AS ttft, "
    "max(prompt_tokens) AS longest FROM requests WHERE source = 'gateway' GROUP BY minute, model, tenant "
    "ORDER BY minute, model, tenant"
)


@pytest.fixture(scope="module")
def result(incident):
    return incident.runner().run(QUERY)


def test_csv_parses_back_to_the_same_rows(result) -> None:
    back = list(csv.reader(io.StringIO(render(result, "csv").decode())))
    assert back[0] == result.columns and len(back) - 1 == len(result.rows) > 10
    for line, row in zip(back[1:], result.rows, strict=True):
        assert pd.Timestamp(line[0]) == pd.Timestamp(row[0])
        assert line[1:3] == [row[1], row[2]]
        assert int(line[3]) == row[3] and float(line[4]) == pytest.approx(row[4]) and int(line[5]) == row[5]


def test_json_parses_back_to_the_same_rows(result) -> None:
    body = json.loads(render(result, "json"))
    assert [c["name"] for c in body["columns"]] == result.columns
    assert body["row_count"] == len(result.rows) and body["truncated"] is False
    for obj, row in zip(body["rows"], result.rows, strict=True):
        assert pd.Timestamp(obj["minute"]) == pd.Timestamp(row[0])
        assert (obj["model"], obj["tenant"], obj["n"], obj["longest"]) == (row[1], row[2], row[3], row[5])
        assert obj["ttft"] == pytest.approx(row[4])


def test_parquet_opens_with_pandas(result, tmp_path: Path) -> None:
    path = tmp_path / "out.parquet"
    path.write_bytes(render(result, "parquet"))
    frame = pd.read_parquet(path)
    assert list(frame.columns) == result.columns and len(frame) == len(result.rows)
    assert frame["n"].sum() == sum(r[3] for r in result.rows)


def test_values_json_and_arrow_have_no_type_for_become_text_and_repeated_names_stay_apart(
    incident, tmp_path: Path
) -> None:
    odd = incident.runner().run("SELECT toIPv4('10.0.0.1') AS ip, number, number FROM numbers(2)")
    body = json.loads(render(odd, "json"))
    assert [c["name"] for c in body["columns"]] == ["ip", "number", "number_2"]
    assert body["rows"][1] == {"ip": "10.0.0.1", "number": 1, "number_2": 1}
    path = tmp_path / "odd.parquet"
    path.write_bytes(render(odd, "parquet"))
    assert pd.read_parquet(path).to_dict("records") == [
        {"ip": "10.0.0.1", "number": 0, "number_2": 0},
        {"ip": "10.0.0.1", "number": 1, "number_2": 1},
    ]


def test_the_table_says_how_many_rows_and_when_the_limit_cut_it(incident) -> None:
    cut = incident.runner().run("SELECT number FROM numbers(50)", max_rows=7)
    text = render(cut, "table").decode()
    assert text.splitlines()[0].strip() == "number" and "(7 rows" in text and "cut at the row limit" in text


def test_float32_columns_print_as_clickhouse_prints_them_in_every_format(incident) -> None:
    """A Float32 stored 0.016 reads 0.016 (ClickHouse's own text), not its float64 widening; Float64 stays exact."""
    query = (
        "SELECT toFloat32(0.016) AS f32, [toFloat32(0.1), toFloat32(2.5)] AS arr, CAST(NULL, 'Nullable(Float32)') AS "
        "none, toFloat64(0.1) + toFloat64(0.2) AS f64, ttft_seconds FROM requests WHERE ttft_seconds > 0 ORDER BY ts, request_id LIMIT 50"
    )
    got = incident.runner().run(query)
    clickhouse = incident.client.query(
        "SELECT toString(ttft_seconds) FROM requests WHERE ttft_seconds > 0 ORDER BY ts, request_id LIMIT 50"
    ).result_rows
    table = render(got, "table").decode()
    assert "0.016 " in table and "[0.1, 2.5]" in table and "0.0160000" not in table, table
    assert "0.30000000000000004" in table  # a Float64 keeps every digit it has, as ClickHouse prints it
    # stored latencies, each as ClickHouse writes it
    assert [repr(row[4]) for row in got.rows] == [text for (text,) in clickhouse]
    rows = json.loads(render(got, "json"))["rows"]
    assert rows[0]["f32"] == 0.016 and rows[0]["arr"] == [0.1, 2.5] and rows[0]["none"] is None
    assert next(csv.reader(io.StringIO(render(got, "csv").decode().splitlines()[1])))[0] == "0.016"


@pytest.fixture
def serve(incident):
    """Serve the endpoint on a real aiohttp server on a free port: ``serve(token) -> base URL``."""
    import asyncio
    import socket
    import threading

    from aiohttp import web

    from adhoc.endpoint import routes

    started = []

    def start(token: str | None) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        loop = asyncio.new_event_loop()
        app = web.Application()
        routes(app, incident.runner(timeout_s=3), token)
        runner = web.AppRunner(app)

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
            loop.run_forever()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        started.append((loop, runner, thread))
        return url

    yield start
    for loop, runner, thread in started:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        stop_loop(loop, thread, 5)


@pytest.fixture
def endpoint(serve) -> str:
    return serve("t0ken-t0ken-t0ken-t0ken")


def test_without_a_token_only_loopback_json_requests_are_answered(serve) -> None:
    url = serve(None)
    assert httpx.post(f"{url}/api/v1/query", json={"sql": "SELECT 1 AS one"}).json()["rows"] == [[1]]
    # a page elsewhere: DNS rebinding sends its own Host; a form posts text/plain
    rebound = httpx.post(f"{url}/api/v1/query", json={"sql": "SELECT 1"}, headers={"Host": "evil.example:80"})
    assert rebound.status_code == 403
    form = httpx.post(f"{url}/api/v1/query", content=b'{"sql": "SELECT 1"}', headers={"Content-Type": "text/plain"})
    assert form.status_code == 415


def test_beyond_loopback_without_a_token_the_endpoint_is_not_served() -> None:
    from fleetscope.queryapi import mount_endpoint
    from fleetscope.settings import load_settings

    class Collector:
        mounts: list = []

    bare = Collector()
    line = mount_endpoint(load_settings(None, environ={"FLEETSCOPE_COLLECTOR_LISTEN_HOST": "0.0.0.0"}), bare)
    assert bare.mounts == [] and "not served" in line and "FLEETSCOPE_SQL_TOKEN" in line
    guarded = Collector()
    guarded.mounts = []
    env = {"FLEETSCOPE_COLLECTOR_LISTEN_HOST": "0.0.0.0", "FLEETSCOPE_SQL_TOKEN": "x" * 20}
    assert "token required" in mount_endpoint(load_settings(None, environ=env), guarded) and len(guarded.mounts) == 1


def test_the_endpoint_refuses_requests_without_the_token(endpoint: str) -> None:
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-wrong-token"},
        {"Authorization": "t0ken-t0ken-t0ken-t0ken"},
    ):
        answer = httpx.post(f"{endpoint}/api/v1/query", json={"sql": "SELECT 1"}, headers=headers)
        assert answer.status_code == 401 and "token" in answer.json()["error"]
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert httpx.get(f"{endpoint}/api/v1/schema").status_code == 401


def test_the_endpoint_answers_json_and_refuses_what_is_not_read_only(endpoint: str, incident) -> None:
    auth = {"Authorization": "Bearer t0ken-t0ken-t0ken-t0ken"}
    ok = httpx.post(f"{endpoint}/api/v1/query", json={"sql": QUERY, "max_rows": 5}, headers=auth).json()
    direct = incident.runner().run(QUERY, max_rows=5)
    assert [c["name"] for c in ok["columns"]] == direct.columns and ok["row_count"] == 5 and ok["truncated"] is True
    assert [r[1:4] for r in ok["rows"]] == [list(r[1:4]) for r in direct.rows]
    before = incident.snapshot()
    refused = httpx.post(f"{endpoint}/api/v1/query", json={"sql": "DROP TABLE requests"}, headers=auth)
    assert refused.status_code == 400 and refused.json()["error"].startswith("refused: ")
    slow = httpx.post(f"{endpoint}/api/v1/query", json={"sql": "SELECT count() FROM system.numbers"}, headers=auth)
    assert slow.status_code == 422 and "Timeout exceeded" in slow.json()["error"]
    bad = httpx.post(
        f"{endpoint}/api/v1/query", content=b"not json", headers={**auth, "Content-Type": "application/json"}
    )
    assert bad.status_code == 400 and "JSON" in bad.json()["error"]
    assert incident.snapshot() == before
    schema = httpx.get(f"{endpoint}/api/v1/schema", headers=auth).json()
    requests = next(t for t in schema["tables"] if t["name"] == "requests")
    assert {"ttft_seconds", "tenant", "weight"} <= {c["name"] for c in requests["columns"]}


def _config(tmp: Path, port: int, token: str | None = None) -> Path:
    config = tmp / "fleetscope.yaml"
    data = {
        "clickhouse": {"url": f"chdb:{tmp / 'ch'}"},
        "metadata": {"url": f"sqlite:///{tmp / 'm.db'}"},
        "collector": {"otlp_http_port": port, "otlp_grpc_port": 0, "fleet_targets": False},
    }
    if token:
        data["sql"] = {"token": token}
    config.write_text(json.dumps(data))
    return config


def test_the_cli_writes_each_format_and_refuses_with_exit_2(tmp_path: Path) -> None:
    config = _config(tmp_path, 4318)
    assert run_cli("migrate", "--config", str(config), cwd=tmp_path).returncode == 0
    done = run_cli(
        "sql",
        "SELECT number AS n, toString(number) AS s FROM numbers(3)",
        "--format",
        "csv",
        "--config",
        str(config),
        cwd=tmp_path,
    )
    assert done.returncode == 0 and done.stdout.splitlines() == ["n,s", "0,0", "1,1", "2,2"]
    out = tmp_path / "n.parquet"
    done = run_cli(
        "sql",
        "SELECT number AS n FROM numbers(4)",
        "--format",
        "parquet",
        "--output",
        str(out),
        "--config",
        str(config),
        cwd=tmp_path,
    )
    assert done.returncode == 0 and pd.read_parquet(out)["n"].tolist() == [0, 1, 2, 3]
    refused = run_cli("sql", "DROP TABLE samples", "--config", str(config), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.startswith("error: refused: ") and "DROP" in refused.stderr
    failed = run_cli("sql", "SELECT nope FROM samples", "--config", str(config), cwd=tmp_path)
    assert failed.returncode == 1 and "the query failed" in failed.stderr and "nope" in failed.stderr
    listed = run_cli("sql", "--schema", "--format", "csv", "--config", str(config), cwd=tmp_path)
    assert listed.returncode == 0 and "requests,ttft_seconds" in listed.stdout


def test_the_cli_reads_a_store_another_process_holds_through_its_endpoint(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "a-long-enough-token-1234"
    config = _config(tmp_path, port, token)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    exe = Path(sys.executable).parent / "fleetscope"
    holder = subprocess.Popen(
        [str(exe), "collect", "--config", str(config)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
            if holder.poll() is not None:
                raise AssertionError(holder.stdout.read())
        done = run_cli(
            "sql", "SELECT count() AS scrapes FROM scrapes", "--format", "json", "--config", str(config), cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["columns"] == [{"name": "scrapes", "type": "UInt64"}]
        no_token = {**json.loads(config.read_text())}
        no_token.pop("sql")
        other = tmp_path / "no-token.yaml"
        other.write_text(json.dumps(no_token))
        refused = run_cli("sql", "SELECT 1", "--config", str(other), cwd=tmp_path)
        assert refused.returncode == 1 and "held by another process" in refused.stderr and "token" in refused.stderr
    finally:
        os.killpg(holder.pid, signal.SIGTERM)
        holder.wait(30)
