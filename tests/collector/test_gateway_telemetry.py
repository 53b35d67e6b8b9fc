"""Other gateways' request telemetry through the real receiver into chDB: OpenTelemetry GenAI spans
in both attribute generations (OTLP/JSON and protobuf), OTLP logs, LiteLLM records; the rows
they make, the engine's span of the same request kept apart, and what is refused and why."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client import CollectorRegistry

from collector.mapping import RequestMapping
from collector.service import Collector, CollectorConfig
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner

DATA = Path(__file__).parent / "data" / "genai"
EXPECTED = json.loads((DATA / "expected.json").read_text())
TARGETS = [
    make_target(
        "127.0.0.1:8101", job="vllm", labels={"replica": "small-0", "model": "tiny-small"}, interval_s=5, timeout_s=4
    ),
    make_target(
        "127.0.0.1:8103", job="vllm", labels={"replica": "large-0", "model": "tiny-large"}, interval_s=5, timeout_s=4
    ),
    # the stub backends the LiteLLM recordings were made against
    make_target(
        "127.0.0.1:28701", job="vllm", labels={"replica": "lt-small", "model": "tiny-small"}, interval_s=5, timeout_s=4
    ),
    make_target(
        "127.0.0.1:28702", job="vllm", labels={"replica": "lt-large", "model": "tiny-large"}, interval_s=5, timeout_s=4
    ),
]
PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def to_protobuf(otlp_json: dict[str, Any], message: Any) -> bytes:
    """OTLP/JSON -> the same export as protobuf bytes (OTLP/JSON writes ids in hex, protobuf's
    JSON mapping in base64)."""
    data = copy.deepcopy(otlp_json)

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("traceId", "spanId", "parentSpanId"):
                if isinstance(node.get(key), str):
                    node[key] = base64.b64encode(bytes.fromhex(node[key])).decode()
            for value in node.values():
                fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)

    fix(data)
    return json_format.ParseDict(data, message).SerializeToString()


class Intake:
    """A collector's HTTP receiver (no scraping) writing into a migrated chDB database."""

    def __init__(self, ch: Any, tmp_path: Path, **config: Any) -> None:
        clickhouse_runner.apply(ch)
        self.ch = ch
        self.writer = Writer(
            ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.1), registry=CollectorRegistry()
        )
        self.collector = Collector(CollectorConfig(grpc_port=0, static_targets=TARGETS, **config), self.writer)
        self.collector._set_targets()  # the backends -> replicas the targets name

    def post(self, path: str, bodies: list[tuple[bytes, dict[str, str]]]) -> list[tuple[int, bytes]]:
        async def go() -> list[tuple[int, bytes]]:
            async with TestClient(TestServer(self.collector.app())) as client:
                out = []
                for body, headers in bodies:
                    r = await client.post(path, data=body, headers=headers)
                    out.append((r.status, await r.read()))
                return out

        answers = asyncio.run(go())
        self.writer.start()
        assert self.writer.close()
        return answers

    def rows(self, where: str = "1") -> list[dict[str, Any]]:
        result = self.ch.query(f"SELECT * FROM requests WHERE {where} ORDER BY source, ts, trace_id")
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


