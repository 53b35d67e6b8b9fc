"""``explain`` names the gateway's shedding as its answer to a regression, not a cause: on a
hand-made gateway request log in chDB (tiny-small's TTFT rises from 0.3 s to 2.5 s at 12:10 while
the gateway sheds 18 % of the requests by queue-time budget, and another tenant's traffic
arrives), the evidence lists "gateway shedding" after the causes, the onset is not taken from it,
and the sentence says "the gateway shed 18% of requests (queue-time budget) while tiny-small was
saturated"; a log with nothing shed has no such row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from analytics.explain import explain
from analytics.explain.model import GATEWAY_SHED
from migrations import clickhouse_runner

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
BREAK = T0 + timedelta(minutes=10)
END = T0 + timedelta(minutes=20)


def rows(shed_share: float) -> list[dict[str, Any]]:
    """One request every 2 s for 20 minutes: acme's at 0.3 s TTFT; from BREAK, half of them batch's
    at 2.5 s, and ``shed_share`` of all of them shed by queue-time budget (no TTFT)."""
    out = []
    for i in range(600):
        at = T0 + timedelta(seconds=2 * i)
        late = at >= BREAK
        shed = late and (i % 50) < round(50 * shed_share)
        tenant = "batch" if late and i % 2 else "acme"
        ttft = 0.0 if shed else (2.5 if late else 0.3) * (1 + (i % 7) / 50)
        out.append(
            {
                "ts": at,
                "source": "gateway",
                "gateway": "fleetscope",
                "model": "tiny-small",
                "tenant": tenant,
                "route": "least-loaded",
                "outcome": "shed_queue_time" if shed else "ok",
                "status_code": 429 if shed else 200,
                "ttft_seconds": ttft,
                "e2e_seconds": ttft + 1.0 if ttft else 0.0,
                "prompt_tokens": 200,
                "completion_tokens": 40,
                "weight": 1.0,
            }
        )
    return out


def store(ch: Any, shed_share: float) -> Any:
    clickhouse_runner.apply(ch)
    ch.insert_df("requests", pd.DataFrame(rows(shed_share)).astype({"weight": "float32"}))
    return ch


def test_shedding_is_named_as_the_gateways_answer(ch: Any) -> None:
    ex = explain(store(ch, 0.18), T0, END, step=30)
    assert ex.break_at is not None and abs((ex.break_at - BREAK).total_seconds()) <= 60, ex.break_at
    signals = list(ex.evidence["signal"])
    assert signals[-1] == GATEWAY_SHED, signals  # after the causes, whatever its score
    shed = ex.evidence.iloc[-1]
    assert (shed["before"], shed["after"]) == ("0% shed", "18% shed")
    assert shed["score"] == pytest.approx(0.18, abs=0.01)
    assert "the gateway shed 18% of requests (queue-time budget) while tiny-small was saturated" in ex.sentence
    assert "gateway shedding (" not in ex.sentence  # not among the causes
    assert "tenant mix" in ex.sentence  # the cause: batch's traffic


def test_nothing_shed_no_row(ch: Any) -> None:
    ex = explain(store(ch, 0.0), T0, END, step=30)
    assert ex.break_at is not None
    assert GATEWAY_SHED not in set(ex.evidence["signal"]) and "shed" not in ex.sentence


def held_rows(shed_every: int) -> list[dict[str, Any]]:
    """One request every 2 s for 20 minutes at a flat 0.3 s TTFT (the admitted ones); from 12:08
    to 12:14 all but one in ``shed_every`` shed by queue-time budget (0: none)."""
    out = []
    for r in rows(0.0):
        late = T0 + timedelta(minutes=8) <= r["ts"] < T0 + timedelta(minutes=14)
        i = int((r["ts"] - T0).total_seconds()) // 2
        if shed_every and late and i % shed_every:
            r.update(outcome="shed_queue_time", status_code=429, ttft_seconds=0.0, e2e_seconds=0.0)
        elif r["ttft_seconds"]:
            r.update(ttft_seconds=0.3 * (1 + (i % 7) / 50), tenant="acme")
        out.append(r)
    return out


def test_no_rise_because_the_gateway_shed_says_so(ch: Any) -> None:
    clickhouse_runner.apply(ch)
    ch.insert_df("requests", pd.DataFrame(held_rows(3)).astype({"weight": "float32"}))
    ex = explain(ch, T0, END, step=30)
    assert ex.break_at is None  # the admitted requests' TTFT never rose
    assert list(ex.evidence["signal"]) == [GATEWAY_SHED], ex.evidence
    row = ex.evidence.iloc[0]
    assert (row["before"], row["after"]) == ("0% shed", "67% shed"), row  # two in three, in its episode
    assert ex.sentence.startswith("p99 ttft shows no lasting rise between 12:00 and 12:20 UTC: ")
    assert "the gateway shed 67% of requests (queue-time budget) while tiny-small was saturated" in ex.sentence
    assert "from 12:08:00 to 12:14:00" in ex.sentence, ex.sentence


def test_no_rise_and_a_stray_shed_request_is_no_story(ch: Any) -> None:
    clickhouse_runner.apply(ch)
    log = held_rows(0)
    log[300].update(outcome="shed_queue_time", status_code=429, ttft_seconds=0.0, e2e_seconds=0.0)
    ch.insert_df("requests", pd.DataFrame(log).astype({"weight": "float32"}))
    ex = explain(ch, T0, END, step=30)
    assert ex.break_at is None and ex.evidence.empty, ex.evidence
    assert ex.sentence == "p99 ttft shows no lasting rise between 12:00 and 12:20 UTC."
