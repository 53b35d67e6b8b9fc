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

The parts: ``history_calibration`` (the engine model, measured), ``history_story`` (the fleet,
its load and tenants), ``history_rows`` (the metric rows) and ``history_requests`` (the request
log); ``seed`` here runs them in that order and reports what it wrote.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np

from fleetscope.history_calibration import calibrate_profiles
from fleetscope.history_requests import write_requests
from fleetscope.history_rows import MetricCounts, Span, write_metrics
from fleetscope.history_story import fleet
from storage.clickhouse import Client

__all__ = ["SeedReport", "seed"]


@dataclass
class SeedReport(MetricCounts):
    """The metric rows written (``MetricCounts``), the request-log rows, the history's stretches."""

    replicas: int = 0
    requests: int = 0
    seconds: float = 0.0
    start: datetime | None = None
    raw_start: datetime | None = None
    end: datetime | None = None


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
    story_end: datetime | None = None,
    seed_value: int = 0,
    progress: Callable[[str, float], None] = lambda _msg, _frac: None,
) -> SeedReport:
    """Write ``days`` of history for ``replicas`` engines ending at ``end`` (now). ``story_end``:
    the load's daily and weekly cycle runs as if the history ended then (by default at ``end``):
    the benches pin it, so that what depends on the load at the end (the raw samples' bytes: the
    value column follows the load) does not move with the hour they run at."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed_value)
    report = SeedReport(replicas=replicas)
    span = _span(end, days, raw_hours, minute_hours, interval_s)
    if story_end is not None:
        span = replace(span, clock=story_end.timestamp() - span.end)
    report.start, report.raw_start, report.end = (
        datetime.fromtimestamp(x, UTC) for x in (span.start, span.raw_start, span.end)
    )

    progress("calibrating the engine model", 0.0)
    cals = calibrate_profiles(seed_value)
    fleet_replicas = fleet(replicas, seed_value)
    write_metrics(client, cals, fleet_replicas, span, rng, progress, counts=report)

    report.requests = write_requests(
        client, cals, fleet_replicas, span.start, span.end, request_sample_rate, rng, progress, span.clock
    )
    report.seconds = time.perf_counter() - t0
    progress("done", 1.0)
    return report


def _span(end: datetime | None, days: float, raw_hours: float, minute_hours: float, interval_s: float) -> Span:
    """The history's stretches, ending at ``end`` (now) on a whole minute: the raw samples finish
    their hour, the minute rows start on an hour, the history on an hour ``days`` back."""
    end_dt = (end or datetime.now(UTC)).astimezone(UTC).replace(second=0, microsecond=0)
    end_s = end_dt.timestamp()
    raw_start = math.floor((end_s - raw_hours * 3600) / 60) * 60  # the raw samples finish its hour
    minute_start = math.floor((raw_start - minute_hours * 3600) / 3600) * 3600
    start = math.floor((end_s - days * 86400) / 3600) * 3600
    if not start < minute_start <= raw_start < end_s:
        raise ValueError("need days > minute_hours + raw_hours, and raw_hours > 0")
    return Span(start, minute_start, raw_start, end_s, interval_s)
