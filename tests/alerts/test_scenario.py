"""The built-in rules on the ``long-context-rollout`` scenario (simulated fleet, stored through
the collector's own path into chDB), evaluated every 15 s as the evaluator would, with the
notifications delivered to a real local webhook receiver."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alerts.config import AlertsSettings, rule_groups
from alerts.delivery import Deliverer
from alerts.evaluator import Evaluator
from alerts.reading import Context
from alerts.store import history
from fleet.spec import load_spec
from fleet.traffic import load_scenario
from fleetscope.replay import replay
from migrations import clickhouse_runner
from storage.catalog import SloTarget, set_slo
from storage.clickhouse import connect
from tests.alerts.receiver import ScriptedReceiver
from tests.conftest import migrated_sessions

ROOT = Path(__file__).resolve().parents[2]
EVERY = 15  # the capacity and latency groups' interval


@pytest.fixture(scope="module")
def rollout(chdb_dir: Path) -> Any:
    """The scenario (900 s; rollout at 180 s, rollback at 600 s) and 5 more steady minutes."""
    client = connect(f"chdb:{chdb_dir}", database=f"t_{uuid.uuid4().hex[:12]}", create_database=True)
    clickhouse_runner.apply(client)
    plan = load_scenario("long-context-rollout")
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
    report = replay(
        client, load_spec(ROOT / "fleet.yaml"), plan, start, interval_s=5.0, seed=1, duration_s=plan.duration_s + 300
    )
    return client, report


@pytest.fixture
def receiver() -> Iterator[ScriptedReceiver]:
    server = ScriptedReceiver()
    yield server
    server.stop()


def test_ttft_pages_within_for_plus_two_intervals_and_resolves_while_kv_waves_do_not_page(
    rollout: Any, sqlite_url: str, receiver: ScriptedReceiver
) -> None:
    client, report = rollout
    sessions = next(migrated_sessions(sqlite_url))
    # the SLO a team would set on this fleet: p99 TTFT within 2 s (steady p99 is about 1.2 s)
    for model in ("tiny-small", "tiny-large"):
        set_slo(sessions, SloTarget(model, "ttft", 2.0, 0.99))
    settings = AlertsSettings.model_validate(
        {
            "receivers": [{"name": "oncall", "type": "webhook", "url": f"http://127.0.0.1:{receiver.port}/alerts"}],
            "route": {"receiver": "oncall", "group_by": ["alertname"], "group_wait": "0s", "group_interval": "1m"},
            "external_url": "http://dash.example:8501",
        }
    )
    groups = [g for g in rule_groups(settings) if g.name in ("capacity", "latency")]
    evaluator = Evaluator(groups, Context(client, sessions), sessions, settings)
    deliverer = Deliverer(sessions, {r.name: r for r in settings.receivers})
    rules = {r.name: r for g in groups for r in g.rules}

    switch, back = report.phases["rollout"], report.phases["rollback"]
    fired: dict[str, datetime] = {}
    resolved: dict[str, datetime] = {}
    at = report.start
    while at <= report.end:
        for g in groups:
            for rule, t in evaluator.evaluate_group(g, at).transitions:
                if t.after == "firing":
                    fired.setdefault(rule, at)
                if t.after == "resolved":
                    resolved[rule] = at
        deliverer.run_once(at)
        at += timedelta(seconds=EVERY)

    # the tail pages within its for: and two evaluations
    assert "TTFTOverSLO" in fired, f"TTFTOverSLO never fired; fired: {sorted(fired)}"
    late = (fired["TTFTOverSLO"] - switch).total_seconds()
    assert 0 < late <= rules["TTFTOverSLO"].for_s + 2 * EVERY, f"TTFTOverSLO fired {late:.0f}s after the rollout"
    assert "TTFTOverSLO" in resolved and back < resolved["TTFTOverSLO"], (
        "TTFTOverSLO did not resolve after the rollback"
    )
    # the small caches (one long prompt fills 13 of their 16 blocks) fill in waves and drain between
    # them: busy, not saturated by each minute's mean, so KVCacheSaturated does not page, before the
    # rollout least of all (the waves are explain's evidence: KV-cache saturation's share of steps)
    assert "KVCacheSaturated" not in fired, fired

    still = {
        (name, i.labels.get("replica", i.labels.get("model")))
        for name in ("KVCacheSaturated", "TTFTOverSLO")
        for i in evaluator.states.get(name, {}).values()
        if i.state != "resolved"
    }
    assert not still, f"still pending or firing after the return to steady: {sorted(still)}"

    # what the on-call receiver got: Alertmanager payloads, firing then resolved, with links that explain
    posts = [json.loads(r.body) for r in receiver.requests]
    assert not [p for p in posts if p["groupLabels"] == {"alertname": "KVCacheSaturated"}]
    ttft = [p for p in posts if p["groupLabels"] == {"alertname": "TTFTOverSLO"}]
    assert ttft[0]["status"] == "firing" and ttft[0]["alerts"][0]["labels"]["model"] == "tiny-small"
    assert ttft[0]["alerts"][0]["generatorURL"].startswith("http://dash.example:8501/investigate?")
    assert ttft[-1]["status"] == "resolved"
    assert "x its SLO" in ttft[0]["alerts"][0]["annotations"]["summary"]
    assert len({r.key for r in receiver.requests}) == len(receiver.requests)  # nothing delivered twice

    # the history in ClickHouse tells the same story
    events = history(client, report.start, report.end + timedelta(minutes=1))
    states = [(e["rule"], e["state"]) for e in reversed(events) if e["rule"] == "TTFTOverSLO"]
    assert (
        states.index(("TTFTOverSLO", "pending"))
        < states.index(("TTFTOverSLO", "firing"))
        < states.index(("TTFTOverSLO", "resolved"))
    )


def test_a_stalled_engine_pages_within_its_for_names_only_that_replica_and_resolves(
    chdb_dir: Path, sqlite_url: str
) -> None:
    """``engine-stall``: small-1's engine freezes at 180 s (the simulator's test hook) and goes on at 540 s."""
    client = connect(f"chdb:{chdb_dir}", database=f"t_{uuid.uuid4().hex[:12]}", create_database=True)
    clickhouse_runner.apply(client)
    plan = load_scenario("engine-stall")
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
    report = replay(
        client, load_spec(ROOT / "fleet.yaml"), plan, start, interval_s=5.0, seed=1, duration_s=plan.duration_s
    )
    sessions = next(migrated_sessions(sqlite_url))
    settings = AlertsSettings.model_validate({})
    groups = [g for g in rule_groups(settings) if g.name == "capacity"]
    evaluator = Evaluator(groups, Context(client, sessions), sessions, settings)
    rule = next(r for g in groups for r in g.rules if r.name == "EngineStalled")
    frozen, resumed = start + timedelta(seconds=180), start + timedelta(seconds=540)
    firing: dict[str, datetime] = {}
    resolved: dict[str, datetime] = {}
    at = start
    while at <= report.end:
        for g in groups:
            for name, t in evaluator.evaluate_group(g, at).transitions:
                if name == "EngineStalled" and t.after == "firing":
                    firing.setdefault(t.labels["replica"], at)
                if name == "EngineStalled" and t.after == "resolved":
                    resolved[t.labels["replica"]] = at
        at += timedelta(seconds=EVERY)
    assert list(firing) == ["small-1"]
    # its threshold (2 min without a token), then for: 1m, within two evaluations and one 15 s step
    assert (
        frozen + timedelta(seconds=rule.threshold + rule.for_s)
        <= firing["small-1"]
        <= frozen + timedelta(seconds=rule.threshold + rule.for_s + 2 * EVERY + 15)
    )
    assert resumed < resolved["small-1"] <= resumed + timedelta(minutes=1)


def test_the_cost_jump_tickets_within_ten_minutes_of_the_router_shift_with_a_cost_link(
    chdb_dir: Path, sqlite_url: str
) -> None:
    """``router-shift``: acme's prompts pass the router's rule at +12 min; the small pool serves half
    its tokens for the same spend. The young fleet has no last week: the 15-minute rule fires."""
    client = connect(f"chdb:{chdb_dir}", database=f"t_{uuid.uuid4().hex[:12]}", create_database=True)
    clickhouse_runner.apply(client)
    plan = load_scenario("router-shift")
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=40)
    report = replay(client, load_spec(ROOT / "fleet.yaml"), plan, start, interval_s=5.0, seed=1)
    sessions = next(migrated_sessions(sqlite_url))  # the seeded GPU prices: cpu-demo at $0.10 an hour
    settings = AlertsSettings.model_validate({"external_url": "http://dash.example:8501"})
    groups = [g for g in rule_groups(settings) if g.name == "cost"]
    evaluator = Evaluator(groups, Context(client, sessions), sessions, settings)
    shift = report.phases["acme-long-prompts"]
    fired: dict[str, datetime] = {}
    at = start
    while at <= shift + timedelta(minutes=12):
        for g in groups:
            for name, t in evaluator.evaluate_group(g, at).transitions:
                if name == "CostPerTokenJump" and t.after == "firing":
                    fired.setdefault(t.labels["model"], at)
        at += timedelta(minutes=1)
    assert "tiny-small" in fired and shift < fired["tiny-small"] <= shift + timedelta(minutes=10)
    assert "tiny-large" not in fired  # the pool that gained the tokens got cheaper per token
    alert = next(a for a in evaluator.current_alerts() if a.labels.get("model") == "tiny-small")
    assert "/investigate?metric=cost&" in alert.generator_url and "model=tiny-small" in alert.generator_url