def _same(rows: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    want = sorted(expected, key=lambda r: (r["source"], r.get("ts", 0), r["trace_id"]))
    assert len(rows) == len(want), [(r["source"], r["model"], r["trace_id"]) for r in rows]
    for row, exp in zip(rows, want, strict=True):
        for key, value in exp.items():
            got = row[key].timestamp() if key == "ts" else row[key]
            assert got == pytest.approx(value, abs=1e-3) if isinstance(value, float) else got == value, (key, row)


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
@pytest.mark.parametrize("fixture", ["spans_current.json", "spans_legacy.json"])
def test_genai_spans_make_the_expected_rows(ch, tmp_path: Path, fixture: str, encoding: str) -> None:
    otlp = json.loads((DATA / fixture).read_text())
    body = json.dumps(otlp).encode() if encoding == "json" else to_protobuf(otlp, ExportTraceServiceRequest())
    intake = Intake(ch, tmp_path)
    [(status, _)] = intake.post("/v1/traces", [(body, JSON if encoding == "json" else PROTOBUF)])
    assert status == 200
    _same(intake.rows(), EXPECTED[fixture])


def test_a_gateway_span_and_the_engine_span_are_one_request(ch, tmp_path: Path) -> None:
    """The legacy fixture holds the gateway's span and vLLM's llm_request span of one request:
    requests_joined has one row with the tenant from the gateway and the engine's replica."""
    intake = Intake(ch, tmp_path)
    otlp = json.loads((DATA / "spans_legacy.json").read_text())
    intake.post("/v1/traces", [(to_protobuf(otlp, ExportTraceServiceRequest()), PROTOBUF)])
    joined = ch.query(
        "SELECT tenant, replica, prompt_tokens, has_gateway, has_engine FROM requests_joined "
        "WHERE trace_id = '4bf92f3577b34da6a3ce929d0e0e4736'"
    ).result_rows
    assert joined == [("initech", "large-0", 1300, True, True)]
    # the same tokens are not counted twice: totals read one source (the gateway's, when it logs)
    from analytics.requests import prefer_source

    sources = [r[0] for r in ch.query("SELECT DISTINCT source FROM requests").result_rows]
    source = prefer_source(sources)
    total = ch.query(f"SELECT sum(prompt_tokens) FROM requests WHERE source = '{source}'").result_rows[0][0]
    assert source == "gateway" and total == 1300 + 16


def test_a_matched_record_that_cannot_be_a_row_is_refused_with_the_reason(ch, tmp_path: Path) -> None:
    otlp = json.loads((DATA / "spans_current.json").read_text())
    spans = otlp["resourceSpans"][0]["scopeSpans"][0]["spans"]
    for attr in spans[0]["attributes"]:
        if attr["key"] == "gen_ai.usage.input_tokens":
            attr["value"] = {"intValue": "-5"}
    intake = Intake(ch, tmp_path)
    [(status, body)] = intake.post("/v1/traces", [(to_protobuf(otlp, ExportTraceServiceRequest()), PROTOBUF)])
    answer = ExportTraceServiceResponse()
    answer.ParseFromString(body)
    assert status == 200  # the other span of the body is kept
    assert answer.partial_success.rejected_spans == 1
    assert "prompt_tokens: -5 is not a count" in answer.partial_success.error_message
    assert [r["model"] for r in intake.rows()] == ["tiny-large"]
    metrics = intake.collector.registry
    assert (
        metrics.get_sample_value(
            "fleetscope_collector_gateway_records_total", {"endpoint": "traces", "result": "rejected"}
        )
        == 1
    )


def test_a_users_mapping_reads_a_gateway_the_shipped_ones_do_not_know(ch, tmp_path: Path) -> None:
    """A made-up gateway logs ``llm.model``, ``llm.tokens.in/out``, ``org`` and its upstream as a
    URL; the user's mapping names them, and the upstream resolves to the replica."""
    record = {
        "resourceLogs": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "edge-proxy"}}]},
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "timeUnixNano": "1796000100000000000",
                                "body": {
                                    "kvlistValue": {
                                        "values": [
                                            {"key": "llm.model", "value": {"stringValue": "tiny-small"}},
                                            {"key": "llm.tokens.in", "value": {"intValue": "300"}},
                                            {"key": "llm.tokens.out", "value": {"intValue": "20"}},
                                            {"key": "org", "value": {"stringValue": "hooli"}},
                                            {"key": "upstream", "value": {"stringValue": "http://localhost:8101/v1"}},
                                            {"key": "took_ms", "value": {"intValue": "750"}},
                                        ]
                                    }
                                },
                            }
                        ]
                    }
                ],
            }
        ]
    }
    mapping = RequestMapping.model_validate(
        {
            "name": "edge",
            "carriers": ["log"],
            "match": {"resource.service.name": "edge-proxy"},
            "model": "llm.model",
            "prompt_tokens": "llm.tokens.in",
            "completion_tokens": "llm.tokens.out",
            "tenant": "org",
            "replica": "upstream",
            "e2e_seconds": [{"key": "took_ms", "unit": "ms"}],
            "start_time": "log.time",
        }
    )
    unknown = copy.deepcopy(record)
    unknown["resourceLogs"][0]["resource"]["attributes"][0]["value"]["stringValue"] = "other-proxy"
    intake = Intake(ch, tmp_path, request_mappings=[mapping])
    answers = intake.post(
        "/v1/logs",
        [(json.dumps(record).encode(), JSON), (to_protobuf(unknown, ExportLogsServiceRequest()), PROTOBUF)],
    )
    assert [a[0] for a in answers] == [200, 200]
    refused = ExportLogsServiceResponse()
    refused.ParseFromString(answers[1][1])
    assert refused.partial_success.rejected_log_records == 1
    assert "no request mapping knows" in refused.partial_success.error_message
    (row,) = intake.rows()
    assert (row["gateway"], row["tenant"], row["replica"], row["prompt_tokens"], row["completion_tokens"]) == (
        "edge",
        "hooli",
        "small-0",
        300,
        20,
    )
    assert row["e2e_seconds"] == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("path", "body", "headers", "reason"),
    [
        ("/v1/logs", b"\x0a\xff\xff\xff", PROTOBUF, "not an OTLP protobuf ExportLogsServiceRequest"),
        ("/v1/logs", b"{not json", JSON, "not an OTLP/JSON ExportLogsServiceRequest"),
        ("/v1/logs", b"[1, 2]", JSON, "an OTLP/JSON logs body is an object"),
        ("/v1/litellm", b"[{]", JSON, "not JSON"),
    ],
)
def test_a_bad_body_is_a_400_with_the_reason(
    ch, tmp_path: Path, path: str, body: bytes, headers: dict, reason: str
) -> None:
    intake = Intake(ch, tmp_path)
    [(status, answer)] = intake.post(path, [(body, headers)])
    assert status == 400
    text = json.loads(answer)
    assert reason in (text.get("error") or text["rejected"][0]["error"])
    assert intake.rows() == []


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_envoy_access_log_records_make_the_expected_rows(ch, tmp_path: Path, encoding: str) -> None:
    otlp = json.loads((DATA / "envoy_logs.json").read_text())
    body = json.dumps(otlp).encode() if encoding == "json" else to_protobuf(otlp, ExportLogsServiceRequest())
    intake = Intake(ch, tmp_path)
    [(status, _)] = intake.post("/v1/logs", [(body, JSON if encoding == "json" else PROTOBUF)])
    assert status == 200
    _same(intake.rows(), EXPECTED["envoy_logs.json"])


