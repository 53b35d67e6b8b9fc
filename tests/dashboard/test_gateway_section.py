"""The Traffic page's gateway section under AppTest, on a store holding LiteLLM's request records (a
real proxy's, recorded) and two scrapes of a real vllm-router's /metrics (before and after 20
requests) and of the production-stack router's (made from its documented families): each gateway
is listed with what it gives, vllm-router's per-worker figures name the replicas, and what a
gateway does not give is said in words, not left as blank columns."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from analytics.gateways import overview
from collector.convert import Batch, SeriesConverter
from collector.exposition import parse
from collector.records import litellm_records
from collector.scrape import ScrapeResult
from collector.service import Collector, CollectorConfig
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from dashboard.context import use_stores
from migrations import clickhouse_runner
from tests.collector.test_gateway_telemetry import DATA as GENAI
from tests.collector.test_gateway_telemetry import TARGETS
from tests.conftest import migrated_sessions
from tests.dashboard.apptest import on_store, run

ROUTERS = Path(__file__).resolve().parents[1] / "collector" / "data" / "routers"
RECORDED = 1796467100.0  # the LiteLLM recording's time (2026-12-05 10:38 UTC)


@pytest.fixture
def sessions(sqlite_url: str):
    yield from migrated_sessions(sqlite_url)


def _scrape(
    batch: Batch, converter: SeriesConverter, text: str, ts: float, job: str, labels: dict, address: str
) -> None:
    target = make_target(address, job=job, labels=labels, interval_s=5, timeout_s=4)
    exposition = parse(text)
    converter.convert(ScrapeResult(target, ts, True, 0.01, len(exposition), "", exposition), batch)


@pytest.fixture
def store(ch, tmp_path: Path):
    clickhouse_runner.apply(ch)
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.1), registry=CollectorRegistry())
    collector = Collector(CollectorConfig(grpc_port=0, static_targets=TARGETS), writer)
    collector._set_targets()
    records, errors = litellm_records((GENAI / "litellm_payloads.ndjson").read_bytes())
    assert not errors
    collector.add_gateway_records(records, "litellm")
    before = (ROUTERS / "vllm-router-0.1.17-before.prom").read_text()
    after = (ROUTERS / "vllm-router-0.1.17-after-20.prom").read_text()
    router, stack, epp = SeriesConverter(), SeriesConverter(), SeriesConverter()
    batch = Batch()
    engine = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 0\n'
    t0 = time.time() - 60  # the collector stamps series with the time it writes them: scrapes are recent
    for i, ts in enumerate((t0, t0 + 15, t0 + 30)):
        _scrape(
            batch, router, before if i == 0 else after, ts, "gateway", {"gateway": "vllm-router"}, "127.0.0.1:19090"
        )
        _scrape(batch, stack, (ROUTERS / "production_stack_router.prom").read_text(), ts, "router", {}, "10.0.0.2:8001")
        _scrape(batch, epp, (ROUTERS / "llmd_epp.default.prom").read_text(), ts, "epp", {}, "10.0.0.3:9090")
        for port, replica in ((18011, "rtr-a"), (18012, "rtr-b")):  # the router's workers, scraped as engines
            labels = {"replica": replica, "model": "m", "gpu_type": "cpu-demo", "gpu_count": "1"}
            _scrape(batch, SeriesConverter(), engine, ts, "vllm", labels, f"127.0.0.1:{port}")
    writer.add_tables(batch.tables)
    writer.start()
    assert writer.close()
    return ch


def test_the_gateway_section_lists_each_gateway_what_it_gives_and_its_own_figures(store, sessions, chdb_dir) -> None:
    start, end = datetime.fromtimestamp(RECORDED - 60, UTC), datetime.fromtimestamp(time.time() + 60, UTC)
    use_stores(store, sessions, on_store(chdb_dir))
    at = run("traffic", **{"from": start.isoformat(), "to": end.isoformat()})
    assert not at.exception, at.exception
    assert "Gateways" in [h.value for h in at.subheader]
    frames = [df.value for df in at.dataframe]
    seen = next(f for f in frames if "Gives" in f.columns)
    gateways = dict(zip(seen["Gateway"], seen["Gives"], strict=True))
    assert set(gateways) == {"litellm", "vllm-router", "production-stack", "llm-d"}
    assert "tenant" in gateways["litellm"] and gateways["vllm-router"].endswith("no request fields")
    # vllm-router's own figures: per worker, the replica the worker's address is scraped as, the 10
    # requests each served between the first scrape (no worker series yet) and the last
    workers = next(f for f in frames if "Worker" in f.columns)
    by_replica = dict(zip(workers["Replica"], workers["Requests"], strict=True))
    assert by_replica == {"rtr-a": 10, "rtr-b": 10}
    servers = next(f for f in frames if "Server" in f.columns)
    assert set(servers["Server"]) == {"http://10.0.0.11:8000", "http://10.0.0.12:8000"}
    pools = next(f for f in frames if "Pool" in f.columns)
    assert list(pools["Pool"]) == ["vllm-pool"] and list(pools["Ready pods"]) == [2]
    # LiteLLM logs requests, so the mix is read from its rows; vllm-router's lack is said in words
    # only where the rows are the engines' (here they are LiteLLM's: nothing to say)
    ov = overview(store, start, end, "gateway")
    assert ov.gaps == [] and not [m.value for m in at.info if "logs no requests" in m.value]
    # with the engines' spans as the request log, vllm-router's missing fields are said
    ov = overview(store, start, end, "otlp")
    assert any(g.startswith("vllm-router logs no requests") and "no tenant" in g for g in ov.gaps), ov.gaps


def test_behind_vllm_router_the_page_says_what_is_missing(store, sessions, chdb_dir) -> None:
    store.command("ALTER TABLE requests UPDATE source = 'otlp', gateway = '' WHERE 1 SETTINGS mutations_sync = 1")
    start, end = datetime.fromtimestamp(RECORDED - 60, UTC), datetime.fromtimestamp(time.time() + 60, UTC)
    use_stores(store, sessions, on_store(chdb_dir))
    at = run("traffic", **{"from": start.isoformat(), "to": end.isoformat()})
    assert not at.exception, at.exception
    said = [m.value for m in at.info]
    assert any("vllm-router logs no requests" in m and "no route reason" in m for m in said), said
    cost = run("cost", **{"from": start.isoformat(), "to": end.isoformat()})  # where tenants are priced
    assert not cost.exception, cost.exception
    said = [m.value for m in cost.info]
    assert any("vllm-router logs no requests" in m and "no tenant" in m for m in said), said


def test_explain_says_what_vllm_router_does_not_give(store) -> None:
    """Behind vllm-router the request rows are the engines' spans: a tenant's cost cannot be
    explained and the refusal says why; the fleet's explanations carry the same words as a note."""
    from analytics.explain import explain, explain_cost
    from analytics.filters import Filters

    store.command("ALTER TABLE requests UPDATE source = 'otlp', gateway = '' WHERE 1 SETTINGS mutations_sync = 1")
    start, end = datetime.fromtimestamp(RECORDED - 60, UTC), datetime.fromtimestamp(time.time() + 60, UTC)
    with pytest.raises(ValueError, match=r"no gateway request log .*vllm-router logs no requests .*no tenant"):
        explain_cost(store, start, end, {"cpu-demo": 1.0}, filters=Filters(tenant=("acme",)))
    fleet = explain_cost(store, start, end, {"cpu-demo": 1.0})
    assert any(p.startswith("vllm-router logs no requests") for p in fleet.problems), fleet.problems
    latency = explain(store, start, end)
    assert any("no route reason" in n for n in latency.notes), latency.notes
