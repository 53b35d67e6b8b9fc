"""History's metric rows: the calibrated engine model along the fleet's story -> the warehouse's tables.

In:  a ClickHouse client (migrated), the calibrations (``fleetscope.history_calibration``), the
     replicas (``fleetscope.history_story``), the ``Span`` of the history and a random generator.
Out: rows in ``series``, ``samples`` (the raw window, every ``interval_s``; it goes through the
     materialized views like any insert), ``scrapes`` (the raw window), ``samples_1m`` (the
     minute-resolution stretch) and ``samples_1h`` (the rest, and the minute stretch summed by
     hour), inserted in batches; ``MetricCounts``, the rows written. Counters are integers where
     vLLM's are (everything but ``*_sum``); one replica crashes in the raw window, so its
     counters restart from zero there, as after a real restart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from analytics.vllm import KV_CACHE_USAGE
from collector.convert import fingerprint
from fleetscope.history_calibration import Calibration, ModelProfile
from fleetscope.history_story import Replica, load, long_share
from storage.clickhouse import Client

__all__ = ["MetricCounts", "Span", "write_metrics"]

_FRACTIONS = [KV_CACHE_USAGE]
FLUSH_ROWS = 4_000_000  # rows held before they are inserted

Shape = tuple[np.ndarray, np.ndarray, np.ndarray]  # per-minute increase, gauge mean, gauge spread


@dataclass(frozen=True)
class Span:
    """The history's stretches, in epoch seconds: hour rows from ``start``, minute rows from
    ``minute_start``, raw samples every ``interval_s`` from ``raw_start`` to ``end``; ``clock``:
    seconds added to the story's clock for its daily and weekly cycle."""

    start: int
    minute_start: int
    raw_start: int
    end: float
    interval_s: float
    clock: float = 0.0

    @property
    def hours(self) -> np.ndarray:
        return np.arange(self.start, self.minute_start, 3600.0)

    @property
    def minutes(self) -> np.ndarray:
        return np.arange(self.minute_start, self.raw_start, 60.0)

    @property
    def steps(self) -> np.ndarray:
        return np.arange(self.raw_start, self.end, self.interval_s)


@dataclass
class MetricCounts:
    """The metric rows written."""

    series: int = 0
    raw_samples: int = 0
    minute_rows: int = 0
    hour_rows: int = 0