def test_a_body_a_real_envoy_sent_makes_its_rows(ch, tmp_path: Path) -> None:
    """Chunked OTLP/HTTP protobuf from Envoy 1.40 (its stub backends are no targets here, so the
    upstream stays host:port); the request without a usage block has no tokens, not made-up ones."""
    intake = Intake(ch, tmp_path)
    body = (DATA / "envoy-1.40-access-log.bin").read_bytes()
    [(status, _)] = intake.post("/v1/logs", [(body, PROTOBUF)])
    assert status == 200
    _same(intake.rows(), EXPECTED["envoy-1.40-access-log.bin"])


@pytest.mark.parametrize(
    "fixture", ["litellm-1.106.2-chat.bin", "litellm-1.106.2-stream-and-text.bin", "litellm-1.106.2-backend500.bin"]
)
def test_litellm_spans_a_real_proxy_sent_make_their_rows(ch, tmp_path: Path, fixture: str) -> None:
    """Only the ``litellm_request`` span makes a row (the proxy's server, auth and router spans of
    the same request make none); hidden_params' api_base resolves to the replica."""
    intake = Intake(ch, tmp_path)
    [(status, _)] = intake.post("/v1/traces", [((DATA / fixture).read_bytes(), PROTOBUF)])
    assert status == 200
    _same(intake.rows(), EXPECTED[fixture])


