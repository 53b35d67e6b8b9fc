"""Shedding told from failure by the built-in latency group, evaluated minute by minute as the
evaluator runs it, on hand-made gateway request-log rows: a model whose gateway sheds a fifth of
its requests (queue-time budget, and a tenant over its share) raises GatewayShedding, a ticket, and
not ErrorRatioHigh; a model whose requests time out raises ErrorRatioHigh, a page, and not
GatewayShedding."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from alerts.config import AlertsSettings, rule_groups
from alerts.evaluator import Evaluator
from alerts.expr import evaluate, parse_expr
from alerts.reading import Context
from migrations import clickhouse_runner
from tests.conftest import migrated_sessions

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def minute_rows(minute: int, model: str, outcomes: dict[str, int]) -> list[dict[str, Any]]:
    """One minute of a model's gateway-logged requests, ``outcomes``: how many of each, spread over it."""
    total = sum(outcomes.values())
    kinds = [o for o, n in outcomes.items() for _ in range(n)]
    return [
        {
            "ts": T0 + timedelta(minutes=minute, seconds=60 * i / total),
            "source": "gateway",
            "gateway": "fleetscope",
            "model": model,
            "tenant": "acme" if i % 2 else "globex",
            "outcome": outcome,
            "status_code": {"ok": 200, "timeout": 504}.get(outcome, 429),
            "ttft_seconds": 0.3 if outcome == "ok" else 0.0,
            "e2e_seconds": 1.0 if outcome == "ok" else 0.0,
            "weight": 1.0,
        }
        for i, outcome in enumerate(kinds)
    ]


@pytest.fixture
def store(ch: Any) -> Any:
    clickhouse_runner.apply(ch)
    rows = []
    for minute in range(20):
        rows += minute_rows(minute, "small", {"ok": 32, "shed_queue_time": 6, "shed_tenant_share": 2})
        rows += minute_rows(minute, "large", {"ok": 36, "timeout": 4})
    ch.insert_df("requests", pd.DataFrame(rows).astype({"weight": "float32"}))
    return ch


def test_shedding_raises_its_own_ticket_and_failures_page(store: Any, sqlite_url: str) -> None:
    sessions = next(migrated_sessions(sqlite_url))
    settings = AlertsSettings.model_validate({})
    group = next(g for g in rule_groups(settings) if g.name == "latency")
    evaluator = Evaluator([group], Context(store, sessions), sessions, settings)
    fired: dict[tuple[str, str], datetime] = {}
    t = T0 + timedelta(minutes=1)
    while t <= T0 + timedelta(minutes=15):
        for name, tr in evaluator.evaluate_group(group, t).transitions:
            if tr.after == "firing":
                fired.setdefault((name, tr.labels.get("model", "")), t)
        t += timedelta(minutes=1)
    # the shed model is not failing and the failing one is not shedding
    assert set(fired) == {("GatewayShedding", "small"), ("ErrorRatioHigh", "large")}, fired
    # for: 2m against ErrorRatioHigh's 5m, from the first evaluation that sees them
    assert fired[("GatewayShedding", "small")] <= T0 + timedelta(minutes=4)
    shed = next(a for a in evaluator.current_alerts() if a.labels["alertname"] == "GatewayShedding")
    assert shed.labels["severity"] == "ticket"
    assert shed.annotations["summary"].startswith(
        "the gateway shed 20% of small requests over 5m (queue-time budget 15%, tenant over its share 5%)"
    ), shed.annotations["summary"]
    failing = next(a for a in evaluator.current_alerts() if a.labels["alertname"] == "ErrorRatioHigh")
    assert failing.labels["severity"] == "page" and failing.annotations["summary"].startswith("10% of large")


def test_shed_ratio_by_tenant_and_its_extras(store: Any) -> None:
    at = T0 + timedelta(minutes=10)
    samples = evaluate(Context(store), parse_expr('shed_ratio{window="5m", by="tenant"}'), at)
    # each tenant sends half of each model's requests: 8 of small's 40 a minute shed, none of large's 40
    assert {s.labels["tenant"]: s.value for s in samples} == pytest.approx({"acme": 0.1, "globex": 0.1}, abs=0.01)
    assert all(s.extra["requests"] == pytest.approx(200, abs=2) for s in samples)
    by_model = {s.labels["model"]: s for s in evaluate(Context(store), parse_expr('shed_ratio{window="5m"}'), at)}
    assert by_model["large"].value == 0 and by_model["small"].extra["queue_time"] == pytest.approx(0.15)
