"""The collector's scale-event intake (``POST /v1/events``): the autoscaler's JSON lines land in
``scale_events`` in a real chDB store, times and all; bad lines are refused one by one with their
line number and reason while the good ones in the same body are kept."""

from __future__ import annotations

import asyncio
import json
import socket
from datetime import UTC, datetime
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry

from collector.events import mount, parse_scale_events
from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from fleet.autoscale.events import ScaleEvent
from migrations import clickhouse_runner

T0 = 1_795_000_000.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def decision() -> ScaleEvent:
    return ScaleEvent(
        T0, "tiny-small", "scale_out", "d1", "small-1", 1, 2, "requests_waiting", 2.4, 2.0, T0 - 15, detail="waiting"
    )


def test_good_lines_are_kept_and_each_bad_one_says_why() -> None:
    good = decision()
    body = "\n".join(
        [
            json.dumps(good.row()),
            json.dumps(good.step("ready", T0 + 41, detail="healthy").row()),
            "{not json",
            json.dumps({**good.row(), "kind": "exploded"}),
            json.dumps({**good.row(), "colour": "red"}),
            json.dumps({**good.row(), "ts": "2026-12-05T10:03:01Z", "crossed_at": None}),
            json.dumps({k: v for k, v in good.row().items() if k != "pool"}),
            "",
        ]
    )
    columns, errors = parse_scale_events(body)
    assert columns["kind"] == ["scale_out", "ready", "scale_out"]
    assert columns["ts"][2] == datetime(2026, 12, 5, 10, 3, 1, tzinfo=UTC).timestamp()  # ISO 8601 read
    assert columns["crossed_at"] == [datetime.fromtimestamp(T0 - 15, UTC)] * 2 + [None]
    assert [n for n, _ in errors] == [3, 4, 5, 7]
    assert errors[0][1].startswith("not JSON")
    assert "kind" in errors[1][1] and "'exploded' is not one of scale_out" in errors[1][1]
    assert errors[2][1].startswith("colour: Extra inputs")
    assert errors[3][1].startswith("pool: Field required")


def test_events_posted_to_a_collector_land_in_scale_events(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    port = free_port()
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.2))
    collector = Collector(CollectorConfig(http_port=port), writer, CollectorRegistry())
    note = mount(collector)
    out = decision()
    lines = [out.row(), out.step("ready", T0 + 41).row(), out.step("serving", T0 + 43).row()]

    async def go() -> tuple[dict, dict, bool]:
        await collector.start()
        async with httpx.AsyncClient() as client:
            url = f"http://127.0.0.1:{port}/v1/events"
            ok = await client.post(url, content="\n".join(json.dumps(r) for r in lines) + "\n")
            bad = await client.post(url, content="{oops}\n")
        return ok.json(), {"status": bad.status_code, **bad.json()}, await collector.stop()

    ok, bad, flushed = asyncio.run(go())
    assert note.endswith(f":{port}/v1/events") and flushed
    assert ok == {"accepted": 3, "rejected": []}
    assert bad["status"] == 400 and bad["rejected"][0]["line"] == 1
    rows = ch.query(
        "SELECT kind, toUnixTimestamp64Milli(ts), replica, from_replicas, to_replicas, signal, value, "
        "toUnixTimestamp64Milli(crossed_at), decision_id FROM scale_events ORDER BY ts"
    ).result_rows
    assert [r[0] for r in rows] == ["scale_out", "ready", "serving"]
    assert [r[1] for r in rows] == [int(T0 * 1000), int((T0 + 41) * 1000), int((T0 + 43) * 1000)]
    assert rows[0][2:8] == ("small-1", 1, 2, "requests_waiting", 2.4, int((T0 - 15) * 1000))
    assert {r[8] for r in rows} == {"d1"}
