"""Synthetic history for a large fleet, from the simulator's engine model, straight into the store.

It lives in the wiring layer because it joins two parts that may not know each other: the
simulator of the fleet (``fleet.sim``) and the collector's naming of what it scrapes
(``collector.exposition``, ``collector.convert``: the fingerprints, canonical names and counter
kinds the warehouse is keyed by).

In:  a ClickHouse client (migrated), the fleet size and the days of history, how much of the
     recent past to write at full resolution (raw samples every ``interval_s``, 1-minute rows),
     the request-log sampling rate and a seed.
Out: rows in ``series``, ``samples`` (recent), ``scrapes`` (recent), ``samples_1m``,
     ``samples_1h`` and ``requests`` (30 days, sampled and weighted), as a fleet of simulated
     vLLM engines would have left them: the raw window goes through the materialized views
     like any insert; older buckets are written into the rollup tiers directly (as if the raw
     rows had already expired by TTL, which is how a real store looks after 30 days).

Not random noise: every number comes from ``SimEngine`` runs in virtual time
(``fleet.sim.virtual``). ``calibrate`` runs each model's engine at a ladder of request rates
and two request shapes (chat-like and long-context prompts), and records, per level, the
per-minute increase of every counter and histogram bucket of the real vLLM 0.32 exposition,
the mean and spread of every gauge, and the finished requests. History then follows a load
curve (diurnal, weekly, slow growth, per-replica factor), a long-context rollout by one tenant
(day -6) and a tenant shift (day -3), and interpolates between calibrated levels.
Counters are integers where vLLM's are (everything but ``*_sum``); one replica crashes in the
raw window, so its counters restart from zero there, as after a real restart.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pyarrow as pa

from analytics.vllm import KV_CACHE_USAGE
from collector.convert import canonical_name, cumulative, fingerprint
from collector.exposition import parse
from fleet.sim.engine import EngineConfig, SimEngine
from fleet.sim.metrics import Exposition
from fleet.sim.virtual import RequestShape, VirtualReplica, run
from storage.clickhouse import Client

__all__ = ["PROFILES", "Calibration", "ModelProfile", "SeedReport", "calibrate", "seed"]


@dataclass(frozen=True)
class ModelProfile:
    name: str
    config: EngineConfig
    gpu_type: str
    gpu_count: int
    share: float  # of the replicas
    peak_rate: float  # requests/s per replica at the daily peak (before growth)


PROFILES = (
    ModelProfile(
        "llama-3.1-8b",
        EngineConfig(num_blocks=1024, block_size=16, max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=4096),
        "H100",
        1,
        0.7,
        1.6,
    ),
    ModelProfile(
        "llama-3.1-70b",
        EngineConfig(
            num_blocks=2048,
            block_size=16,
            max_model_len=8192,
            max_num_seqs=64,
            max_num_batched_tokens=4096,
            step_overhead_s=0.008,
            prefill_token_s=0.00012,
            decode_seq_s=0.0005,
        ),
        "H100",
        4,
        0.3,
        0.7,
    ),
)
CHAT = RequestShape(prompt_median=500, prompt_sigma=0.9, output_median=120, output_sigma=0.6)
LONG = RequestShape(prompt_median=3000, prompt_sigma=0.4, output_median=120, output_sigma=0.6, shared_share=0.2)
LEVELS = (0.1, 0.4, 0.8, 1.4, 2.2)  # requests/s per replica the engines are calibrated at
TENANTS = {"acme": 0.38, "globex": 0.24, "initech": 0.16, "umbrella": 0.12, "hooli": 0.10}
_FRACTIONS = [KV_CACHE_USAGE]
ROUTES = {"llama-3.1-8b": "model-router:default", "llama-3.1-70b": "model-router:large"}


@dataclass
class Calibration:
    """One model and request shape: per rate level, what its engine does in a minute."""

    series: list[tuple[str, dict[str, str]]]  # exposition order: (metric, exposed labels)
    cumulative: np.ndarray  # bool per series
    integer: np.ndarray  # bool per series: counts (not *_sum)
    whole: np.ndarray  # bool per series: gauges that only took whole values (running, waiting, ...)
    rates: np.ndarray  # calibrated request rates (levels)
    increase: np.ndarray  # (levels, series): increase per minute
    gauge: np.ndarray  # (levels, series): mean value
    spread: np.ndarray  # (levels, series): std of the value
    requests: list[dict[str, np.ndarray]] = field(default_factory=list)  # per level: finished requests

    def at(self, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-minute increase, gauge mean and spread at each ``rate`` (linear between levels,
        proportional below the first one)."""
        rate = np.asarray(rate, dtype=float)
        i = np.clip(np.searchsorted(self.rates, rate) - 1, 0, len(self.rates) - 2)
        lo, hi = self.rates[i], self.rates[i + 1]
        w = np.clip((rate - lo) / (hi - lo), 0.0, 1.5)[:, None]
        inc = self.increase[i] * (1 - w) + self.increase[i + 1] * w
        below = (rate < self.rates[0])[:, None]
        inc = np.where(below, self.increase[0] * (rate / self.rates[0])[:, None], inc)
        gauge = self.gauge[i] * (1 - w) + self.gauge[i + 1] * w
        spread = self.spread[i] * (1 - w) + self.spread[i + 1] * w
        return np.maximum(inc, 0.0), gauge, spread


