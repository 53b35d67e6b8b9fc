"""Admission at the gateway (analytics.admission) on hand-written request-log rows in chDB: the
refusals by reason, the shed share, throughput and goodput against each model's TTFT target equal
what is counted by hand; weights count; engine rows and shadow requests are not read; shedding is
not a server error."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from analytics.admission import admission, over_window
from analytics.errors import BadInput
from analytics.requests import error_ratio
from migrations import clickhouse_runner

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
WINDOW = (T0, T0 + timedelta(minutes=10))
TARGETS = {"small": 2.0}  # "large" has no target


def row(
    minute: float, model: str, tenant: str, outcome: str, ttft: float = 0.0, e2e: float = 0.0, weight: float = 1.0
) -> dict[str, Any]:
    return {
        "ts": T0 + timedelta(minutes=minute),
        "source": "gateway",
        "gateway": "fleetscope",
        "model": model,
        "tenant": tenant,
        "outcome": outcome,
        "status_code": 200 if outcome == "ok" else 429,
        "ttft_seconds": ttft,
        "e2e_seconds": e2e,
        "weight": weight,
        "audit_of": "",
    }


ROWS = [
    row(1, "small", "acme", "ok", ttft=0.5, e2e=3.0),  # good: its TTFT
    row(1, "small", "acme", "ok", ttft=2.5, e2e=4.0, weight=2.0),  # answered, late
    row(2, "small", "acme", "ok", ttft=0.0, e2e=1.5),  # not streamed: its whole answer, in time
    row(2, "small", "acme", "shed_queue_time", weight=3.0),
    row(3, "small", "globex", "shed_tenant_share"),
    row(6, "small", "globex", "rejected"),
    row(7, "small", "globex", "timeout"),
    row(4, "large", "acme", "ok", ttft=9.0, e2e=12.0),
    row(8, "large", "acme", "no_replica"),
    {**row(1, "small", "", "ok", ttft=0.4), "source": "otlp", "gateway": ""},  # an engine span: not read
    {**row(2, "small", "acme", "ok", ttft=0.1), "audit_of": "x"},  # a router-audit shadow: not read
    row(12, "small", "acme", "shed_queue_time"),  # outside the window
]


@pytest.fixture
def store(ch: Any) -> Any:
    clickhouse_runner.apply(ch)
    ch.insert_df("requests", pd.DataFrame(ROWS))
    return ch


def test_refusals_by_reason_and_goodput_by_model(store: Any) -> None:
    df = admission(store, *WINDOW, TARGETS).set_index("model")
    small, large = df.loc["small"], df.loc["large"]
    assert small["requests"] == 10.0  # 1 + 2 + 1 + 3 + 1 + 1 + 1
    assert small["answered"] == 4.0
    assert (small["shed_queue_time"], small["shed_tenant_share"], small["rejected"]) == (3.0, 1.0, 1.0)
    assert small["shed"] == 4.0 and small["shed_share"] == pytest.approx(0.4)
    assert small["refused_share"] == pytest.approx(0.5)
    assert small["good"] == 2.0  # the 0.5 s TTFT and the 1.5 s non-streamed answer
    seconds = 600.0
    assert small["throughput_per_s"] == pytest.approx(4.0 / seconds)
    assert small["goodput_per_s"] == pytest.approx(2.0 / seconds)
    assert large["no_replica"] == 1.0 and large["answered"] == 1.0
    assert math.isnan(large["good"]) and math.isnan(large["goodput_per_s"])  # no target: no goodput
    by_tenant = admission(store, *WINDOW, TARGETS, by="tenant").set_index("tenant")
    assert by_tenant.loc["acme", "shed_queue_time"] == 3.0 and by_tenant.loc["globex", "shed_tenant_share"] == 1.0


def test_over_time_each_step_counts_its_own(store: Any) -> None:
    df = admission(store, *WINDOW, TARGETS, by="model", step_s=300)
    small = df[df["model"] == "small"].set_index("ts")
    first, second = small.loc[pd.Timestamp(T0)], small.loc[pd.Timestamp(T0 + timedelta(minutes=5))]
    assert (first["requests"], first["shed"], first["good"]) == (8.0, 4.0, 2.0)
    assert (second["requests"], second["rejected"], second["answered"]) == (2.0, 1.0, 0.0)
    assert first["goodput_per_s"] == pytest.approx(2.0 / 300)
    assert df.attrs["seconds"] == 300.0


def test_the_steps_summed_are_the_window(store: Any) -> None:
    # the page reads the steps once and shows the window's figures from them
    whole = admission(store, *WINDOW, TARGETS, by=None).iloc[0]
    summed = over_window(admission(store, *WINDOW, TARGETS, by=None, step_s=300)).iloc[0]
    for name in ("requests", "answered", "good", "shed", "shed_share", "refused_share", "goodput_per_s"):
        assert summed[name] == pytest.approx(whole[name]), name
    assert summed["throughput_per_s"] == pytest.approx(whole["throughput_per_s"])


def test_shedding_is_not_a_server_error(store: Any) -> None:
    errors = error_ratio(store, *WINDOW, ("model",)).set_index("model")
    # small: the fixed-limit refusal and the timeout count; the four shed requests do not
    assert errors.loc["small", "errors"] == 2.0


def test_bad_input_is_refused(store: Any) -> None:
    with pytest.raises(BadInput, match="cannot group admission by outcome"):
        admission(store, *WINDOW, TARGETS, by="outcome")
    with pytest.raises(BadInput, match="must end after it starts"):
        admission(store, WINDOW[1], WINDOW[0], TARGETS)
