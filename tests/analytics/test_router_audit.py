"""The router audit's analytics (analytics.router_audit) on what the real gateway shipped and the
collector stored: simulated small and large engines behind the gateway's model router, the audit
replaying a sample on the other model. Per route reason: the decisions and audits counted as the
gateway logged them, the agreement of the simulated answers (lower for long prompts), the judge's
scores, the spend saved from the pools' cost per 1M tokens; the audit's extra load as the store
measures it, within the configured share; shadow rows never count in the users' quality rates."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from analytics.filters import Filters
from analytics.quality import quality_rates
from analytics.router_audit import router_audit
from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from fleet.gateway.config import AuditSpec, JudgeSpec
from migrations import clickhouse_runner
from tests.fleet.test_router_audit import run, traffic
from tests.promtools import free_ports

SHARE = 0.1


@pytest.fixture(scope="module")
def stored(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, datetime, datetime, Any]:
    from storage.clickhouse import connect

    client = connect(f"chdb:{chdb_dir}", database="t_router_audit", create_database=True)
    clickhouse_runner.apply(client)
    spool = tmp_path_factory.mktemp("spool")
    writer = Writer(client, WriterConfig(spool_dir=spool, flush_interval_s=0.2), registry=CollectorRegistry())
    (port,) = free_ports(1)
    collector = Collector(CollectorConfig(http_port=port, grpc_port=0), writer)
    judge = JudgeSpec(model="tiny-large", max_calls_per_minute=40, constrained=True)
    start = datetime.now(UTC) - timedelta(seconds=1)
    _, gateway = run(
        AuditSpec(enabled=True, sample_rate=1.0, max_share=SHARE, judge=judge), traffic(200), collector=collector
    )
    end = datetime.now(UTC) + timedelta(seconds=1)
    yield client, start, end, gateway
    client.command("DROP DATABASE IF EXISTS t_router_audit")


def table(client: Any, sql: str) -> pd.DataFrame:
    result = client.query(sql)
    return pd.DataFrame(result.result_rows, columns=result.column_names)


def test_per_route_reason_the_audit_counts_what_the_gateway_logged(stored: Any) -> None:
    client, start, end, _gateway = stored
    df = router_audit(client, start, end)
    rows = table(client, "SELECT model, route, route_reason, audit_of, audit_direction, outcome FROM requests")
    shadows = rows[rows["audit_of"] != ""]
    users = rows[rows["audit_of"] == ""]
    assert len(users) == 200 and len(shadows) > 10
    reason = lambda r: r.split(" (")[0]  # noqa: E731
    want = Counter((reason(r.route_reason), r.audit_direction) for r in shadows.itertuples() if r.outcome == "ok")
    got = {(r.reason, r.direction): r.audits for r in df.itertuples()}
    assert got == dict(want)
    decisions = Counter((reason(r.route_reason), r.model) for r in users.itertuples())
    for r in df.itertuples():
        assert r.decisions == decisions[(r.reason, r.routed_model)]
        assert {r.routed_model, r.shadow_model} == {"tiny-small", "tiny-large"}
    by = df.set_index("reason")
    assert set(by.index) == {"easy request", "long prompt"}
    # the simulated small model agrees less with the large one on long prompts (fleet.sim.answers)
    assert by.loc["easy request", "agreement"] > by.loc["long prompt", "agreement"] + 0.1
    assert by.loc["easy request", "direction"] == "small_to_large"
    assert (df["judged"] > 0).all() and df["judge_routed"].between(0, 1).all()
    assert (df["quality_gap"] == df["judge_shadow"] - df["judge_routed"]).all()
    assert df["saved_per_hour"].isna().all()  # no prices: no money


def test_the_audits_extra_load_is_within_the_share(stored: Any) -> None:
    client, start, end, _gateway = stored
    df = router_audit(client, start, end)
    rows = table(client, "SELECT audit_of, prompt_tokens + completion_tokens AS tokens, outcome FROM requests")
    shadow = rows[rows["audit_of"] != ""]["tokens"].sum()
    user = rows[(rows["audit_of"] == "") & (rows["outcome"] == "ok")]["tokens"].sum()
    assert math.isclose(df.attrs["shadow_share"], shadow / user, rel_tol=1e-9)
    # the configured share, over by at most the one shadow sent while the share was just under
    # (one long prompt is ~1.5 points of this short run's tokens)
    one = rows[rows["audit_of"] != ""]["tokens"].max() / user
    assert df.attrs["shadow_share"] <= SHARE + one, (df.attrs, one)
    assert df.attrs["shadow_share"] >= SHARE - 0.03  # and it binds (every decision was sampled)


def test_shadow_rows_are_not_the_users_quality(stored: Any) -> None:
    client, start, end, _gateway = stored
    rates = quality_rates(client, start, end, by="tenant")
    assert "router-audit" not in set(rates["tenant"]) and rates["requests"].sum() == 200


def test_the_spend_saved_is_the_routed_tokens_at_the_other_pools_price(stored: Any, monkeypatch: Any) -> None:
    client, start, end, _gateway = stored
    # the pools' cost per 1M tokens (analytics.cost.cost_per_token needs the engines' token counters,
    # which this test does not scrape): small 0.5 USD, large 2.0 USD
    monkeypatch.setattr("analytics.router_audit._costs", lambda *_a: {"tiny-small": 0.5, "tiny-large": 2.0})
    df = router_audit(client, start, end, prices={"sim": 1.0}).set_index("reason")
    rows = table(
        client, "SELECT route_reason, model, prompt_tokens + completion_tokens AS t FROM requests WHERE audit_of = ''"
    )
    hours = (end - start).total_seconds() / 3600
    easy = rows[rows["route_reason"] == "easy request"]["t"].sum() / hours
    assert math.isclose(df.loc["easy request", "saved_per_hour"], easy * (2.0 - 0.5) / 1e6, rel_tol=1e-9)
    long = rows[rows["route_reason"].str.startswith("long prompt")]["t"].sum() / hours
    assert math.isclose(df.loc["long prompt", "saved_per_hour"], long * (0.5 - 2.0) / 1e6, rel_tol=1e-9)


def test_filters_pick_the_audited_requests_and_their_shadows(stored: Any) -> None:
    client, start, end, _gateway = stored
    everyone = router_audit(client, start, end)
    mine = router_audit(client, start, end, filters=Filters(tenant="anonymous"))  # the traffic's tenant
    assert mine[["reason", "audits", "decisions"]].equals(everyone[["reason", "audits", "decisions"]])
    nobody = router_audit(client, start, end, filters=Filters(tenant="nobody"))
    assert nobody.empty or (nobody["audits"].sum() == 0 and nobody["decisions"].sum() == 0)
