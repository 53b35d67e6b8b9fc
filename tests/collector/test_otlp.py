"""OTLP spans -> request rows; gateway logs; sampling weights keep totals unbiased."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from collector.otlp import OtlpError, decode_json, decode_protobuf, request_columns, request_row
from collector.requestlog import parse_request_log
from collector.sampling import Sampler, SamplingPolicy, SamplingRule

TRACE = "0af7651916cd43dd8448eb211c80319c"


def kv(key: str, value) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def export(*spans: Span, replica: str = "small-0") -> bytes:
    resource_attrs = [
        kv("service.name", replica),
        kv("fleetscope.replica", replica),
        kv("fleetscope.model", "tiny-small"),
    ]
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(resource={"attributes": resource_attrs}, scope_spans=[ScopeSpans(spans=list(spans))])
        ]
    )
    return request.SerializeToString()


def llm_span(trace: str = TRACE, error: bool = False) -> Span:
    return Span(
        name="llm_request",
        trace_id=bytes.fromhex(trace),
        span_id=bytes.fromhex("b7ad6b7169203331"),
        start_time_unix_nano=1_795_000_000_000_000_000,
        end_time_unix_nano=1_795_000_001_500_000_000,
        status=Status(code=2 if error else 0),
        attributes=[
            kv("gen_ai.request.id", "cmpl-123"),
            kv("gen_ai.usage.prompt_tokens", 1200),
            kv("gen_ai.usage.completion_tokens", 65),
            kv("gen_ai.request.max_tokens", 64),
            kv("gen_ai.latency.time_to_first_token", 0.25),
            kv("gen_ai.latency.e2e", 1.5),
            kv("gen_ai.latency.time_in_queue", 0.1),
            kv("gen_ai.latency.time_in_model_prefill", 0.12),
            kv("gen_ai.latency.time_in_model_decode", 1.28),
        ],
    )


def test_llm_request_span_becomes_a_request_row() -> None:
    (span,) = decode_protobuf(export(llm_span()))
    row = request_row(span)
    assert (row["trace_id"], row["request_id"], row["replica"], row["model"]) == (
        TRACE,
        "cmpl-123",
        "small-0",
        "tiny-small",
    )
    assert (row["prompt_tokens"], row["completion_tokens"], row["max_tokens"]) == (1200, 65, 64)
    assert row["ttft_seconds"] == 0.25 and row["e2e_seconds"] == 1.5 and row["queue_seconds"] == 0.1
    assert row["tpot_seconds"] == pytest.approx(1.28 / 64)
    assert row["ts"] == pytest.approx(1_795_000_000.0)
    assert row["status_code"] == 200
    assert request_row(decode_protobuf(export(llm_span(error=True)))[0])["status_code"] == 500


def test_other_spans_are_ignored() -> None:
    startup = Span(name="Executor init", trace_id=bytes(16), span_id=bytes(8))
    spans = decode_protobuf(export(startup, llm_span()))
    assert [request_row(s) is not None for s in spans] == [False, True]


def test_otlp_json_body() -> None:
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "fleetscope.replica", "value": {"stringValue": "large-0"}},
                        {"key": "fleetscope.model", "value": {"stringValue": "tiny-large"}},
                    ]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "name": "llm_request",
                                "traceId": TRACE.upper(),
                                "spanId": "b7ad6b7169203331",
                                "startTimeUnixNano": "1795000000000000000",
                                "endTimeUnixNano": "1795000001000000000",
                                "attributes": [
                                    {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "300"}},
                                    {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.05}},
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    (span,) = decode_json(json.dumps(body).encode())
    row = request_row(span)
    assert (row["trace_id"], row["replica"], row["prompt_tokens"], row["ttft_seconds"]) == (TRACE, "large-0", 300, 0.05)


@pytest.mark.parametrize("body", [b"\x00\x01garbage", b"\x0a\xff\xff\xff\xff\x0f"])
def test_undecodable_protobuf_is_one_error(body: bytes) -> None:
    with pytest.raises(OtlpError):
        decode_protobuf(body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzzed_protobuf_bodies_decode_or_raise_otlp_error(body: bytes) -> None:
    try:
        spans = decode_protobuf(body)
    except OtlpError:
        return
    for span in spans:
        request_row(span)  # never raises on a decoded span


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: (
            st.lists(c, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "resourceSpans",
                        "scopeSpans",
                        "spans",
                        "traceId",
                        "attributes",
                        "key",
                        "value",
                        "name",
                        "intValue",
                        "startTimeUnixNano",
                        "resource",
                        "status",
                        "code",
                    ]
                ),
                c,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_fuzzed_json_bodies_decode_or_raise_otlp_error(data) -> None:
    try:
        spans = decode_json(json.dumps(data).encode())
    except OtlpError:
        return
    for span in spans:
        request_row(span)


def test_gateway_log_lines_good_and_bad() -> None:
    good = {
        "ts": "2026-11-29T09:00:00Z",
        "trace_id": TRACE,
        "model": "tiny-small",
        "tenant": "acme",
        "route": "model-router:short",
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "ttft_seconds": 0.2,
        "e2e_seconds": 1.2,
    }
    body = "\n".join(
        [json.dumps(good), "{not json", json.dumps({**good, "tenant": 5}), json.dumps({**good, "tenantt": "x"}), ""]
    )
    rows, errors = parse_request_log(body)
    assert len(rows) == 1 and rows[0]["source"] == "gateway" and rows[0]["tenant"] == "acme"
    assert rows[0]["ts"] == datetime(2026, 11, 29, 9, 0, tzinfo=UTC).timestamp()
    assert [n for n, _ in errors] == [2, 3, 4]
    assert "not JSON" in errors[0][1] and errors[1][1].startswith("tenant") and "tenantt" in errors[2][1]


def test_sampling_keeps_errors_and_slow_requests_and_stays_unbiased() -> None:
    sampler = Sampler(
        SamplingPolicy(default_rate=0.1, rules=[SamplingRule(model="tiny-large", rate=0.5)], keep_ttft_above_s=2.0)
    )
    rng = random.Random(7)
    rows = [
        {
            "trace_id": f"{rng.getrandbits(128):032x}",
            "model": rng.choice(["tiny-small", "tiny-large"]),
            "tenant": "",
            "status_code": 500 if i % 100 == 0 else 200,
            "ttft_seconds": 3.0 if i % 50 == 1 else 0.1,
            "e2e_seconds": 1.0,
            "prompt_tokens": rng.randint(10, 2000),
        }
        for i in range(40_000)
    ]
    kept = [(r, w) for r in rows if (w := sampler.weight(r)) is not None]
    assert all(w == 1.0 for r, w in kept if r["status_code"] >= 400 or r["ttft_seconds"] > 2)
    assert sum(1 for r, _ in kept if r["status_code"] >= 400) == sum(1 for r in rows if r["status_code"] >= 400)
    assert sum(w for _, w in kept) == pytest.approx(len(rows), rel=0.03)
    assert sum(w * r["prompt_tokens"] for r, w in kept) == pytest.approx(
        sum(r["prompt_tokens"] for r in rows), rel=0.03
    )
    assert len(kept) < 0.4 * len(rows)
    # the same trace id gets the same decision (gateway row and engine span together)
    assert sampler.weight(dict(rows[5])) == sampler.weight(dict(rows[5]))


def test_both_rows_of_a_request_share_one_decision_and_weight() -> None:
    """The gateway row (knows the tenant) and the engine span (does not) of one trace are kept
    or dropped together with the same weight, whichever arrives first."""
    rng = random.Random(11)
    policy = SamplingPolicy(default_rate=1.0, rules=[SamplingRule(tenant="acme", rate=0.1)])
    gateway_first, engine_first = Sampler(policy), Sampler(policy)
    kept = 0.0
    n = 20_000
    for _ in range(n):
        trace = f"{rng.getrandbits(128):032x}"
        gateway = {"trace_id": trace, "tenant": "acme", "model": "m", "status_code": 200}
        engine = {"trace_id": trace, "tenant": "", "model": "m", "status_code": 200}
        w1, w2 = gateway_first.weight(gateway), gateway_first.weight(engine)
        assert w1 == w2
        assert engine_first.weight(engine) == engine_first.weight(gateway)
        kept += w1 or 0.0
    assert kept == pytest.approx(n, rel=0.05)  # joined estimate of the request count: unbiased


def test_the_columnar_path_gives_the_same_rows_as_span_records() -> None:
    startup = Span(name="Executor init", trace_id=bytes(16), span_id=bytes(8))
    sparse = Span(
        name="llm_request",
        trace_id=bytes.fromhex(TRACE),
        span_id=bytes(8),
        attributes=[
            kv("gen_ai.request.id", 42),
            kv("gen_ai.usage.completion_tokens", 1),
            kv("gen_ai.response.model", "from-span"),
        ],
    )
    bare = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource={"attributes": [kv("service.name", "vllm-a")]}, scope_spans=[ScopeSpans(spans=[sparse])]
            )
        ]
    )
    bodies = [
        export(llm_span(), startup, llm_span(error=True), replica="small-1"),
        bare.SerializeToString(),
        export(*[llm_span(trace=f"{i:032x}") for i in range(20)]),
    ]
    for body in bodies:
        columns, other = request_columns(body)
        spans = decode_protobuf(body)
        expected = [row for row in map(request_row, spans) if row is not None]
        assert other == len(spans) - len(expected)
        assert len(columns["ts"]) == len(expected)
        for i, row in enumerate(expected):
            assert {name: values[i] for name, values in columns.items()} == row
    sparse_row = {name: values[0] for name, values in request_columns(bodies[1])[0].items()}
    assert (sparse_row["replica"], sparse_row["model"], sparse_row["request_id"]) == ("vllm-a", "from-span", "42")
