"""The Capacity page's elasticity section on a played run with the autoscaler's decisions in the
store: the cold-start row with its times, replicas per pool over time with the decision drawn at
the size it asked for, headroom priced per hour, and the scale event as a marker on every time
chart of the page (and of another page)."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import pytest

from analytics.elasticity import headroom, replicas_over_time
from dashboard.context import use_stores
from dashboard.view import read_view
from fleetscope.settings import load_settings
from storage.catalog import gpu_prices
from tests.analytics.scale_rows import scale_out
from tests.analytics.scenario_data import play
from tests.dashboard.apptest import ROOT, chart_frames, run, window

TITLE = "tiny-large 1 -> 2 (kv_cache_usage 0.86 > 0.8)"


@pytest.fixture(scope="module")
def scaled(chdb_dir):
    """router-shift (acme's prompts reach tiny-large at +12 min) with the autoscaler's answer written
    down: tiny-large 1 -> 2 decided 30 s after the shift, large-1 healthy 40 s and first serving 42 s later."""
    played = play(chdb_dir, "router-shift", seed=1)
    decided = played.phase("acme-long-prompts") + timedelta(seconds=30)
    scale_out(played.client, "tiny-large", decided, "large-1", crossed_s=15, ready_s=40, serving_s=42)
    return played, decided


def test_capacity_page_shows_the_cold_start_and_the_replicas_per_pool(scaled, sessions) -> None:
    played, decided = scaled
    use_stores(played.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("capacity", **window(played))
    assert not at.exception
    starts = next(t.value for t in at.dataframe if "Time to first token" in t.value.columns)
    row = starts.set_index("Replica").loc["large-1"]
    assert row["Pool"] == "tiny-large"
    assert pd.Timestamp(row["Decided"]) == pd.Timestamp(decided).floor("ms")
    assert pd.Timestamp(row["Healthy"]) == pd.Timestamp(decided + timedelta(seconds=40)).floor("ms")
    assert pd.Timestamp(row["First token"]) == pd.Timestamp(decided + timedelta(seconds=42)).floor("ms")
    # seconds from the decision, and from the signal's crossing 15 s before it
    assert (row["Time to ready"], row["Time to first token"], row["Scale-out lag"]) == pytest.approx((40, 42, 57))

    frames = chart_frames(at)
    view = read_view(window(played))
    [drawn] = [f for f in frames if list(f.columns) == ["ts", "pool", "replicas"]]
    want = replicas_over_time(played.client, view.start, view.end, 60)
    # the bundled fleet: two tiny-small replicas and one tiny-large, every minute of the run
    middle = drawn[pd.to_datetime(drawn["ts"], utc=True) < pd.Timestamp(played.end) - timedelta(minutes=2)]
    per_pool = middle.dropna().groupby("pool")["replicas"].median().to_dict()
    assert per_pool == {"tiny-large": pytest.approx(1.0), "tiny-small": pytest.approx(2.0)}
    assert set(want["pool"]) == set(drawn["pool"].dropna())
    [decision] = [f for f in frames if "decision" in f.columns]
    assert decision[["pool", "decision", "replicas"]].to_dict("records") == [
        {"pool": "tiny-large", "decision": "scale out", "replicas": 2.0}
    ]

    spare = next(t.value for t in at.dataframe if "Spare capacity ($/h, avg)" in t.value.columns)
    room = headroom(played.client, view.start, view.end, 60, prices=gpu_prices(sessions))
    expected = room.groupby("pool")["headroom_usd_per_hour"].mean()
    shown = spare.set_index("Pool")["Spare capacity ($/h, avg)"]
    assert shown.to_numpy(float) == pytest.approx(expected.reindex(shown.index).to_numpy(float), rel=1e-3)
    assert (shown > 0).all()  # a lightly loaded fleet pays for spare replicas


def test_a_scale_event_marks_every_time_chart(scaled, sessions) -> None:
    played, _decided = scaled
    use_stores(played.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    for page in ("capacity", "overview", "cost"):
        at = run(page, **window(played))
        assert not at.exception
        charts = at.get("vega_lite_chart")
        marked = [c for c in charts if any(TITLE.encode() in d.data.data for d in c.proto.datasets)]
        assert marked and all('"rule"' in c.proto.spec for c in marked), page
        assert len(marked) == len([c for c in charts if "temporal" in c.proto.spec]), page  # every time chart
        # the marker's text says the cold start (on hover)
        assert all(
            any(b"large-1 ready +40 s, first token +42 s" in d.data.data for d in c.proto.datasets) for c in marked
        )
