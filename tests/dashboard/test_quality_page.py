"""The Quality page under Streamlit's AppTest, on simulated runs stored in chDB.

``max-tokens-release`` (fleet.yaml): globex's client asks for max_tokens 40 from +600 s, so its
answers run into the limit: the page shows the truncation rate rising (its chart and its table per
tenant, the numbers ``analytics.quality`` gives), the explanation's sentence naming globex, and,
with no router audit configured, the no-audit state. ``refusing-adapter`` (fleet-spec-lora.yaml):
initech's traffic moves to the adapter guard-bot, which refuses: the refusal rate per model names
guard-bot. Hand-made shadow rows (migration 0015's columns) fill the router-audit table."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analytics.quality import quality_rates
from dashboard.context import use_stores
from dashboard.view import read_view
from migrations import clickhouse_runner
from tests.alerts.test_quality_rules import T0, audit_rows, store_rows
from tests.analytics.scenario_data import play
from tests.dashboard.apptest import chart_frames, on_store, run, window


@pytest.fixture(scope="module")
def release(chdb_dir: Path) -> Any:
    return play(chdb_dir, "max-tokens-release", seed=1)


@pytest.fixture(scope="module")
def refusing(chdb_dir: Path) -> Any:
    return play(chdb_dir, "refusing-adapter", seed=1, spec="fleet-spec-lora.yaml")


def by(at: Any, value: str) -> Any:
    """The page again with its breakdown radio set to ``value``."""
    radio = next(r for r in at.radio if r.key == "quality_by")
    return radio.set_value(value).run()


def rates_table(at: Any, group: str) -> pd.DataFrame:
    return next(t.value for t in at.dataframe if group in t.value.columns and "Truncated" in t.value.columns)


def test_the_release_shows_globex_truncation_rising_explained_and_no_audit(release, sessions, chdb_dir) -> None:
    use_stores(release.client, sessions, on_store(chdb_dir))
    at = by(run("quality", **window(release)), "tenant")
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    assert at.title[0].value == "Quality"
    # the explanation's sentence, from analytics.explain.quality: globex and its max_tokens
    [said] = [w.value for w in at.warning]
    assert "Truncation rate rose" in said and "globex" in said and "max_tokens" in said, said

    # the truncation chart: globex's line rises after the release, nobody else's moves
    released = pd.Timestamp(release.phase("globex-client-release"))
    [drawn] = [f for f in chart_frames(at) if "truncation" in f.columns and "tenant" in f.columns]
    drawn = drawn.dropna(subset=["truncation"]).assign(ts=lambda d: pd.to_datetime(d["ts"], utc=True))
    before = drawn[drawn["ts"] + timedelta(minutes=1) <= released]
    after = drawn[drawn["ts"] >= released + timedelta(minutes=1)]
    assert before["truncation"].max() == 0
    globex = after[after["tenant"] == "globex"]["truncation"]
    assert globex.mean() > 0.5 and (after[after["tenant"] != "globex"]["truncation"] == 0).all()

    # the table per tenant over the window: the figures analytics gives for the same view
    shown = rates_table(at, "Tenant").set_index("Tenant")
    view = read_view(window(release))
    want = quality_rates(release.client, view.start, view.end, by="tenant").set_index("tenant")
    assert shown.loc["globex", "Truncated"] == pytest.approx(want.loc["globex", "truncation_rate"], rel=1e-3)
    assert shown.loc["globex", "Truncated"] > 0.2 and shown.loc["acme", "Truncated"] == 0
    share = want["evaluated"] / want["requests"]
    assert shown["Evaluated share"].to_dict() == pytest.approx(share.loc[shown.index].to_dict(), rel=1e-3)
    assert share.min() > 0.15 and share.max() < 0.35  # the bundled fleet scores a quarter of the answers

    # no router audit in this fleet: the page says how to turn it on
    assert any("No router-audit data" in i.value and "gateway.router_audit" in i.value for i in at.info)


def test_the_refusing_adapter_is_named_by_the_refusal_rate_per_model(refusing, sessions, chdb_dir) -> None:
    use_stores(refusing.client, sessions, on_store(chdb_dir))
    at = run("quality", **window(refusing))  # by model (an adapter is its own model) by default
    assert not at.exception and not at.error
    [said] = [w.value for w in at.warning]
    assert "Refusal rate rose" in said and "guard-bot" in said and "initech" in said, said
    shown = rates_table(at, "Model").set_index("Model")
    assert shown.loc["guard-bot", "Refused"] == pytest.approx(1.0)
    assert (shown.drop(index="guard-bot")["Refused"] == 0).all()
    [drawn] = [f for f in chart_frames(at) if "refusal" in f.columns and "model" in f.columns]
    assert set(drawn["model"].dropna()) >= {"guard-bot", "tiny-small", "tiny-large"}
    assert drawn[drawn["model"] == "guard-bot"]["refusal"].dropna().min() == 1.0
    # the per-tenant view: initech refuses from the switch on
    tenants = rates_table(by(at, "tenant"), "Tenant").set_index("Tenant")
    assert tenants["Refused"].idxmax() == "initech"


def test_audit_rows_fill_the_router_audit_table(ch, sessions, chdb_dir) -> None:
    """Hand-made router-audit rows (tests/alerts/test_quality_rules.py): the table per route reason and
    direction, the audits counted, the measured extra load; no scored answers: the page says so."""
    clickhouse_runner.apply(ch)
    store_rows(
        ch, audit_rows("long prompt", "small_to_large", 0.2, 30) + audit_rows("easy request", "large_to_small", 0.7, 12)
    )
    use_stores(ch, sessions, on_store(chdb_dir))
    at = run("quality", **{"from": T0.isoformat(), "to": (T0 + timedelta(hours=1)).isoformat()})
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("None of the requests" in i.value and "gateway.quality.sample_rate" in i.value for i in at.info)
    assert not any("No router-audit data" in i.value for i in at.info)
    audit = next(t.value for t in at.dataframe if "Agreement (word F1)" in t.value.columns)
    rows = audit.set_index("Route reason")
    assert rows.loc["long prompt", "Direction"] == "sent small, replayed large"
    assert rows.loc["easy request", "Direction"] == "sent large, replayed small"
    assert rows["Agreement (word F1)"].to_dict() == pytest.approx({"long prompt": 0.2, "easy request": 0.7})
    assert rows["Audits"].to_dict() == {"long prompt": 30, "easy request": 12}
    assert (
        rows.loc["long prompt", "Routed to"] == "tiny-small" and rows.loc["long prompt", "Replayed on"] == "tiny-large"
    )
    metrics = {m.label: m.value for m in at.metric}
    # every user's request shadowed with the same tokens: the audit doubled the load
    assert metrics["Audits"] == "42" and metrics["Audit's extra load"] == "100.0%"