def _profile_at(
    cals: dict[tuple[str, str], Calibration], profile: ModelProfile, rate: np.ndarray, share: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    chat, long = cals[(profile.name, "chat")], cals[(profile.name, "long")]
    ic, gc, sc = chat.at(rate)
    il, gl, sl = long.at(rate)
    s = share[:, None]
    return ic * (1 - s) + il * s, gc * (1 - s) + gl * s, sc * (1 - s) + sl * s


def _tier_frame(
    metric: np.ndarray,
    fps: np.ndarray,
    starts: np.ndarray,
    step: float | np.ndarray,
    scrape_s: float,
    inc: np.ndarray,
    cum_end: np.ndarray,
    gauge: np.ndarray,
    spread: np.ndarray,
    cumulative_mask: np.ndarray,
    rng: np.random.Generator,
    gauge_range: tuple[np.ndarray, np.ndarray] | None = None,
) -> pa.Table:
    """Rollup rows (buckets x series) with the columns of samples_1m / samples_1h; ``step`` is the
    seconds each bucket covers (less than its width for a bucket the raw samples complete)."""
    buckets, n = inc.shape
    step = np.broadcast_to(np.asarray(step, dtype=float), (buckets,))
    count = np.repeat(np.round(step / scrape_s).astype(np.uint64), n)
    cum_start = cum_end - inc
    g_lo, g_hi = gauge_range if gauge_range is not None else _gauge_range(metric, gauge, spread, rng)
    lo = np.where(cumulative_mask, cum_start, g_lo)
    hi = np.where(cumulative_mask, cum_end, g_hi)
    mean = np.where(cumulative_mask, (cum_start + cum_end) / 2, gauge)
    last = np.where(cumulative_mask, cum_end, gauge)
    last_ts = _stamps(np.repeat(starts + step - scrape_s, n))
    mean_count = count.reshape(buckets, n)
    first_ts = _stamps(np.repeat(starts, n))
    first = np.where(cumulative_mask, cum_start, gauge)
    return pa.table(
        {
            "metric": _metric_column(metric, buckets),
            "fingerprint": pa.array(np.tile(fps, buckets)),
            "ts": pa.array(np.repeat(starts, n).astype(np.int64), type=pa.timestamp("s", tz="UTC")),
            "resets": np.zeros(buckets * n),
            "value_min": lo.ravel(),
            "value_max": hi.ravel(),
            "value_sum": (mean * mean_count).ravel(),
            "value_count": pa.array(count),
            "value_first": pa.StructArray.from_arrays(
                [first_ts, pa.array(first.ravel()), pa.array(np.zeros(buckets * n))], names=["1", "2", "3"]
            ),
            "value_last": pa.StructArray.from_arrays([last_ts, pa.array(last.ravel())], names=["1", "2"]),
            # what the collector's samples.increase sums to per bucket (gauges: 0)
            "increase": np.where(cumulative_mask, inc, 0.0).ravel(),
        }
    )


def _gauge_range(
    metric: np.ndarray, gauge: np.ndarray, spread: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """min and max of a gauge around its mean in a bucket (fractions stay within 0..1)."""
    upper = np.isin(metric, _FRACTIONS)
    noise = np.abs(rng.standard_normal(gauge.shape)) * spread
    lo = np.where(gauge >= 0, np.maximum(gauge - noise, 0.0), gauge - noise)
    hi = np.where(upper, np.minimum(gauge + noise, 1.0), gauge + noise)
    return lo, hi


def _stamps(seconds: np.ndarray) -> pa.Array:
    return pa.array(np.round(seconds * 1000).astype(np.int64), type=pa.timestamp("ms", tz="UTC"))


def _metric_column(metric: np.ndarray, repeats: int) -> pa.DictionaryArray:
    names, inverse = np.unique(metric, return_inverse=True)
    indices = pa.array(np.tile(inverse.astype(np.int32), repeats))
    return pa.DictionaryArray.from_arrays(indices, pa.array(names.tolist()))


class _Batches:
    """Rows held until ``FLUSH_ROWS`` are pending, then inserted: the rollup tiers, the raw samples
    and the scrapes."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.hour: list[pa.Table] = []
        self.minute: list[pa.Table] = []
        self.raw: list[pa.Table] = []
        self.scrapes: list[pd.DataFrame] = []
        self.pending = 0

    def flush(self, force: bool = False) -> None:
        if self.pending < FLUSH_ROWS and not force:
            return
        # raw samples through the Null table that stores them and rolls them up (migration 0016)
        for table, frames in (("samples_1h", self.hour), ("samples_1m", self.minute), ("samples_ingest", self.raw)):
            if frames:
                self.client.insert_arrow(table, pa.concat_tables(frames))
                frames.clear()
        if self.scrapes:
            self.client.insert_df("scrapes", pd.concat(self.scrapes, ignore_index=True))
            self.scrapes.clear()
        self.pending = 0


@dataclass
class _SeriesRows:
    """The ``series`` table's rows, column by column."""

    fingerprint: list[int] = field(default_factory=list)
    metric: list[str] = field(default_factory=list)
    original_metric: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    first_seen: list[float] = field(default_factory=list)
    last_seen: list[float] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "fingerprint": self.fingerprint,
                "metric": self.metric,
                "original_metric": self.original_metric,
                "labels": self.labels,
                "first_seen": self.first_seen,
                "last_seen": self.last_seen,
            }
        ).assign(
            first_seen=lambda d: pd.to_datetime(d["first_seen"], unit="s", utc=True),
            last_seen=lambda d: pd.to_datetime(d["last_seen"], unit="s", utc=True),
        )


@dataclass(frozen=True)
class _ReplicaSeries:
    """One replica's series: its calibration, metric names and fingerprints, in exposition order."""

    replica: Replica
    cal: Calibration
    metric: np.ndarray
    fps: np.ndarray


