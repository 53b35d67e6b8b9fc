"""OTLP bodies decoded by ClickHouse give exactly the rows the Python decoder gives.

Random exports with every attribute value type (string, int, double, bool, array, kvlist,
bytes, empty), repeated keys, missing attributes, the replica's fallbacks, error statuses,
other spans and nanosecond start times go through both paths into the same chDB store; the
stored rows are compared whole. The same exports as OTLP/JSON give the same rows too. Then the
collector: a protobuf body lands through the native path (rollups included), a bad one is
refused before anything is queued, a spooled batch replayed after a crash is not counted twice,
and a store without the landing table gets the Python path.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from pathlib import Path

import httpx
import pandas as pd
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
from prometheus_client import CollectorRegistry

from collector import otlp_native
from collector.otlp import decode_json, request_columns, request_row
from collector.service import REQUEST_COLUMNS, Collector, CollectorConfig
from collector.writer import Writer, WriterConfig, _frame
from migrations import clickhouse_runner
from tests.integration.conftest import free_port

KEYS = [
    "gen_ai.request.id",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
    "gen_ai.request.max_tokens",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.e2e",
    "gen_ai.latency.time_in_queue",
    "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.response.model",
    "something.else",
]
RESOURCE_KEYS = ["fleetscope.replica", "service.instance.id", "service.name", "fleetscope.model", "host.name"]


def value(rng: random.Random, kind: str) -> AnyValue:
    if kind == "s":
        return AnyValue(string_value=rng.choice(["x", "", "cmpl-1", "17", "tiny-small"]))
    if kind == "i":  # within UInt32: the token columns' range on both paths
        return AnyValue(int_value=rng.choice([0, 1, 2, 65, 1200, 4_000_000_000]))
    if kind == "d":
        return AnyValue(double_value=rng.choice([0.0, 0.25, 1e-9, 3.7, 120.5, 2.0]))
    if kind == "b":
        return AnyValue(bool_value=rng.random() < 0.5)
    if kind == "a":
        return AnyValue(array_value=ArrayValue(values=[AnyValue(int_value=3), AnyValue(string_value="y")]))
    if kind == "k":
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="q", value=AnyValue(int_value=1))]))
    if kind == "y":
        return AnyValue(bytes_value=b"\x00\x01")
    return AnyValue()


def random_exports(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)

    def span() -> Span:
        attributes = [
            KeyValue(key=rng.choice(KEYS), value=value(rng, rng.choice("sidbakyn"))) for _ in range(rng.randint(0, 14))
        ]
        return Span(
            name=rng.choice(["llm_request"] * 4 + ["Executor init"]),
            trace_id=rng.randbytes(16),
            span_id=rng.randbytes(8),
            start_time_unix_nano=rng.randint(1_795_000_000 * 10**9, 1_795_200_000 * 10**9),
            end_time_unix_nano=1_795_300_000 * 10**9,
            status=Status(code=rng.choice([0, 1, 2])),
            attributes=attributes,
        )

    bodies = []
    for _ in range(count):
        resource_spans = []
        for _ in range(rng.randint(1, 3)):
            resource = [
                KeyValue(key=rng.choice(RESOURCE_KEYS), value=value(rng, rng.choice("sidn")))
                for _ in range(rng.randint(0, 5))
            ]
            scopes = [ScopeSpans(spans=[span() for _ in range(rng.randint(0, 6))]) for _ in range(rng.randint(0, 2))]
            resource_spans.append(ResourceSpans(resource={"attributes": resource}, scope_spans=scopes))
        bodies.append(ExportTraceServiceRequest(resource_spans=resource_spans).SerializeToString())
    return bodies


def otlp_json(body: bytes) -> bytes:
    """The export as OTLP/JSON: protobuf's JSON mapping with OTLP's rules: ids in hex, enums as integers."""
    data = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body), use_integers_for_enums=True)
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(data).encode()


def stored(client, table: str) -> pd.DataFrame:
    return client.query_df(f"SELECT * FROM {table} ORDER BY trace_id, ts, request_id")


def insert_python_rows(client, table: str, rows: dict[str, list]) -> None:
    rows["weight"] = [1.0] * len(rows["ts"])
    client.insert_df(table, _frame({name: rows[name] for name in REQUEST_COLUMNS}))


def test_clickhouse_decodes_every_attribute_type_into_the_rows_the_python_path_gives(ch) -> None:
    clickhouse_runner.apply(ch)
    ch.command("CREATE TABLE py_requests AS requests")
    ch.command("CREATE TABLE json_requests AS requests")
    bodies = random_exports(seed=5, count=80)
    ch.raw_insert(
        otlp_native.TABLE,
        None,
        insert_block=b"".join(otlp_native.framed(b) for b in bodies),
        fmt=otlp_native.FORMAT,
        settings=otlp_native.settings_for(ch),
    )
    python: dict[str, list] = {name: [] for name in REQUEST_COLUMNS}
    from_json: dict[str, list] = {name: [] for name in REQUEST_COLUMNS}
    llm = other = 0
    for body in bodies:
        columns, skipped = request_columns(body)
        counted = otlp_native.check(body)
        assert counted == (len(columns["ts"]), skipped)
        llm, other = llm + counted[0], other + counted[1]
        for name in columns:
            python[name] += columns[name]
        # the same export as OTLP/JSON (hex ids, string-encoded 64-bit integers)
        as_json = otlp_json(body)
        rows = [row for row in map(request_row, decode_json(as_json)) if row is not None]
        for row in rows:
            for name in columns:
                from_json[name].append(row[name])
    assert llm > 150 and other > 20  # the draw covers both kinds of span
    insert_python_rows(ch, "py_requests", python)
    insert_python_rows(ch, "json_requests", from_json)
    native = stored(ch, "requests")
    assert len(native) == llm
    pd.testing.assert_frame_equal(native, stored(ch, "py_requests"))
    pd.testing.assert_frame_equal(native, stored(ch, "json_requests"))
    # the rollup views fed by the flattening view saw every row
    assert ch.command("SELECT sum(rows) FROM requests_1m") == llm


def test_a_body_that_is_not_an_export_is_refused_before_anything_is_queued() -> None:
    for body in (b"\x00garbage", b"\x0a\xff\xff\xff\xff\x0f"):
        try:
            otlp_native.check(body)
        except ValueError as exc:
            assert "not an OTLP protobuf ExportTraceServiceRequest" in str(exc)
        else:
            raise AssertionError(f"{body!r} was accepted")
    assert otlp_native.check(b"") == (0, 0)  # an empty export is a valid one


def _len_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (payloads under 128 bytes)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_the_check_reads_down_to_each_span_and_leaves_attributes_to_clickhouse() -> None:
    # a span whose own field runs past its end: refused, as a truncated body is
    broken_span = _len_field(1, _len_field(2, _len_field(2, b"\x0a\x05ab")))
    with pytest.raises(
        ValueError, match=r"not an OTLP protobuf ExportTraceServiceRequest: .*ExportTraceServiceRequest"
    ):
        otlp_native.check(broken_span)
    valid = random_exports(seed=3, count=1)[0]
    with pytest.raises(ValueError, match="not an OTLP protobuf"):
        otlp_native.check(valid[: len(valid) // 2])
    # an attribute broken inside passes the check: ClickHouse decodes attributes (see the next test)
    assert otlp_native.check(_attribute_broken(valid)) == otlp_native.check(valid)


def _attribute_broken(body: bytes) -> bytes:
    """``body`` with its first span's first attribute replaced by a KeyValue whose key runs past its end."""
    export = ExportTraceServiceRequest()
    export.ParseFromString(body)
    span = export.resource_spans[0].scope_spans[0].spans[0]
    mark = "fleetscope-broken-attribute"
    span.attributes[0].key = mark
    raw = export.SerializeToString()
    good = _len_field(1, mark.encode())
    at = raw.index(good)
    return raw[:at] + b"\x0a" + bytes([len(mark) + 40]) + raw[at + 2 :]


