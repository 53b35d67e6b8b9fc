"""Table routing by time range: raw for short recent windows, 1 min for days, 1 h for weeks and,
for engine metrics, 6 h beyond."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from analytics.tiers import Retention, plan

NOW = datetime(2026, 11, 29, 12, 0, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("span", "ago", "kind", "tier"),
    [
        (timedelta(minutes=15), timedelta(0), "samples", "raw"),
        (timedelta(hours=6), timedelta(0), "samples", "raw"),
        (timedelta(hours=7), timedelta(0), "samples", "1m"),
        (timedelta(days=2), timedelta(0), "samples", "1m"),
        (timedelta(days=7), timedelta(0), "samples", "1m"),
        (timedelta(days=8), timedelta(0), "samples", "1h"),
        (timedelta(days=15), timedelta(0), "samples", "1h"),
        (timedelta(days=30), timedelta(0), "samples", "6h"),
        (timedelta(days=30), timedelta(0), "requests", "1h"),  # the request log has no 6-hour tier
        # short, but older than the raw retention (7 days): the 1 min rollup still has it
        (timedelta(hours=1), timedelta(days=10), "samples", "1m"),
        # older than the 1 min retention (90 days): only the hourly tier has it
        (timedelta(hours=1), timedelta(days=100), "samples", "1h"),
        # the raw request log is kept 30 days
        (timedelta(hours=1), timedelta(days=10), "requests", "raw"),
        (timedelta(hours=1), timedelta(days=40), "requests", "1m"),
    ],
)
def test_the_finest_tier_that_holds_the_window_is_chosen(span, ago, kind, tier) -> None:
    end = NOW - ago
    p = plan(end - span, end, now=NOW, kind=kind)
    assert p.tier.name == tier
    assert (p.samples if kind == "samples" else p.requests).startswith(kind)


def test_rollup_windows_are_widened_to_whole_buckets() -> None:
    start, end = datetime(2026, 11, 20, 10, 17, 42, tzinfo=UTC), datetime(2026, 11, 29, 11, 3, 5, tzinfo=UTC)
    p = plan(start, end, now=NOW)
    assert p.tier.name == "1h"
    assert (p.start, p.end) == (datetime(2026, 11, 20, 10, tzinfo=UTC), datetime(2026, 11, 29, 12, tzinfo=UTC))
    m = plan(start + timedelta(days=7), end, now=NOW)
    assert m.tier.name == "1m"
    assert (m.start, m.end) == (datetime(2026, 11, 27, 10, 17, tzinfo=UTC), datetime(2026, 11, 29, 11, 4, tzinfo=UTC))
    # an aligned window stays as it is; the raw tier is never widened
    assert plan(m.start, m.end, now=NOW).start == m.start
    r = plan(end - timedelta(minutes=5), end, now=NOW)
    assert (r.tier.name, r.start, r.end) == ("raw", end - timedelta(minutes=5), end)


def test_retention_and_span_limits_come_from_the_config() -> None:
    keep_raw_longer = Retention(raw_days=60, raw_max_span=timedelta(days=2))
    assert plan(NOW - timedelta(days=1), NOW, now=NOW, retention=keep_raw_longer).tier.name == "raw"
    assert plan(NOW - timedelta(days=1), NOW, now=NOW).tier.name == "1m"
    forever = Retention(minute_days=0)
    assert (
        plan(NOW - timedelta(days=400, hours=1), NOW - timedelta(days=400), now=NOW, retention=forever).tier.name
        == "1m"
    )


def test_forcing_a_tier_and_bad_windows() -> None:
    assert plan(NOW - timedelta(days=30), NOW, now=NOW, tier="raw").tier.name == "raw"
    with pytest.raises(ValueError, match="unknown tier"):
        plan(NOW - timedelta(hours=1), NOW, tier="5m")
    assert plan(NOW - timedelta(hours=1), NOW, tier="6h").samples == "samples_6h"
    with pytest.raises(ValueError, match="unknown tier '6h' for requests"):
        plan(NOW - timedelta(hours=1), NOW, tier="6h", kind="requests")
    with pytest.raises(ValueError, match="empty window"):
        plan(NOW, NOW - timedelta(hours=1))
    naive = plan(datetime(2026, 11, 29, 11), datetime(2026, 11, 29, 12), now=NOW)  # noqa: DTZ001 - naive on purpose
    assert naive.start.tzinfo is UTC  # naive datetimes are read as UTC


def test_a_tier_whose_rows_begin_after_the_window_start_is_passed_over() -> None:
    # as after `fleetscope bench seed`: 1-minute rows for the last day only, raw for minutes
    data = {"raw": NOW - timedelta(minutes=20), "1m": NOW - timedelta(days=1), "1h": NOW - timedelta(days=30)}
    assert plan(NOW - timedelta(days=3), NOW, now=NOW, data=data).tier.name == "1h"
    assert plan(NOW - timedelta(hours=12), NOW, now=NOW, data=data).tier.name == "1m"
    assert plan(NOW - timedelta(hours=2), NOW, now=NOW, data=data).tier.name == "1m"
    assert plan(NOW - timedelta(minutes=10), NOW, now=NOW, data=data).tier.name == "raw"
    # a 6-hour tier younger than the history (a store migrated to it recently) gives way to 1 h
    month = NOW - timedelta(days=30)
    assert plan(month, NOW, now=NOW, data={**data, "6h": NOW - timedelta(days=2)}).tier.name == "1h"
    assert plan(month, NOW, now=NOW, data={**data, "6h": NOW - timedelta(days=31)}).tier.name == "6h"
    # a store younger than the window: the finest tier the span allows, not a coarser one
    young = {"raw": NOW - timedelta(minutes=5), "1m": NOW - timedelta(minutes=5), "1h": NOW - timedelta(minutes=30)}
    assert plan(NOW - timedelta(minutes=15), NOW, now=NOW, data=young).tier.name == "raw"
    # ... even where the window's start falls in the hour the store began (the hourly rollup
    # "holds" it only because its bucket is floored to the hour)
    hour = NOW.replace(minute=0, second=0, microsecond=0)
    began = hour + timedelta(minutes=37, seconds=25)
    fresh = {"raw": began, "1m": began.replace(second=0), "1h": hour}
    assert plan(hour + timedelta(minutes=10), began + timedelta(minutes=2), now=NOW, data=fresh).tier.name == "raw"
    empty = {"raw": None, "1m": None, "1h": None}
    assert plan(NOW - timedelta(days=2), NOW, now=NOW, data=empty).tier.name == "1m"


def test_coverage_reads_where_each_tier_begins(ch) -> None:
    import pandas as pd

    from analytics.tiers import coverage
    from migrations import clickhouse_runner

    clickhouse_runner.apply(ch)
    assert coverage(ch, "requests") == {"raw": None, "1m": None, "1h": None}
    t = datetime(2026, 11, 29, 10, 17, 5, tzinfo=UTC)
    # where the collector inserts: stored in samples and rolled up (migration 0016)
    ch.insert_df("samples_ingest", pd.DataFrame({"metric": ["m"], "fingerprint": [1], "ts": [t], "value": [1.0]}))
    found = coverage(ch, "samples")
    # the 6-hour tier is fed through the 1-hour one (a cascade of views)
    assert found == {
        "raw": t,
        "1m": t.replace(second=0),
        "1h": t.replace(minute=0, second=0),
        "6h": t.replace(hour=6, minute=0, second=0),
    }