def write_metrics(
    client: Client,
    cals: dict[tuple[str, str], Calibration],
    replicas: list[Replica],
    span: Span,
    rng: np.random.Generator,
    progress: Callable[[str, float], None],
    counts: MetricCounts | None = None,
) -> MetricCounts:
    """Every replica's metric rows over ``span`` into the store; the rows written (added to
    ``counts`` where given, e.g. the seed's report)."""
    crash = replicas[len(replicas) // 3].name  # restarts in the raw window
    counts = counts if counts is not None else MetricCounts()
    batches = _Batches(client)
    series_rows = _SeriesRows()
    hours, minutes, steps = span.hours, span.minutes, span.steps
    for n, replica in enumerate(replicas):
        one = _series(replica, cals[(replica.profile.name, "chat")], span, series_rows)
        cum, k = _rollups(one, cals, span, rng, batches)
        _raw(one, cals, span, cum, replica.name == crash, rng, batches)
        width = len(one.fps)
        counts.series += width
        counts.hour_rows += len(hours) * width + k * width
        counts.minute_rows += len(minutes) * width
        counts.raw_samples += len(steps) * width
        batches.pending += (len(hours) + len(minutes) + len(steps) + k) * width
        batches.flush()
        progress(f"metrics: replica {n + 1}/{len(replicas)}", 0.05 + 0.75 * (n + 1) / len(replicas))
    batches.flush(force=True)
    client.insert_df("series", series_rows.frame())
    return counts


def _series(replica: Replica, cal: Calibration, span: Span, rows: _SeriesRows) -> _ReplicaSeries:
    """The replica's series (its labels on the calibration's), noted in ``rows``."""
    labels = [{**exposed, **replica.labels} for _, exposed in cal.series]
    metric = np.array([m for m, _ in cal.series])
    fps = np.array([fingerprint(m, lab) for (m, _), lab in zip(cal.series, labels, strict=True)], dtype=np.uint64)
    rows.fingerprint.extend(fps.tolist())
    rows.metric.extend(metric.tolist())
    rows.original_metric.extend(metric.tolist())
    rows.labels.extend(labels)
    rows.first_seen.extend([span.start] * len(fps))
    rows.last_seen.extend([span.end] * len(fps))
    return _ReplicaSeries(replica, cal, metric, fps)


def _shape_at(cals: dict[tuple[str, str], Calibration], replica: Replica, t: np.ndarray, span: Span) -> Shape:
    """What the replica's engine does per minute at epoch seconds ``t``, by the story's load and mix."""
    peak = replica.profile.peak_rate * replica.factor
    rate = peak * load(t, span.end, span.clock)
    return _profile_at(cals, replica.profile, rate, long_share(t, span.end))


def _rollups(
    one: _ReplicaSeries,
    cals: dict[tuple[str, str], Calibration],
    span: Span,
    rng: np.random.Generator,
    batches: _Batches,
) -> tuple[np.ndarray, int]:
    """Hours at hour resolution, then minutes (and their sums by hour); counters carry on across
    them. Returns the counters' values at the end of each row and the hour rows of the minutes."""
    metric, fps, cal = one.metric, one.fps, one.cal
    hours, minutes, interval_s = span.hours, span.minutes, span.interval_s
    inc_h, gauge_h, spread_h = _shape_at(cals, one.replica, hours + 1800, span)
    inc_h = inc_h * 60 * rng.gamma(400, 1 / 400, size=(len(hours), 1))
    inc_m, gauge_m, spread_m = _shape_at(cals, one.replica, minutes + 30, span)
    inc_m = inc_m * rng.gamma(50, 1 / 50, size=(len(minutes), 1))
    cum_float = np.cumsum(np.vstack([inc_h, inc_m]), axis=0)
    cum = np.where(cal.integer, np.floor(cum_float), cum_float)
    inc_all = np.diff(np.vstack([np.zeros((1, len(fps))), cum]), axis=0)
    cum_h, cum_m = cum[: len(hours)], cum[len(hours) :]
    batches.hour.append(
        _tier_frame(
            metric, fps, hours, 3600.0, interval_s, inc_all[: len(hours)], cum_h, gauge_h, spread_h, cal.cumulative, rng
        )
    )
    range_m = _gauge_range(metric, gauge_m, spread_m, rng)
    inc_mins = inc_all[len(hours) :]
    batches.minute.append(
        _tier_frame(
            metric, fps, minutes, 60.0, interval_s, inc_mins, cum_m, gauge_m, spread_m, cal.cumulative, rng, range_m
        )
    )
    # the 1 h rows of the minute-resolution stretch: sums of its minutes (the last hour may be
    # partial: the raw samples' view adds the rest of it, and the rows merge)
    if not len(minutes):
        return cum, 0
    hour_of = ((minutes - span.minute_start) // 3600).astype(int)
    first = np.flatnonzero(np.r_[True, np.diff(hour_of) > 0])
    last = np.r_[first[1:], len(minutes)] - 1
    counts = (last - first + 1).astype(float)
    batches.hour.append(
        _tier_frame(
            metric,
            fps,
            span.minute_start + 3600.0 * hour_of[first],
            counts * 60.0,
            interval_s,
            np.add.reduceat(inc_mins, first, axis=0),
            cum_m[last],
            np.add.reduceat(gauge_m, first, axis=0) / counts[:, None],
            np.add.reduceat(spread_m, first, axis=0) / counts[:, None],
            cal.cumulative,
            rng,
            (np.minimum.reduceat(range_m[0], first, axis=0), np.maximum.reduceat(range_m[1], first, axis=0)),
        )
    )
    return cum, len(first)


def _raw(
    one: _ReplicaSeries,
    cals: dict[tuple[str, str], Calibration],
    span: Span,
    cum: np.ndarray,
    crashes: bool,
    rng: np.random.Generator,
    batches: _Batches,
) -> None:
    """The raw samples (per-scrape shares of each minute's work, counters on from ``cum``) and the
    scrapes that took them; a replica that ``crashes`` restarts half-way, its counters from zero."""
    metric, fps, cal, replica = one.metric, one.fps, one.cal, one.replica
    steps, interval_s = span.steps, span.interval_s
    inc_s, gauge_s, spread_s = _shape_at(cals, replica, steps, span)
    inc_s = inc_s * (interval_s / 60.0) * rng.gamma(8, 1 / 8, size=(len(steps), 1))
    base = cum[-1] if len(cum) else np.zeros(len(fps))
    cum_s = base + np.cumsum(inc_s, axis=0)
    value = np.where(cal.integer, np.floor(cum_s), cum_s)
    prev = np.vstack([base, value[:-1]])
    if crashes:  # the engine restarts: its counters start again from zero
        at = len(steps) // 2
        after = np.cumsum(inc_s[at:], axis=0)
        value[at:] = np.where(cal.integer, np.floor(after), after)
        prev[at + 1 :] = value[at:-1]
    reset = np.where(cal.cumulative & (value < prev), prev, 0.0)  # as the collector marks them
    increase = np.where(cal.cumulative, np.where(value < prev, value, value - prev), 0.0)  # and counts them
    # gauges as an engine shows them: whole numbers stay whole, KV usage is used blocks / blocks
    gauges = gauge_s + rng.standard_normal(gauge_s.shape) * spread_s * 0.5
    gauges = np.where(cal.whole, np.round(gauges), gauges)
    kv = np.flatnonzero(metric == KV_CACHE_USAGE)
    blocks = replica.profile.config.num_blocks
    gauges[:, kv] = np.clip(np.round(gauges[:, kv] * blocks) / blocks, 0.0, 1.0)
    value = np.where(cal.cumulative, value, np.maximum(gauges, 0.0))
    batches.raw.append(
        pa.table(
            {
                "metric": _metric_column(metric, len(steps)),
                "fingerprint": pa.array(np.tile(fps, len(steps))),
                "ts": _stamps(np.repeat(steps, len(fps))),
                "value": value.ravel(),
                "reset": reset.ravel(),
                "increase": increase.ravel(),
            }
        )
    )
    batches.scrapes.append(
        pd.DataFrame(
            {
                "ts": pd.to_datetime(steps, unit="s", utc=True),
                "job": "vllm",
                "instance": replica.labels["instance"],
                "replica": replica.name,
                "up": np.uint8(1),
                "duration_seconds": np.float32(0.012),
                "samples_scraped": np.uint32(len(fps)),
                "error": "",
            }
        )
    )