def test_litellm_generic_api_records_make_their_rows(ch, tmp_path: Path) -> None:
    """Both of LiteLLM's batch formats: NDJSON and its default JSON array."""
    lines = (DATA / "litellm_payloads.ndjson").read_text().splitlines()
    array = json.dumps([json.loads(line) for line in lines]).encode()
    for body in ("\n".join(lines).encode(), array):
        intake = Intake(ch, tmp_path)
        [(status, answer)] = intake.post("/v1/litellm", [(body, JSON)])
        assert status == 200 and json.loads(answer)["kept"] == len(lines)
        _same(intake.rows(), EXPECTED["litellm_payloads.ndjson"])
        ch.command("TRUNCATE TABLE requests")


def test_a_body_with_engine_and_gateway_spans_when_clickhouse_decodes(ch, tmp_path: Path) -> None:
    """The store decodes the engines' llm_request spans (collector.otlp_native); the collector reads
    the same body's GenAI spans itself: the rows are those of the Python path."""
    from collector import otlp_native

    intake = Intake(ch, tmp_path)
    intake.collector.native_otlp = otlp_native.supported(ch)
    intake.collector._otlp_settings = otlp_native.settings_for(ch)
    assert intake.collector.native_otlp
    otlp = json.loads((DATA / "spans_legacy.json").read_text())
    [(status, _)] = intake.post("/v1/traces", [(to_protobuf(otlp, ExportTraceServiceRequest()), PROTOBUF)])
    assert status == 200
    _same(intake.rows(), EXPECTED["spans_legacy.json"])


def test_a_record_sent_twice_counts_once_and_failures_keep_their_outcome(ch, tmp_path: Path) -> None:
    """A sender's retry after a lost answer (the same request id again) is dropped; a LiteLLM
    failure without an HTTP code is a 500; Envoy's status 0 (the client went away) a 499 abort."""
    line = (DATA / "litellm_payloads.ndjson").read_text().splitlines()[0]
    failed = json.loads(line)
    failed.update(litellm_call_id="failed-1", id="failed-1", status="failure", error_information={"error_code": ""})
    envoy = json.loads((DATA / "envoy_logs.json").read_text())
    for attr in envoy["resourceLogs"][0]["scopeLogs"][0]["logRecords"][1]["attributes"]:
        if attr["key"] == "http.response.status_code":
            attr["value"] = {"stringValue": "0"}
    intake = Intake(ch, tmp_path)
    answers = intake.post(
        "/v1/litellm",
        [(line.encode(), JSON), (line.encode(), JSON), (json.dumps(failed).encode(), JSON)],
    )
    assert [json.loads(a)["duplicates"] for _s, a in answers] == [0, 1, 0]
    intake = Intake(ch, tmp_path)
    intake.post("/v1/logs", [(json.dumps(envoy).encode(), JSON)])
    rows = {(r["gateway"], r["request_id"]): (r["status_code"], r["outcome"]) for r in intake.rows()}
    litellm = [v for (g, _i), v in rows.items() if g == "litellm"]
    assert sorted(litellm) == [(200, "ok"), (500, "upstream_error")]  # the first record once, the failure
    assert (499, "client_abort") in [v for (g, _i), v in rows.items() if g == "envoy"]


def test_the_catch_all_genai_mapping_can_be_left_out(ch, tmp_path: Path) -> None:
    """GenAI spans from clients that see part of the traffic would stand for all of it: without the
    shipped genai mapping they are counted as unmapped and make no row."""
    otlp = json.loads((DATA / "spans_current.json").read_text())
    intake = Intake(ch, tmp_path, shipped_mappings=("litellm", "envoy"))
    intake.post("/v1/traces", [(json.dumps(otlp).encode(), JSON)])
    assert intake.rows() == []
    unmapped = intake.collector.registry.get_sample_value(
        "fleetscope_collector_gateway_records_total", {"endpoint": "traces", "result": "unmapped"}
    )
    assert unmapped == 2
