"""Which table answers a time range: raw, 1-minute, 1-hour or (samples) 6-hour rollups.

In:  a query window ``[start, end)``, the current time, the retention of each tier
     (``Retention``, from the ``clickhouse.retention`` settings: ``for_queries()``) and,
     when a client is at hand, where each tier's data begins (``coverage``); ``plan_scope``
     takes the tier, retention and time from a ``Scope`` (what every read of ``analytics`` does).
Out: a ``Plan``: the tier, its tables (``samples``/``requests``, ``samples_1m``/``requests_1m``,
     ``samples_1h``/``requests_1h``, ``samples_6h``) and the window aligned to the tier's resolution.

Rule (after SigNoz, DESIGN.md section 6): the finest tier whose span limit covers the window
and whose retention (and data, when known) still holds its start: raw up to ``raw_max_span``
(6 h by default), 1 min up to ``minute_max_span`` (7 days), 1 h up to ``hour_max_span`` (15 days),
6 h beyond (samples only: the request log's 1-hour rollup is small; a 6-hour tier that does not
hold the start yet, in a store migrated recently, gives way to the 1-hour one). The data check
matters where a tier begins later than its retention says: a store migrated recently, or
synthetic history (``fleetscope bench seed``) written at 1-minute resolution for its last day
only; raw rows that begin within a minute of the start still hold it. A rollup window is widened to whole buckets
(start floored, end ceiled), so a rollup answer covers at most one bucket more at each end
than asked; ``Plan.start``/``Plan.end`` say exactly which window was answered.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from analytics.errors import BadInput, BadWindow
from analytics.window import Scope
from common.timeutil import as_utc
from storage.clickhouse import Client
from storage.retention import Retention

__all__ = [
    "HOUR",
    "MINUTE",
    "RAW",
    "SIX_HOURS",
    "TIERS",
    "Plan",
    "Retention",
    "Tier",
    "align",
    "between",
    "coverage",
    "param_time",
    "plan",
    "plan_scope",
    "time_param",
]


@dataclass(frozen=True)
class Tier:
    name: str
    samples: str  # table of metric samples (raw) or their rollup
    requests: str  # table of request rows (raw) or their rollup
    resolution: timedelta  # bucket width; zero for raw

    @property
    def rollup(self) -> bool:
        return self.resolution > timedelta(0)


RAW = Tier("raw", "samples", "requests", timedelta(0))
MINUTE = Tier("1m", "samples_1m", "requests_1m", timedelta(minutes=1))
HOUR = Tier("1h", "samples_1h", "requests_1h", timedelta(hours=1))
# samples only: the request log keeps no 6-hour rollup (``plan`` never picks this tier for it)
SIX_HOURS = Tier("6h", "samples_6h", "requests_1h", timedelta(hours=6))
TIERS = {t.name: t for t in (RAW, MINUTE, HOUR, SIX_HOURS)}


@dataclass(frozen=True)
class Plan:
    tier: Tier
    start: datetime
    end: datetime

    @property
    def samples(self) -> str:
        return self.tier.samples

    @property
    def requests(self) -> str:
        return self.tier.requests


def param_time(value: datetime) -> str:
    """A query parameter for a ``DateTime64(3)`` placeholder, to the millisecond (a datetime
    parameter would be formatted to whole seconds)."""
    return as_utc(value).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def time_param(name: str, rollup: bool) -> str:
    """SQL for the ``param_time`` parameter ``name`` compared with a table's ``ts``: a rollup's
    ``ts`` is a ``DateTime``, and comparing it with a ``DateTime64`` converts every row (a third
    of a 30-day panel's time); rollup windows are whole buckets, so whole seconds lose nothing."""
    return f"toDateTime({{{name}:DateTime64(3)}})" if rollup else f"{{{name}:DateTime64(3)}}"


def between(rollup: bool, column: str = "ts", start: str = "start", end: str = "end") -> str:
    """SQL: ``column`` in ``[start, end)``, the parameters typed as ``time_param`` says."""
    return f"{column} >= {time_param(start, rollup)} AND {column} < {time_param(end, rollup)}"


# client -> kind -> (when read, tier -> earliest row); weak, so a closed client's entry goes
_COVERAGE: weakref.WeakKeyDictionary[Any, dict[str, tuple[float, dict[str, datetime | None]]]] = (
    weakref.WeakKeyDictionary()
)
COVERAGE_TTL_S = 60.0
RAW_GRACE = timedelta(minutes=1)  # raw data beginning this soon after a window's start still holds it


def coverage(client: Client, kind: str = "samples") -> dict[str, datetime | None]:
    """Tier name -> the earliest time its table holds (None: empty), cached for a minute per
    client. Answered from part metadata (the tables are partitioned by time), so it is cheap."""
    try:
        cached = _COVERAGE.setdefault(client, {})
    except TypeError:  # a client that cannot be weakly referenced: no cache
        cached = {}
    hit = cached.get(kind)
    now = time.monotonic()
    if hit is not None and now - hit[0] < COVERAGE_TTL_S:
        return hit[1]
    found: dict[str, datetime | None] = {}
    for tier in TIERS.values():
        if kind == "requests" and tier is SIX_HOURS:
            continue
        table = tier.samples if kind == "samples" else tier.requests
        rows, earliest = client.query(f"SELECT count(), min(ts) FROM {table}").result_rows[0]
        found[tier.name] = as_utc(earliest) if rows else None
    cached[kind] = (now, found)
    return found


def align(start: datetime, end: datetime, step: timedelta) -> tuple[datetime, datetime]:
    """``[start, end)`` widened to whole steps (epoch-aligned): start floored, end ceiled."""
    return _align(as_utc(start), as_utc(end), step)


def _align(start: datetime, end: datetime, step: timedelta) -> tuple[datetime, datetime]:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    s = epoch + ((start - epoch) // step) * step
    e = epoch + -((epoch - end) // step) * step  # ceiling
    return s, e


def plan(
    start: datetime,
    end: datetime,
    *,
    now: datetime | None = None,
    retention: Retention | None = None,
    kind: str = "samples",
    tier: str | None = None,
    data: dict[str, datetime | None] | None = None,
) -> Plan:
    """The table and aligned window that answer ``[start, end)``.

    ``kind`` is ``samples`` (metrics) or ``requests`` (the request log: its raw table has its
    own retention). ``tier`` forces one (``raw``, ``1m``, ``1h``, for samples ``6h``), e.g. to compare them.
    ``data`` (from ``coverage``) says where each tier's rows begin: a tier that begins after
    ``start`` is passed over for a coarser one that holds the start.
    """
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        raise BadWindow(f"empty window: end {end:%Y-%m-%d %H:%M:%S} is not after start {start:%Y-%m-%d %H:%M:%S}")
    if kind not in ("samples", "requests"):
        raise BadInput("kind must be 'samples' or 'requests'")
    if tier is not None:
        if tier not in TIERS or (kind == "requests" and TIERS[tier] is SIX_HOURS):
            names = [n for n, t in TIERS.items() if kind == "samples" or t is not SIX_HOURS]
            raise BadInput(f"unknown tier {tier!r} for {kind}; one of {', '.join(names)}")
        chosen: Tier | None = TIERS[tier]
    else:
        now = as_utc(now) if now is not None else datetime.now(UTC)
        r = retention or Retention()
        span = end - start
        raw_days = r.raw_days if kind == "samples" else r.requests_days

        def holds(name: str) -> bool:
            if data is None or name not in data:
                return True
            begins = data[name]
            # empty, or beginning after the window starts (bucket-aligned: a rollup bucket
            # that contains the start counts)
            if begins is None:
                return False
            resolution = TIERS[name].resolution
            if not resolution:  # raw rows begin at the first scrape or request: allow for that
                return begins <= start + RAW_GRACE
            return begins <= _align(start, start + resolution, resolution)[0]

        candidates = []
        if span <= r.raw_max_span and r.keeps(raw_days, start, now):
            candidates.append(RAW)
        if span <= r.minute_max_span and r.keeps(r.minute_days, start, now):
            candidates.append(MINUTE)
        if kind == "samples" and span > r.hour_max_span and holds(SIX_HOURS.name):
            candidates.append(SIX_HOURS)  # preferred to the 1-hour tier: 6x fewer rows, still 60+ steps
        candidates.append(HOUR)
        # the finest that holds the start; else the finest with data unless a coarser one has
        # rows from an earlier bucket (older history kept at a coarser resolution): in a store
        # younger than the window every tier begins together, and the finest tells the most
        chosen = None
        for i, t in enumerate(candidates):
            if holds(t.name):
                chosen = t
                break
            found = data or {}
            begins = found.get(t.name)
            if begins is None:
                continue
            if not any(
                (earlier := found.get(c.name)) is not None
                and earlier < _align(begins, begins + c.resolution, c.resolution)[0]
                for c in candidates[i + 1 :]
            ):
                chosen = t
                break
        chosen = chosen or candidates[0]
    assert chosen is not None
    if chosen.rollup:
        start, end = _align(start, end, chosen.resolution)
    return Plan(chosen, start, end)


def plan_scope(client: Client, start: datetime, end: datetime, scope: Scope, *, kind: str = "samples") -> Plan:
    """``plan`` for a read through ``client`` asked over ``scope`` (its forced tier, retention and
    current time; its filters do not choose the table): where each tier's data begins is looked
    up (``coverage``) unless a tier is forced. The one way ``analytics`` plans a read."""
    tier = scope.get("tier")
    data = coverage(client, kind) if tier is None else None
    return plan(start, end, now=scope.get("now"), retention=scope.get("retention"), kind=kind, tier=tier, data=data)