def calibrate(profile: ModelProfile, shape: RequestShape, minutes: float = 3.0, seed: int = 0) -> Calibration:
    """Run the engine at every level of ``LEVELS`` in virtual time and measure it."""
    template = parse(Exposition(SimEngine(profile.config), profile.name, started=0.0).render())
    series = [(canonical_name(name), dict(labels)) for name, labels in template.series]
    cum = np.array([cumulative(name, template.types) for name, _ in template.series])
    integer = cum & ~np.array([name.endswith("_sum") for name, _ in template.series])
    increase, gauge, spread, pools = [], [], [], []
    whole = np.ones(len(series), dtype=bool)
    warmup = 60.0
    for level, rate in enumerate(LEVELS):
        values, finished = [], []
        replica = VirtualReplica("calibration", profile.name, profile.config)
        for scrape in run(
            [replica], 0.0, warmup + minutes * 60 + 5, interval_s=5.0, rate=rate, shape=shape, seed=seed * 100 + level
        ):
            if scrape.ts >= warmup:
                values.append(parse(scrape.text).values)
                finished.extend(scrape.finished)
        v = np.array(values, dtype=float)
        whole &= np.all(v == np.round(v), axis=0)
        span_min = (len(v) - 1) * 5.0 / 60.0
        increase.append(np.where(cum, (v[-1] - v[0]) / span_min, 0.0))
        gauge.append(np.where(cum, 0.0, v.mean(axis=0)))
        spread.append(np.where(cum, 0.0, v.std(axis=0)))
        done = [r for r in finished if r.first_token_at is not None and r.finished_at is not None]
        pools.append(
            {
                "ttft": np.array([r.first_token_at - r.arrival for r in done]),
                "e2e": np.array([r.finished_at - r.arrival for r in done]),
                "itl": np.array([(r.finished_at - r.first_token_at) / max(r.generated - 1, 1) for r in done]),
                "queue": np.array([(r.first_scheduled or r.finished_at) - r.arrival for r in done]),
                "prompt": np.array([r.prompt_len for r in done]),
                "completion": np.array([r.generated for r in done]),
                "cached": np.array([r.cached_tokens for r in done]),
                "max_tokens": np.array([r.max_tokens for r in done]),
            }
        )
    return Calibration(
        series,
        cum,
        integer,
        whole & ~cum,
        np.array(LEVELS),
        np.array(increase),
        np.array(gauge),
        np.array(spread),
        pools,
    )


# ---------------------------------------------------------------------------- the fleet's story
@dataclass(frozen=True)
class Replica:
    index: int
    name: str
    profile: ModelProfile
    factor: float  # this replica's share of its model's traffic, relative to the mean

    @property
    def labels(self) -> dict[str, str]:
        return {
            "job": "vllm",
            "instance": f"10.{self.index // 250}.{self.index % 250}.1:8000",
            "replica": self.name,
            "model": self.profile.name,
            "gpu_type": self.profile.gpu_type,
            "gpu_count": str(self.profile.gpu_count),
        }


def fleet(replicas: int, seed: int = 0) -> list[Replica]:
    rng = np.random.default_rng(seed)
    out = []
    counts = [round(replicas * p.share) for p in PROFILES]
    counts[0] = replicas - sum(counts[1:])
    index = 0
    for profile, count in zip(PROFILES, counts, strict=True):
        for n in range(count):
            out.append(
                Replica(index, f"{profile.name.split('-')[-1]}-{n:03d}", profile, float(rng.uniform(0.85, 1.15)))
            )
            index += 1
    return out


