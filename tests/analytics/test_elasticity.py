"""Elasticity observed, on a hand-written autoscaled fleet (tests/analytics/elasticity_data.py: a
tiny-large pool scaled 1 -> 2 -> 1 -> 2 and held at max, its replica large-1 up from minute 20 to
40): cold start times and lag by decision, replicas over time with a replica that comes and goes
(0 is a value, not a gap), flapping, headroom and its dollars, the cold start not billed, the
spend per hour's jump, chart markers, and a replica a scale-in removed is retired, not down."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analytics.cost import gpu_spend
from analytics.cost_series import cost_over_time
from analytics.elasticity import (
    cold_starts,
    flapping,
    headroom,
    replicas_over_time,
    scale_events,
    scale_marks,
    spend_per_hour,
)
from analytics.errors import BadInput, NoPrice
from analytics.health import current, scrape_health, silent_targets
from tests.analytics.elasticity_data import PRICES, T0, WINDOW, at, autoscaled_fleet


@pytest.fixture
def fleet(ch: Any, tmp_path: Path) -> Any:
    autoscaled_fleet(ch, tmp_path / "spool")
    return ch


def test_cold_starts_time_each_scale_out_from_its_decision_and_its_signal(fleet: Any) -> None:
    starts = cold_starts(fleet, *WINDOW).set_index("decision_id")
    assert list(starts.index) == ["d1", "d2"]  # the scale-outs only, in decision order
    d1 = starts.loc["d1"]
    # decided 18:30, ready 19:50, first token 20:05; the KV signal crossed at 18:15
    assert d1["replica"] == "large-1"  # named by its ready step: the decision did not name it
    assert (d1["time_to_ready_s"], d1["time_to_first_token_s"], d1["scale_out_lag_s"]) == (80.0, 95.0, 110.0)
    d2 = starts.loc["d2"]  # ready at 51:00, never served
    assert d2["time_to_ready_s"] == 60.0 and pd.isna(d2["serving_at"])
    assert math.isnan(d2["time_to_first_token_s"]) and math.isnan(d2["scale_out_lag_s"])
    # read as of a time before its first token, d1 is not serving yet
    early = cold_starts(fleet, T0, at(20)).set_index("decision_id")
    assert early.loc["d1", "time_to_ready_s"] == 80.0 and math.isnan(early.loc["d1", "scale_out_lag_s"])


def test_scale_events_are_read_back_in_time_order_with_utc_times(fleet: Any) -> None:
    df = scale_events(fleet, *WINDOW, pools=["tiny-large"])
    assert list(df["kind"]) == [
        "scale_out", "ready", "serving", "scale_in", "draining", "removed", "scale_out", "ready", "held_at_max",
    ]  # fmt: skip
    assert df["ts"].iloc[0] == pd.Timestamp(at(18.5)) and str(df["ts"].dt.tz) == "UTC"
    assert df["crossed_at"].iloc[0] == pd.Timestamp(at(18.25))
    assert scale_events(fleet, *WINDOW, pools=["tiny-small"]).empty


def test_replicas_over_time_counts_a_replica_that_comes_and_goes_and_zero_is_a_value(fleet: Any) -> None:
    df = replicas_over_time(fleet, *WINDOW, 300)
    large = df[df["pool"] == "tiny-large"].set_index("ts")["replicas"]
    assert len(large) == 12  # every 5-minute step of the hour: no gap where a replica was away
    # large-1 first scraped at 20:00 (45 s of its first minute: from its first sample to its last),
    # up to 40:00: 285 s of the 20-25 step, all of 25-40, 15 s of 40-45
    assert large[pd.Timestamp(at(15))] == 1.0 and large[pd.Timestamp(at(20))] == pytest.approx(1.95)
    assert large[pd.Timestamp(at(30))] == 2.0 and large[pd.Timestamp(at(40))] == pytest.approx(1.05)
    assert large[pd.Timestamp(at(45))] == 1.0
    each = replicas_over_time(fleet, *WINDOW, 300, by="replica")
    gone = each[each["replica"] == "large-1"].set_index("ts")["replicas"]
    assert len(gone) == 12 and gone.notna().all()  # before and after it ran: 0, drawn as 0, not as a gap
    assert gone[pd.Timestamp(at(0))] == 0.0 and gone[pd.Timestamp(at(50))] == 0.0
    with pytest.raises(BadInput):
        replicas_over_time(fleet, *WINDOW, 300, by="tenant")


def test_the_cold_start_and_the_time_after_removal_cost_nothing(fleet: Any) -> None:
    """Cost counts presence: large-1 is billed from its first scrape (20:00) to its last (40:00),
    not from its decision (18:30) or to its removal (40:20)."""
    spend = gpu_spend(fleet, *WINDOW, PRICES, tier="raw").set_index("replica")
    assert spend.loc["large-1", "up_seconds"] == 1200.0
    assert spend.loc["large-1", "spend"] == pytest.approx(1200 / 3600 * 2 * 2.00)  # 2 H100s at $2.00
    per_minute = cost_over_time(fleet, *WINDOW, PRICES, by="replica", step=60, tier="raw")
    large1 = per_minute[per_minute["replica"] == "large-1"]
    assert large1.loc[large1["ts"] < pd.Timestamp(at(20)), "spend"].sum() == 0.0
    assert large1.loc[large1["ts"] > pd.Timestamp(at(40)), "spend"].sum() == 0.0
    assert large1.loc[large1["ts"] == pd.Timestamp(at(30)), "spend"].sum() == pytest.approx(60 / 3600 * 4.0)


def test_flapping_counts_direction_changes_within_the_window(fleet: Any) -> None:
    # out 18:30, in 39:00, out 50:00: two changes 11 minutes apart
    df = flapping(fleet, *WINDOW, window_s=900).set_index("pool")
    assert df.loc["tiny-large", "reversals"] == 2 and df.loc["tiny-large", "last_at"] == pd.Timestamp(at(50))
    assert flapping(fleet, *WINDOW, window_s=300).set_index("pool").loc["tiny-large", "reversals"] == 1
    calm = flapping(fleet, T0, at(35), window_s=900).set_index("pool")  # one scale-out: no change of direction
    assert calm.loc["tiny-large", "reversals"] == 0 and pd.isna(calm.loc["tiny-large", "last_at"])
    assert "tiny-small" not in df.index  # never scaled


def test_headroom_is_spare_replicas_at_the_kv_target_and_their_dollars(fleet: Any) -> None:
    df = headroom(fleet, *WINDOW, 300, kv_target=0.8, prices=PRICES).set_index(["ts", "pool"]).to_dict("index")
    # two large replicas at KV 0.4 and 0.2: they would fit in 0.6 / 0.8 = 0.75 replicas;
    # 1.25 spare, each 2 H100s at $2.00: $5.00 an hour
    both = df[(pd.Timestamp(at(30)), "tiny-large")]
    assert (both["replicas"], both["demand_replicas"], both["headroom_replicas"]) == pytest.approx((2.0, 0.75, 1.25))
    assert both["headroom_usd_per_hour"] == pytest.approx(5.00)
    one = df[(pd.Timestamp(at(50)), "tiny-large")]  # large-0 alone at 0.4: 0.5 spare, $2.00 an hour
    assert one["headroom_replicas"] == pytest.approx(0.5) and one["headroom_usd_per_hour"] == pytest.approx(2.00)
    full = df[(pd.Timestamp(at(30)), "tiny-small")]  # KV 0.9 over a 0.8 target: no headroom, never below 0
    assert full["demand_replicas"] == pytest.approx(1.125) and full["headroom_replicas"] == 0.0
    unpriced = headroom(fleet, *WINDOW, 300)  # no prices: unknown, not free
    assert unpriced["headroom_usd_per_hour"].isna().all()
    with pytest.raises(NoPrice, match="H100"):
        headroom(fleet, *WINDOW, 300, prices={"L4": 0.8})


def test_spend_per_hour_compares_the_recent_window_with_the_baseline_before_it(fleet: Any) -> None:
    df = spend_per_hour(fleet, at(30), PRICES, window_s=300, baseline_s=3600).set_index("model").to_dict("index")
    # minutes 25-29: large-0 and large-1, 2 H100s each at $2.00: $8.00 an hour. Before (minutes -1 to
    # 24, all the data there is): large-0 45 s of minute -1 + 25 minutes, large-1 285 s from minute 20,
    # at $4.00 an hour each: (45 + 1500 + 285) / 3600 x $4 over 26 minutes
    baseline = (45 + 1500 + 285) / 3600 * 4.0 / 26 * 60
    large, small = df["tiny-large"], df["tiny-small"]
    assert large["recent_usd_per_hour"] == pytest.approx(8.0)
    assert large["baseline_usd_per_hour"] == pytest.approx(baseline)
    assert large["change"] == pytest.approx((8.0 / baseline - 1) * 100)  # +70 %
    assert abs(small["change"]) < 2  # the pool that did not scale: flat
    fleet_row = spend_per_hour(fleet, at(30), PRICES, by="fleet").set_index("model").loc["(fleet)"]
    assert fleet_row["recent_usd_per_hour"] == pytest.approx(8.8)
    calm = spend_per_hour(fleet, at(15), PRICES).set_index("model").to_dict("index")  # before the scale-out
    assert abs(calm["tiny-large"]["change"]) < 5


def test_scale_marks_name_the_pool_the_sizes_the_signal_and_the_cold_start(fleet: Any) -> None:
    marks = scale_marks(fleet, *WINDOW)
    titles = [title for _, title, _ in marks]
    assert titles == [
        "tiny-large 1 -> 2 (kv_cache_usage 0.86 > 0.8)",
        "tiny-large 2 -> 1 (kv_cache_usage 0.12 < 0.3)",
        "tiny-large 1 -> 2 (kv_cache_usage 0.9 > 0.8)",
        "tiny-large held at max 2 (kv_cache_usage 0.9 > 0.8)",
    ]
    assert marks[0][0] == at(18.5)
    assert "large-1 ready +80 s, first token +95 s" in marks[0][2]


def test_a_replica_removed_by_a_scale_in_is_retired_not_silent(fleet: Any) -> None:
    # large-1's engine stopped before its target left: its attempts from 40:15 failed, and the
    # autoscaler recorded it removed (40:20). ghost failed from 40:15 with no scale event: down.
    health = scrape_health(fleet, at(40), at(45)).set_index("replica")
    assert bool(health.loc["large-1", "retired"]) and not bool(health.loc["ghost", "retired"])
    silent = silent_targets(health.reset_index())
    assert list(silent["replica"]) == ["ghost"]
    assert not any("large-1" in why for why in silent["why"])
    assert sorted(current(health.reset_index())["replica"]) == ["ghost", "large-0", "small-0"]


def test_without_its_removed_event_the_replica_that_went_away_is_down(ch: Any, tmp_path: Path) -> None:
    autoscaled_fleet(ch, tmp_path / "spool", removed=False)
    silent = silent_targets(scrape_health(ch, at(40), at(45)))
    assert sorted(silent["replica"]) == ["ghost", "large-1"]


def test_health_reads_a_store_without_the_scale_events_table(ch: Any, tmp_path: Path) -> None:
    """A store not migrated to 0013 yet: scrape health still answers (nothing retired)."""
    autoscaled_fleet(ch, tmp_path / "spool")
    ch.command("DROP TABLE scale_events")
    health = scrape_health(ch, at(40), at(45))
    assert not health["retired"].any()
    assert sorted(silent_targets(health)["replica"]) == ["ghost", "large-1"]