def test_a_body_clickhouse_cannot_decode_is_set_aside_alone(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    bodies = random_exports(seed=11, count=6)
    expected = sum(otlp_native.check(b)[0] for b in bodies[1:])
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", max_attempts=1), registry=CollectorRegistry())
    settings = otlp_native.settings_for(ch)
    for body in (_attribute_broken(bodies[0]), *bodies[1:]):
        llm = otlp_native.check(body)[0]
        writer.add_raw(otlp_native.TABLE, (otlp_native.prefix(body), body), llm, otlp_native.FORMAT, settings)
    writer.spool_due(force=True)
    for _ in range(10):  # refused whole, then split by body: the broken one set aside, the rest inserted
        if writer.flush():
            break
    assert ch.command("SELECT count() FROM requests") == expected
    assert len(list((tmp_path / "spool" / "rejected").iterdir())) == 1
    assert writer.metrics.rejected.labels(otlp_native.TABLE)._value.get() == otlp_native.check(bodies[0])[0]


def post_all(port: int, bodies: list[bytes]) -> list[int]:
    async def go() -> list[int]:
        async with httpx.AsyncClient() as client:
            return [
                (
                    await client.post(
                        f"http://127.0.0.1:{port}/v1/traces",
                        content=body,
                        headers={"Content-Type": "application/x-protobuf"},
                    )
                ).status_code
                for body in bodies
            ]

    return asyncio.run(go())


def run_collector(ch, tmp_path: Path, bodies: list[bytes], **config) -> tuple[Collector, list[int]]:
    port = free_port()
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.2))
    collector = Collector(CollectorConfig(http_port=port, grpc_port=0, **config), writer, CollectorRegistry())

    async def go() -> list[int]:
        await collector.start()
        try:
            return await asyncio.to_thread(post_all, port, bodies)
        finally:
            assert await collector.stop()

    return collector, asyncio.run(go())


