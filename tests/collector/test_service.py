"""The collector service end to end in process: local targets, OTLP over HTTP and gRPC, gateway
logs and its own /metrics, into a real chDB store."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner
from tests.collector.helpers import Targets
from tests.collector.test_otlp import TRACE, export, llm_span


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_collector_end_to_end(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    http_port, grpc_port = free_port(), free_port()
    registry = CollectorRegistry()
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.2), registry=registry)
    answers: dict[str, object] = {}
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))  # 64 MiB of zeros in ~64 KB: over the 32 MiB cap

    async def go() -> bool:
        async with Targets() as t:
            config = CollectorConfig(
                http_port=http_port,
                grpc_port=grpc_port,
                static_targets=[t.target("good", 1.0, 1.0), t.target("error", 1.0, 1.0)],
            )
            collector = Collector(config, writer, registry)
            await collector.start()
            base = f"http://127.0.0.1:{http_port}"
            async with httpx.AsyncClient() as client:
                r = await client.post(
                    f"{base}/v1/traces", content=export(llm_span()), headers={"Content-Type": "application/x-protobuf"}
                )
                answers["protobuf"] = r.status_code
                r = await client.post(
                    f"{base}/v1/traces", content=b"\x00garbage", headers={"Content-Type": "application/x-protobuf"}
                )
                answers["garbage"] = (r.status_code, r.json()["error"])
                r = await client.post(
                    f"{base}/v1/traces",
                    content=bomb,
                    headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
                )
                answers["bomb"] = (r.status_code, r.json()["error"])
                r = await client.post(
                    f"{base}/v1/traces",
                    content=gzip.compress(export(llm_span("2" * 32))),
                    headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
                )
                answers["gzip"] = r.status_code
                nested = "[" * 100_000 + "]" * 100_000
                r = await client.post(f"{base}/v1/traces", content=nested, headers={"Content-Type": "application/json"})
                answers["nested"] = r.status_code
                line = {
                    "ts": 1_795_000_000.0,
                    "trace_id": TRACE,
                    "model": "tiny-small",
                    "tenant": "acme",
                    "route": "rr",
                    "prompt_tokens": 1200,
                    "completion_tokens": 65,
                    "ttft_seconds": 0.3,
                    "e2e_seconds": 1.6,
                }
                r = await client.post(f"{base}/v1/requests", content=json.dumps(line) + "\n{oops}\n")
                answers["gateway"] = r.json()
                await asyncio.sleep(2.5)
                answers["metrics"] = (await client.get(f"{base}/metrics")).text
                answers["health"] = (await client.get(f"{base}/healthz")).json()
            import grpc
            from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(export(llm_span("1" * 32), replica="large-0"))
                await trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=5)
            return await collector.stop()

    assert asyncio.run(go())
    assert answers["protobuf"] == 200
    assert answers["garbage"][0] == 400 and "not an OTLP protobuf" in answers["garbage"][1]
    assert answers["gateway"]["kept"] == 1 and answers["gateway"]["rejected"][0]["line"] == 2
    assert 'fleetscope_collector_scrapes_total{job="test",result="ok"}' in answers["metrics"]
    assert answers["bomb"][0] == 400 and "after decompression" in answers["bomb"][1]
    assert answers["gzip"] == 200  # a gzip-compressed export is fine
    assert answers["nested"] == 400
    assert 'fleetscope_collector_bad_bodies_total{endpoint="traces"} 3.0' in answers["metrics"]  # counted
    assert "fleetscope_collector_inserted_rows_total" in answers["metrics"]
    assert answers["health"]["status"] == "ok" and answers["health"]["targets"] == 2

    scrapes = ch.query(
        "SELECT replica, min(up), max(up), count(), anyIf(error, up = 0) FROM scrapes GROUP BY replica ORDER BY replica"
    ).result_rows
    assert scrapes[0][:3] == ("error", 0, 0) and "HTTP status 500" in scrapes[0][4]
    assert scrapes[1][:3] == ("good", 1, 1) and scrapes[1][3] >= 2
    samples = ch.query("""SELECT count(DISTINCT fingerprint) FROM samples
                          WHERE fingerprint IN (SELECT fingerprint FROM series WHERE replica = 'good')""").result_rows[
        0
    ][0]
    assert samples == 432
    requests = ch.query(
        "SELECT source, trace_id, replica, tenant, prompt_tokens, weight FROM requests ORDER BY source, replica, trace_id"
    ).result_rows
    assert requests == [
        ("gateway", TRACE, "", "acme", 1200, 1.0),
        ("otlp", "1" * 32, "large-0", "", 1200, 1.0),
        ("otlp", TRACE, "small-0", "", 1200, 1.0),
        ("otlp", "2" * 32, "small-0", "", 1200, 1.0),
    ]

    # the gateway row and the engine span of one request, joined on the trace id
    joined = ch.query(
        """SELECT tenant, route, replica, prompt_tokens, ttft_seconds, gateway_ttft_seconds, has_gateway, has_engine
                         FROM requests_joined WHERE trace_id = {t:String}""",
        parameters={"t": TRACE},
    ).result_rows
    (row,) = joined
    assert row[:5] == ("acme", "rr", "small-0", 1200, 0.25) and row[6:] == (True, True)
    assert row[5] == pytest.approx(0.3)  # the gateway's own TTFT (Float32)


def test_stop_scraping_keeps_the_receiver_for_the_fleets_last_logs(ch, tmp_path: Path) -> None:
    """``fleetscope up`` stops scraping before it stops the fleet it started: no "target down" for
    engines it is shutting down, while their last request logs still arrive and are stored."""
    clickhouse_runner.apply(ch)
    port = free_port()
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.2))
    seen: dict[str, object] = {}

    async def go() -> bool:
        async with Targets() as t:
            collector = Collector(
                CollectorConfig(http_port=port, grpc_port=0, static_targets=[t.target("good", 0.2, 0.2)]), writer
            )
            await collector.start()
            await asyncio.sleep(1.0)
            await collector.stop_scraping()
            seen["scraped"] = t.hits.get("good", 0)
            await asyncio.sleep(1.0)
            seen["after"] = t.hits.get("good", 0)
            line = {
                "ts": 1_795_000_000.0,
                "trace_id": TRACE,
                "model": "tiny-small",
                "tenant": "acme",
                "prompt_tokens": 9,
            }
            async with httpx.AsyncClient() as client:
                seen["log"] = (
                    await client.post(f"http://127.0.0.1:{port}/v1/requests", content=json.dumps(line))
                ).json()
            return await collector.stop()

    assert asyncio.run(go())
    assert seen["scraped"] >= 2 and seen["after"] == seen["scraped"]  # scraped, then not any more
    assert seen["log"]["kept"] == 1
    assert ch.query("SELECT tenant, prompt_tokens FROM requests WHERE source = 'gateway'").result_rows == [("acme", 9)]
