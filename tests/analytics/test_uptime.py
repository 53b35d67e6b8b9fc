"""The uptime rule's arithmetic on a replica's hourly buckets (``analytics.uptime``), worked out by
hand: rows of one bucket in two parts (not merged yet) fold into one, a bucket is up from the
previous bucket's last sample while the gap is the replica's usual one, and from its own first
sample after an outage; a replica seen in one bucket is up from its first sample to its last."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analytics.uptime import _sums, bucket_ups, merged

H = 3_600_000  # an hour in ms


def test_a_replicas_hours_up_across_unmerged_rows_and_an_outage() -> None:
    # replica 0, scraped every 15 s: hours 0-2 without a break, hour 1's rows in two parts (to 1:30:00,
    # then from 1:30:15), away from 2:59:45 to 3:30:00; replica 1 seen once, for a minute of hour 0.
    # The rows come in no order.
    rows = [  # (replica, hour start s, first ms, last ms, peak)
        (0, 10_800, 3 * H + H // 2, 4 * H - 15_000, 0.0),
        (1, 0, 60_000, 120_000, 1.0),
        (0, 3_600, H + H // 2 + 15_000, 2 * H - 15_000, 0.0),
        (0, 0, 0, H - 15_000, 2.0),
        (0, 7_200, 2 * H, 3 * H - 15_000, 1.0),
        (0, 3_600, H, H + H // 2, 3.0),
    ]
    rep, b, first, last, peak = (np.array(c) for c in zip(*rows, strict=True))
    rep, b, cols = merged(rep, b, {"first_t": first, "last_t": last, "peak": peak})
    assert rep.tolist() == [0, 0, 0, 0, 1] and b.tolist() == [0, 3_600, 7_200, 10_800, 0]
    # hour 1 folded: its first part's first sample, its second part's last, the higher peak
    assert (cols["first_t"][1], cols["last_t"][1], cols["peak"][1]) == (H, 2 * H - 15_000, 3.0)
    ups = bucket_ups(rep, cols["first_t"], cols["last_t"])
    # gaps between replica 0's hours: 15 s, 15 s, 30 min 15 s; median 15 s -> a gap over a minute is down.
    # hour 0: its first to its last sample, 3,585 s; hours 1 and 2: from the previous hour's last, 3,600 s;
    # hour 3, after the outage: from its own first sample (3:30:00) to 3:59:45, 1,785 s. Replica 1: 60 s.
    assert ups.tolist() == [3_585.0, 3_600.0, 3_600.0, 1_785.0, 60.0]


def test_no_buckets_no_uptime() -> None:
    empty = np.zeros(0, dtype=np.int64)
    rep, b, cols = merged(empty, empty, {"first_t": empty, "last_t": empty, "peak": np.zeros(0)})
    assert len(rep) == 0 and len(bucket_ups(rep, cols["first_t"], cols["last_t"])) == 0


def hours(rows: list[tuple[int, int, int, int, float]]) -> list[float]:
    """Up seconds of each bucket of (replica, hour start s, first ms, last ms, peak) rows."""
    rep, b, first, last, peak = (np.array(c) for c in zip(*rows, strict=True))
    rep, b, cols = merged(rep, b, {"first_t": first, "last_t": last, "peak": peak})
    return bucket_ups(rep, cols["first_t"], cols["last_t"]).tolist()


def test_the_median_gap_is_the_upper_middle_one_and_the_threshold_is_capped() -> None:
    # gaps 15 s, 15 s, 40 s, 90 s: the upper middle of four is 40 s (the lower, 15 s, would make the
    # threshold a minute), so 2.5 x 40 s = 100 s, and the 90 s gap before the last hour is up time
    lasts = [(i + 1) * H - 15_000 for i in range(5)]
    gaps = [15_000, 15_000, 40_000, 90_000]
    firsts = [0] + [lasts[i] + gaps[i] for i in range(4)]
    rows = [(0, 3600 * i, firsts[i], lasts[i], 1.0) for i in range(5)]
    # the last hour from the previous one's last sample: 3,600 s (from its own first: 3,510 s)
    assert hours(rows) == [3_585.0, 3_600.0, 3_600.0, 3_600.0, 3_600.0]
    # scraped every 10 minutes: 2.5 x 10 min = 25 min, capped at 15 (LOOKBACK): a 16-minute gap is down
    every = 600_000
    rows = [(0, 3600 * i, i * H, i * H + 5 * every, 0.0) for i in range(4)]  # each hour 0:00-0:50
    rows.append((0, 4 * 3600, 3 * H + 5 * every + 16 * 60_000, 3 * H + 5 * every + 16 * 60_000 + every, 0.0))
    ups = hours(rows)
    assert ups[1] == ups[2] == ups[3] == 3600.0  # 10-minute gaps: up
    assert ups[4] == every / 1000  # after the 16-minute gap: from its own first sample


def test_a_replicas_several_series_fold_into_its_hours_and_a_nan_peak_is_skipped() -> None:
    # an engine restarted with a new label set in hour 1: its two series are one replica
    rep, b, cols = merged(
        np.array([0, 0, 0]),
        np.array([0, 3600, 3600]),
        {
            "first_t": np.array([0, H, H + H // 2]),
            "last_t": np.array([H - 15_000, H + H // 2 - 15_000, 2 * H - 15_000]),
            "peak": np.array([1.0, 2.0, np.nan]),
        },
    )
    assert rep.tolist() == [0, 0] and cols["last_t"].tolist() == [H - 15_000, 2 * H - 15_000]
    assert cols["peak"].tolist() == [1.0, 2.0]  # the store's max skips NaN


def test_a_few_minutes_over_ten_days_are_summed_without_a_cell_for_every_minute() -> None:
    # two replicas (one pool), per minute over ten days, up in three minutes only: the sums come from
    # the cells that have rows (14,400 minutes x 2 replicas would be numbered densely otherwise)
    meta = pd.DataFrame(
        {"replica": ["r1", "r2"], "model": ["m", "m"], "gpu_type": ["H100", "H100"], "gpu_count": [1, 1]}
    )
    rep, b = np.array([0, 0, 1]), np.array([0, 864_000, 864_000])  # r1 at day 0 and day 10, r2 at day 10
    up, busy = np.array([60.0, 30.0, 45.0]), np.array([60.0, 0.0, 45.0])
    pools = _sums(meta, rep, b, up, busy, 60, pooled=True)
    assert pools["ts"].tolist() == [pd.Timestamp(0, unit="s", tz="UTC"), pd.Timestamp(864_000, unit="s", tz="UTC")]
    assert pools["replicas"].tolist() == [1, 2] and pools["up_seconds"].tolist() == [60.0, 75.0]
    assert pools["busy_seconds"].tolist() == [60.0, 45.0]
    per_replica = _sums(meta, rep, b, up, busy, None, pooled=False)
    assert per_replica["replica"].tolist() == ["r1", "r2"] and per_replica["up_seconds"].tolist() == [90.0, 45.0]