def test_the_collector_hands_protobuf_bodies_to_clickhouse_and_they_land_once(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    bodies = random_exports(seed=7, count=12)
    expected = sum(otlp_native.check(b)[0] for b in bodies)
    collector, answers = run_collector(ch, tmp_path, [*bodies, b"\x00garbage"])
    assert collector.native_otlp
    assert answers == [200] * len(bodies) + [400]
    assert ch.command("SELECT count() FROM requests") == expected
    assert ch.command("SELECT sum(rows) FROM requests_1m") == expected
    # a crash after the insert and before the spool file was removed: the replay is dropped
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "replay", flush_interval_s=0.2))
    body = bodies[0]
    llm = otlp_native.check(body)[0]
    writer.add_raw(otlp_native.TABLE, otlp_native.framed(body), llm, otlp_native.FORMAT, otlp_native.settings_for(ch))
    writer.spool_due(force=True)
    (spooled,) = writer._spooled()
    kept = spooled.read_bytes()
    assert writer.flush()
    spooled.write_bytes(kept)  # the file is back, as if the process died before removing it
    assert Writer(ch, WriterConfig(spool_dir=tmp_path / "replay")).flush()
    assert ch.command("SELECT count() FROM requests") == expected + llm


def test_a_store_without_the_landing_table_gets_the_python_path(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    ch.command("DROP VIEW otlp_exports_mv")
    ch.command("DROP TABLE otlp_exports")
    bodies = random_exports(seed=9, count=5)
    expected = sum(len(request_columns(b)[0]["ts"]) for b in bodies)
    collector, answers = run_collector(ch, tmp_path, bodies)
    assert not collector.native_otlp
    assert answers == [200] * len(bodies)
    assert ch.command("SELECT count() FROM requests") == expected


def test_sampling_keeps_the_python_path_and_its_per_request_decisions(ch, tmp_path: Path) -> None:
    from collector.sampling import SamplingPolicy

    clickhouse_runner.apply(ch)
    bodies = random_exports(seed=11, count=20)
    total = sum(len(request_columns(b)[0]["ts"]) for b in bodies)
    _collector, answers = run_collector(ch, tmp_path, bodies, sampling=SamplingPolicy(default_rate=0.5))
    assert answers == [200] * len(bodies)
    kept, weighted = ch.query("SELECT count(), sum(weight) FROM requests").result_rows[0]
    assert 0 < kept < total  # sampled per request, weights 2 (or 1 for the always-kept)
    assert kept < weighted <= 2 * kept


def test_one_clients_bad_body_is_set_aside_alone_and_the_others_land(ch, tmp_path: Path) -> None:
    """Bodies of many clients share a batch. One whose span carries a name sent as a number (the
    C parser keeps it as an unknown field; ClickHouse refuses the body) and one whose token counts
    are not numbers a row holds (NaN, infinite, negative): the batch is split, only the refused
    body goes to spool/rejected, and every other span lands, the odd counts as 0."""
    clickhouse_runner.apply(ch)

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2]) + otlp_native.framed(payload)  # a length-delimited field

    span = Span(name="llm_request", trace_id=bytes(range(16)), span_id=bytes(8)).SerializeToString()
    refused = field(1, field(2, field(2, span + b"\x28\x01")))  # field 5 (name) again, as a varint
    assert otlp_native.check(refused) == (1, 0)  # the collector's check lets it through
    odd = Span(
        name="llm_request",
        trace_id=bytes(range(1, 17)),
        span_id=bytes(8),
        attributes=[
            KeyValue(key="gen_ai.usage.prompt_tokens", value=AnyValue(double_value=float("nan"))),
            KeyValue(key="gen_ai.usage.completion_tokens", value=AnyValue(double_value=float("inf"))),
            KeyValue(key="gen_ai.request.max_tokens", value=AnyValue(int_value=-5)),
        ],
    )
    odd_body = ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[odd])])])
    good = random_exports(seed=13, count=4)
    bodies = [good[0], refused, odd_body.SerializeToString(), *good[1:]]
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", max_attempts=1))
    for body in bodies:
        llm = otlp_native.check(body)[0]
        writer.add_raw(
            otlp_native.TABLE, otlp_native.framed(body), llm, otlp_native.FORMAT, otlp_native.settings_for(ch)
        )
    assert writer.flush()
    expected = sum(otlp_native.check(b)[0] for b in good) + 1
    assert ch.command("SELECT count() FROM requests") == expected
    assert len(list((tmp_path / "spool" / "rejected").glob("*.batch"))) == 1
    row = ch.query(
        "SELECT prompt_tokens, completion_tokens, max_tokens FROM requests WHERE trace_id = %(t)s",
        parameters={"t": bytes(range(1, 17)).hex()},
    ).result_rows
    assert row == [(0, 0, 0)]
