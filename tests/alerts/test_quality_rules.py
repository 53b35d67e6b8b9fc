"""The built-in quality rules (RefusalRateHigh, TruncationRateHigh, RouterAgreementLow) evaluated
minute by minute as the evaluator runs them, on what the Quality page shows.

``max-tokens-release`` (simulator, fleet.yaml): globex's client lowers max_tokens to 40 at +600 s:
TruncationRateHigh fires for globex after the release and for nobody before it; no refusal rule.
``refusing-adapter`` (fleet-spec-lora.yaml): initech's traffic moves to the adapter guard-bot,
which refuses: RefusalRateHigh fires for guard-bot after the switch. The router audit's agreement
from hand-made rows (migration 0015's columns): a route reason whose shadows agree below the floor
fires, one above it does not, nor one with too few audits."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from alerts.config import AlertsSettings, rule_groups
from alerts.evaluator import Evaluator
from alerts.expr import evaluate, parse_expr
from alerts.reading import Context
from migrations import clickhouse_runner
from tests.analytics.scenario_data import play
from tests.conftest import migrated_sessions

Times = dict[tuple[str, str], datetime]
KEY = {"RefusalRateHigh": "model", "TruncationRateHigh": "tenant", "RouterAgreementLow": "route_reason"}
TYPES = {"weight": "float32", "agreement": "float32"}
USER = {"audit_of": "", "audit_direction": "", "agreement": -1.0}  # a user's row: shadows nothing (the defaults)


@pytest.fixture
def sessions(sqlite_url: str) -> Any:
    return next(migrated_sessions(sqlite_url))


def evaluated(client: Any, sessions: Any, start: datetime, end: datetime) -> tuple[Times, Evaluator]:
    """The built-in quality group evaluated every minute from ``start`` to ``end``: the first firing
    time of each (rule, its group's label), and the evaluator."""
    settings = AlertsSettings.model_validate({"external_url": "http://dash.example:8501"})
    groups = [g for g in rule_groups(settings) if g.name == "quality"]
    assert [r.name for r in groups[0].rules] == list(KEY)
    evaluator = Evaluator(groups, Context(client, sessions), sessions, settings)
    fired: Times = {}
    t = start
    while t <= end:
        for name, tr in evaluator.evaluate_group(groups[0], t).transitions:
            assert "alertstate_reason" not in tr.labels, (name, tr.labels)  # no Error / NoData alert
            if tr.after == "firing":
                fired.setdefault((name, tr.labels.get(KEY[name], "")), t)
        t += timedelta(minutes=1)
    return fired, evaluator


def alert(evaluator: Evaluator, name: str) -> Any:
    return next(a for a in evaluator.current_alerts() if a.labels["alertname"] == name)


def test_truncation_rate_high_fires_for_globex_after_its_release_and_not_before(chdb_dir: Path, sessions) -> None:
    run = play(chdb_dir, "max-tokens-release", seed=1)
    released = run.phase("globex-client-release")
    fired, evaluator = evaluated(run.client, sessions, run.start, run.end)
    assert set(fired) == {("TruncationRateHigh", "globex")}, fired
    # 10-minute windows: over 20 % about 3 minutes after the release, then for 3m
    assert released + timedelta(minutes=3) <= fired[("TruncationRateHigh", "globex")] <= released + timedelta(minutes=9)
    found = alert(evaluator, "TruncationRateHigh")
    assert found.labels == {
        "alertname": "TruncationRateHigh",
        "tenant": "globex",
        "severity": "warning",
        "team": "inference",
    }
    assert found.annotations["summary"].endswith("answers scored)")
    assert "of tenant globex are cut at max_tokens" in found.annotations["summary"]
    assert found.annotations["dashboard"] == "quality?tenant=globex"  # the Quality page, filtered to globex
    assert found.generator_url.startswith("http://dash.example:8501/quality?from=")  # the notification's link
    assert "tenant=globex" in found.generator_url and "metric=" not in found.generator_url
    # min_evaluated: a group whose window holds fewer scored answers answers nothing (globex holds ~90)
    after = released + timedelta(minutes=10)
    few = parse_expr('truncation_rate{window="10m", by="tenant", min_evaluated="20"}')
    many = parse_expr('truncation_rate{window="10m", by="tenant", min_evaluated="1000"}')
    rates = {s.labels["tenant"]: s for s in evaluate(Context(run.client), few, after)}
    assert set(rates) == {"acme", "globex", "initech"} and rates["globex"].value > 0.5
    assert rates["globex"].extra["evaluated"] >= 20 and rates["acme"].value == 0
    assert evaluate(Context(run.client), many, after) == []


def test_refusal_rate_high_fires_for_the_refusing_adapter(chdb_dir: Path, sessions) -> None:
    run = play(chdb_dir, "refusing-adapter", seed=1, spec="fleet-spec-lora.yaml")
    switched = run.phase("initech-to-guard-bot")
    fired, evaluator = evaluated(run.client, sessions, run.start, run.end)
    assert set(fired) == {("RefusalRateHigh", "guard-bot")}, fired
    assert switched < fired[("RefusalRateHigh", "guard-bot")] <= switched + timedelta(minutes=9)
    found = alert(evaluator, "RefusalRateHigh")
    assert found.annotations["summary"].startswith("100% of the answers of guard-bot are refusals")
    assert found.annotations["dashboard"] == "quality?model=guard-bot"


T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def audit_rows(reason: str, direction: str, agreement: float, n: int, start: datetime = T0) -> list[dict[str, Any]]:
    """``n`` users' requests the model router sent (``direction``) for ``reason``, one a minute, each
    shadowed on the other model with the given word agreement."""
    routed, other = ("tiny-small", "tiny-large") if direction == "small_to_large" else ("tiny-large", "tiny-small")
    rows = []
    for i in range(n):
        trace = uuid.uuid4().hex
        common = {
            "source": "gateway",
            "route_reason": f"{reason} (rule)",
            "outcome": "ok",
            "weight": 1.0,
            "prompt_tokens": 200,
            "completion_tokens": 40,
        }
        at = start + timedelta(minutes=i)
        rows.append(
            {**common, "ts": at, "trace_id": trace, "model": routed, "route": "model-router:x", "tenant": "a", **USER}
        )
        rows.append(
            {
                **common,
                "ts": at + timedelta(seconds=5),
                "trace_id": uuid.uuid4().hex,
                "model": other,
                "route": "shadow",
                "tenant": "router-audit",
                "audit_of": trace,
                "audit_direction": direction,
                "agreement": agreement,
            }
        )
    return rows


def store_rows(client: Any, rows: list[dict[str, Any]]) -> None:
    client.insert_df("requests", pd.DataFrame(rows).astype(TYPES))


def test_router_agreement_low_fires_below_the_floor_and_not_above(ch: Any, sessions) -> None:
    clickhouse_runner.apply(ch)
    store_rows(
        ch,
        audit_rows("long prompt", "small_to_large", 0.2, 40)  # below the 0.3 floor
        + audit_rows("easy request", "small_to_large", 0.6, 40)  # above it
        + audit_rows("high max_tokens", "large_to_small", 0.1, 10),  # below, but 10 audits: under min_audits
    )
    ctx = Context(ch)
    samples = evaluate(ctx, parse_expr('router_agreement{window="1h"}'), T0 + timedelta(minutes=45))
    values = {(s.labels["route_reason"], s.labels["direction"]): s.value for s in samples}
    assert values == pytest.approx({("long prompt", "small_to_large"): 0.2, ("easy request", "small_to_large"): 0.6})
    fired, evaluator = evaluated(ch, sessions, T0, T0 + timedelta(minutes=45))
    # the 20th audit answered at 19:05, so the 20:00 evaluation holds 20 of them; below the floor from then,
    # for 10m; the agreeing reason and the one with 10 audits never fire
    assert fired == {("RouterAgreementLow", "long prompt"): T0 + timedelta(minutes=30)}
    found = alert(evaluator, "RouterAgreementLow")
    assert found.labels["direction"] == "small_to_large"
    assert found.annotations["summary"].startswith("the model router's 'long prompt' decisions (small_to_large)")
    assert "100% of the audits below 0.5" in found.annotations["description"]
