"""The Traffic page's admission section under AppTest, on hand-written gateway request-log rows:
the shed and refused shares, throughput and goodput are what is counted by hand, the refusals
chart holds each reason's requests, and goodput is drawn beside throughput (below it where answers
came late); over a window the gateway refused nothing in, the page says so and draws no refusal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from dashboard.context import use_stores
from migrations import clickhouse_runner
from storage.catalog import SloTarget, set_slo
from tests.conftest import migrated_sessions
from tests.dashboard.apptest import chart_frames, on_store, run

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
START = NOW - timedelta(minutes=20)


def _row(at: datetime, outcome: str, ttft: float) -> dict[str, Any]:
    """One gateway-logged request of tiny-small for acme (no TTFT when it was refused)."""
    return {
        "ts": at,
        "source": "gateway",
        "gateway": "fleetscope",
        "model": "tiny-small",
        "tenant": "acme",
        "outcome": outcome,
        "status_code": 200 if outcome == "ok" else 429,
        "ttft_seconds": ttft,
        "e2e_seconds": ttft + 1.0 if ttft else 0.0,
        "prompt_tokens": 100,
        "completion_tokens": 20 if ttft else 0,
        "weight": 1.0,
    }


def rows() -> list[dict[str, Any]]:
    """Three quiet minutes from START (20 requests each, all answered in time, TTFT 0.4 s); then ten
    minutes, 60 requests a minute from START + 5m: per minute 40 answered in time (TTFT 0.5 s), 8
    answered late (3 s against a 2 s target), 9 shed by queue-time budget, 2 tenant share, 1 over its
    rate."""
    kinds = [("ok", 0.5)] * 40 + [("ok", 3.0)] * 8 + [("shed_queue_time", 0.0)] * 9
    kinds += [("shed_tenant_share", 0.0)] * 2 + [("rejected", 0.0)]
    out = [_row(START + timedelta(minutes=m, seconds=3 * i), "ok", 0.4) for m in range(3) for i in range(20)]
    for minute in range(5, 15):
        out += [_row(START + timedelta(minutes=minute, seconds=i), o, t) for i, (o, t) in enumerate(kinds)]
    return out


@pytest.fixture
def page_stores(ch: Any, sqlite_url: str, chdb_dir: Any) -> Any:
    clickhouse_runner.apply(ch)
    ch.insert_df("requests", pd.DataFrame(rows()).astype({"weight": "float32"}))
    sessions = next(migrated_sessions(sqlite_url))
    set_slo(sessions, SloTarget("tiny-small", "ttft", 2.0))
    use_stores(ch, sessions, on_store(chdb_dir))
    return ch


def test_refusals_by_reason_and_goodput_beside_throughput(page_stores: Any) -> None:
    at = run("traffic", **{"from": (START + timedelta(minutes=5)).isoformat(), "to": NOW.isoformat()})
    assert not at.exception, at.exception
    assert "Admission at the gateway" in [h.value for h in at.subheader]
    metrics = {m.label: m.value for m in at.metric}
    # 11 of 60 shed, 12 of 60 refused; 48 answered and 40 in time a minute, over the 15-minute window
    assert metrics["Shed"] == "18.3%" and metrics["All refusals"] == "20.0%"
    assert metrics["Throughput"] == f"{480 / 900:.2f}/s" and metrics["Goodput"] == f"{400 / 900:.2f}/s"
    frames = chart_frames(at)
    refused = next(f for f in frames if "reason" in f.columns)
    per_reason = refused.groupby("reason")["n"].sum().to_dict()
    assert per_reason == {"queue-time budget": 90, "tenant over its share": 20, "rate limit or gateway full": 10}
    served = next(f for f in frames if "what" in f.columns).dropna(subset=["per_s"])
    totals = served.groupby("what")["per_s"].sum()  # the same steps: their sums stand as the counts do
    assert totals["goodput (within the TTFT target)"] / totals["throughput (answered)"] == pytest.approx(40 / 48)


def test_a_window_without_refusals_says_so(page_stores: Any) -> None:
    at = run("traffic", **{"from": START.isoformat(), "to": (START + timedelta(minutes=4)).isoformat()})
    assert not at.exception, at.exception
    assert {m.label: m.value for m in at.metric}["Shed"] == "0.0%"
    assert any(c.value.startswith("The gateway refused nothing between") for c in at.caption)
    assert not [f for f in chart_frames(at) if "reason" in f.columns]