def load(t: np.ndarray, end: float) -> np.ndarray:
    """Traffic relative to the peak at epoch seconds ``t``: daily cycle (peak 15:00 UTC),
    quieter weekends, 1 % growth per day towards ``end``."""
    hour = (t % 86400) / 3600.0
    daily = 0.55 + 0.45 * np.cos((hour - 15.0) / 24.0 * 2 * math.pi)
    weekday = ((t // 86400) + 4) % 7  # 1970-01-01 was a Thursday
    weekly = np.where(weekday >= 5, 0.7, 1.0)
    growth = 1.0 + 0.01 * (t - end) / 86400.0
    return daily * weekly * growth


def long_share(t: np.ndarray, end: float) -> np.ndarray:
    """Share of traffic with long-context prompts: hooli's rollout, six days before ``end``."""
    rollout = end - 6 * 86400 + 9 * 3600
    return np.where(t >= rollout, 0.22, 0.02)


def tenant_mix(t: float, end: float) -> dict[str, float]:
    mix = dict(TENANTS)
    if t >= end - 3 * 86400:  # globex moves its batch jobs onto the fleet
        mix["globex"] += 0.15
    total = sum(mix.values())
    return {k: v / total for k, v in mix.items()}


# ---------------------------------------------------------------------------- writing
@dataclass
class SeedReport:
    replicas: int = 0
    series: int = 0
    raw_samples: int = 0
    minute_rows: int = 0
    hour_rows: int = 0
    requests: int = 0
    seconds: float = 0.0
    start: datetime | None = None
    raw_start: datetime | None = None
    end: datetime | None = None


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


def seed(
    client: Client,
    *,
    replicas: int = 200,
    days: float = 30,
    raw_hours: float = 1.0,
    minute_hours: float = 24.0,
    interval_s: float = 5.0,
    request_sample_rate: float = 0.01,
    end: datetime | None = None,
    seed_value: int = 0,
    progress: Callable[[str, float], None] = lambda _msg, _frac: None,
) -> SeedReport:
    """Write ``days`` of history for ``replicas`` engines ending at ``end`` (now)."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed_value)
    report = SeedReport(replicas=replicas)
    end_dt = (end or datetime.now(UTC)).astimezone(UTC).replace(second=0, microsecond=0)
    end_s = end_dt.timestamp()
    raw_start = math.floor((end_s - raw_hours * 3600) / 60) * 60  # the raw samples finish its hour
    minute_start = math.floor((raw_start - minute_hours * 3600) / 3600) * 3600
    start = math.floor((end_s - days * 86400) / 3600) * 3600
    if not start < minute_start <= raw_start < end_s:
        raise ValueError("need days > minute_hours + raw_hours, and raw_hours > 0")
    report.start, report.raw_start, report.end = (datetime.fromtimestamp(x, UTC) for x in (start, raw_start, end_s))

    progress("calibrating the engine model", 0.0)
    cals = {}
    for profile in PROFILES:
        cals[(profile.name, "chat")] = calibrate(profile, CHAT, seed=seed_value)
        cals[(profile.name, "long")] = calibrate(profile, LONG, seed=seed_value)
    fleet_replicas = fleet(replicas, seed_value)
    crash = fleet_replicas[len(fleet_replicas) // 3].name  # restarts in the raw window

    hours = np.arange(start, minute_start, 3600.0)
    minutes = np.arange(minute_start, raw_start, 60.0)
    steps = np.arange(raw_start, end_s, interval_s)
    series_rows: dict[str, list] = {
        "fingerprint": [],
        "metric": [],
        "original_metric": [],
        "labels": [],
        "first_seen": [],
        "last_seen": [],
    }
    hour_frames: list[pa.Table] = []
    minute_frames: list[pa.Table] = []
    raw_frames: list[pa.Table] = []
    scrape_rows: list[pd.DataFrame] = []
    pending = 0

    def flush(force: bool = False) -> None:
        nonlocal pending
        if pending < 4_000_000 and not force:
            return
        for table, frames in (("samples_1h", hour_frames), ("samples_1m", minute_frames), ("samples", raw_frames)):
            if frames:
                client.insert_arrow(table, pa.concat_tables(frames))
                frames.clear()
        if scrape_rows:
            client.insert_df("scrapes", pd.concat(scrape_rows, ignore_index=True))
            scrape_rows.clear()
        pending = 0

    for n, replica in enumerate(fleet_replicas):
        cal = cals[(replica.profile.name, "chat")]
        labels = [{**exposed, **replica.labels} for _, exposed in cal.series]
        metric = np.array([m for m, _ in cal.series])
        fps = np.array([fingerprint(m, lab) for (m, _), lab in zip(cal.series, labels, strict=True)], dtype=np.uint64)
        series_rows["fingerprint"].extend(fps.tolist())
        series_rows["metric"].extend(metric.tolist())
        series_rows["original_metric"].extend(metric.tolist())
        series_rows["labels"].extend(labels)
        series_rows["first_seen"].extend([start] * len(fps))
        series_rows["last_seen"].extend([end_s] * len(fps))
        peak = replica.profile.peak_rate * replica.factor

        def shape_at(t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            rate = peak * load(t, end_s)  # noqa: B023
            return _profile_at(cals, replica.profile, rate, long_share(t, end_s))  # noqa: B023

        # hours at hour resolution, then minutes, then raw steps; counters carry on across them
        inc_h, gauge_h, spread_h = shape_at(hours + 1800)
        inc_h = inc_h * 60 * rng.gamma(400, 1 / 400, size=(len(hours), 1))
        inc_m, gauge_m, spread_m = shape_at(minutes + 30)
        inc_m = inc_m * rng.gamma(50, 1 / 50, size=(len(minutes), 1))
        cum_float = np.cumsum(np.vstack([inc_h, inc_m]), axis=0)
        cum = np.where(cal.integer, np.floor(cum_float), cum_float)
        inc_all = np.diff(np.vstack([np.zeros((1, len(fps))), cum]), axis=0)
        cum_h, cum_m = cum[: len(hours)], cum[len(hours) :]
        hour_frames.append(
            _tier_frame(
                metric,
                fps,
                hours,
                3600.0,
                interval_s,
                inc_all[: len(hours)],
                cum_h,
                gauge_h,
                spread_h,
                cal.cumulative,
                rng,
            )
        )
        range_m = _gauge_range(metric, gauge_m, spread_m, rng)
        minute_frames.append(
            _tier_frame(
                metric,
                fps,
                minutes,
                60.0,
                interval_s,
                inc_all[len(hours) :],
                cum_m,
                gauge_m,
                spread_m,
                cal.cumulative,
                rng,
                range_m,
            )
        )
        # the 1 h rows of the minute-resolution stretch: sums of its minutes (the last hour may be
        # partial: the raw samples' view adds the rest of it, and the rows merge)
        k = 0
        if len(minutes):
            hour_of = ((minutes - minute_start) // 3600).astype(int)
            first = np.flatnonzero(np.r_[True, np.diff(hour_of) > 0])
            last = np.r_[first[1:], len(minutes)] - 1
            counts = (last - first + 1).astype(float)
            k = len(first)
            hour_frames.append(
                _tier_frame(
                    metric,
                    fps,
                    minute_start + 3600.0 * hour_of[first],
                    counts * 60.0,
                    interval_s,
                    np.add.reduceat(inc_all[len(hours) :], first, axis=0),
                    cum_m[last],
                    np.add.reduceat(gauge_m, first, axis=0) / counts[:, None],
                    np.add.reduceat(spread_m, first, axis=0) / counts[:, None],
                    cal.cumulative,
                    rng,
                    (np.minimum.reduceat(range_m[0], first, axis=0), np.maximum.reduceat(range_m[1], first, axis=0)),
                )
            )
        # raw samples: per-scrape shares of each minute's work
        inc_s, gauge_s, spread_s = shape_at(steps)
        inc_s = inc_s * (interval_s / 60.0) * rng.gamma(8, 1 / 8, size=(len(steps), 1))
        base = cum[-1] if len(cum) else np.zeros(len(fps))
        cum_s = base + np.cumsum(inc_s, axis=0)
        value = np.where(cal.integer, np.floor(cum_s), cum_s)
        prev = np.vstack([base, value[:-1]])
        if replica.name == crash:  # the engine restarts: its counters start again from zero
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
        raw_frames.append(
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
        scrape_rows.append(
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
        report.series += len(fps)
        report.hour_rows += len(hours) * len(fps) + k * len(fps)
        report.minute_rows += len(minutes) * len(fps)
        report.raw_samples += len(steps) * len(fps)
        pending += (len(hours) + len(minutes) + len(steps) + k) * len(fps)
        flush()
        progress(f"metrics: replica {n + 1}/{len(fleet_replicas)}", 0.05 + 0.75 * (n + 1) / len(fleet_replicas))
    flush(force=True)
    client.insert_df(
        "series",
        pd.DataFrame(series_rows).assign(
            first_seen=lambda d: pd.to_datetime(d["first_seen"], unit="s", utc=True),
            last_seen=lambda d: pd.to_datetime(d["last_seen"], unit="s", utc=True),
        ),
    )

    report.requests = _seed_requests(client, cals, fleet_replicas, start, end_s, request_sample_rate, rng, progress)
    report.seconds = time.perf_counter() - t0
    progress("done", 1.0)
    return report


def _hours(start: float, end: float) -> Iterator[float]:
    t = start
    while t < end:
        yield t
        t += 3600.0


def _seed_requests(
    client: Client,
    cals: dict[tuple[str, str], Calibration],
    replicas: list[Replica],
    start: float,
    end: float,
    rate: float,
    rng: np.random.Generator,
    progress: Callable[[str, float], None],
) -> int:
    """Sampled gateway request-log rows (weight 1/rate) for every hour of the history."""
    by_model: dict[str, list[Replica]] = {}
    for r in replicas:
        by_model.setdefault(r.profile.name, []).append(r)
    frames, total, hours = [], 0, list(_hours(start, end))
    weight = np.float32(1.0 / rate)
    for i, hour in enumerate(hours):
        span = min(3600.0, end - hour)  # the last hour ends now, not in the future
        mix = tenant_mix(hour, end)
        share = float(long_share(np.array([hour]), end)[0])
        for model, group in by_model.items():
            profile = group[0].profile
            fleet_rate = sum(r.factor for r in group) * profile.peak_rate * float(load(np.array([hour + 1800]), end)[0])
            n = int(rng.poisson(fleet_rate * span * rate))
            if n == 0:
                continue
            per_replica = fleet_rate / len(group)
            level = int(np.clip(np.searchsorted(LEVELS, per_replica), 0, len(LEVELS) - 1))
            is_long = rng.random(n) < share
            columns: dict[str, np.ndarray] = {}
            for key in ("ttft", "e2e", "itl", "queue", "prompt", "completion", "cached", "max_tokens"):
                chat_pool = cals[(model, "chat")].requests[level][key]
                long_pool = cals[(model, "long")].requests[level][key]
                columns[key] = np.where(
                    is_long,
                    long_pool[rng.integers(0, len(long_pool), n)],
                    chat_pool[rng.integers(0, len(chat_pool), n)],
                )
            tenants = rng.choice(list(mix), size=n, p=list(mix.values()))
            tenants = np.where(is_long, "hooli", tenants)
            ts = hour + np.sort(rng.random(n)) * span
            frames.append(
                pd.DataFrame(
                    {
                        "ts": pd.to_datetime(ts, unit="s", utc=True),
                        "source": "gateway",
                        "request_id": [f"seed-{int(hour)}-{model}-{j}" for j in range(n)],
                        "trace_id": "",
                        "replica": np.array([r.name for r in group])[rng.integers(0, len(group), n)],
                        "model": model,
                        "tenant": tenants,
                        "route": ROUTES[model],
                        "status_code": np.uint16(200),
                        "outcome": "ok",
                        "finish_reason": np.where(columns["completion"] >= columns["max_tokens"], "length", "stop"),
                        "prompt_tokens": columns["prompt"].astype(np.uint32),
                        "completion_tokens": columns["completion"].astype(np.uint32),
                        "cached_tokens": columns["cached"].astype(np.uint32),
                        "max_tokens": columns["max_tokens"].astype(np.uint32),
                        "ttft_seconds": columns["ttft"].astype(np.float32),
                        "e2e_seconds": columns["e2e"].astype(np.float32),
                        "queue_seconds": columns["queue"].astype(np.float32),
                        "itl_seconds": columns["itl"].astype(np.float32),
                        "tpot_seconds": columns["itl"].astype(np.float32),
                        "weight": weight,
                        "stream": np.uint8(1),
                    }
                )
            )
            total += n
        if sum(len(f) for f in frames) > 500_000 or i == len(hours) - 1:
            if frames:
                client.insert_df("requests", pd.concat(frames, ignore_index=True))
                frames = []
            progress(f"request log: day {int((hour - start) // 86400) + 1}", 0.8 + 0.2 * (i + 1) / len(hours))
    return total
