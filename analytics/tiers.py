"""Which table answers a time range: raw, 1-minute or 1-hour rollups.

In:  a query window ``[start, end)``, the current time and the retention of each tier
     (``Retention``, from the ``clickhouse.retention`` settings).
Out: a ``Plan``: the tier, its tables (``samples``/``requests``, ``samples_1m``/``requests_1m``,
     ``samples_1h``/``requests_1h``) and the window aligned to the tier's resolution.

Rule (after SigNoz, DESIGN.md section 6): the finest tier whose span limit covers the window
and whose retention still holds its start: raw up to ``raw_max_span`` (6 h by default), 1 min
up to ``minute_max_span`` (7 days), 1 h beyond. A rollup window is widened to whole buckets
(start floored, end ceiled), so a rollup answer covers at most one bucket more at each end
than asked; ``Plan.start``/``Plan.end`` say exactly which window was answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["HOUR", "MINUTE", "RAW", "TIERS", "Plan", "Retention", "Tier", "plan"]


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
TIERS = {t.name: t for t in (RAW, MINUTE, HOUR)}


@dataclass(frozen=True)
class Retention:
    """Days each tier keeps (0: forever). Defaults match ``clickhouse.retention``."""

    raw_days: float = 7
    requests_days: float = 30
    minute_days: float = 90
    hour_days: float = 730
    raw_max_span: timedelta = timedelta(hours=6)
    minute_max_span: timedelta = timedelta(days=7)

    def keeps(self, days: float, start: datetime, now: datetime) -> bool:
        return days <= 0 or start >= now - timedelta(days=days)


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


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


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
) -> Plan:
    """The table and aligned window that answer ``[start, end)``.

    ``kind`` is ``samples`` (metrics) or ``requests`` (the request log: its raw table has its
    own retention). ``tier`` forces one (``raw``, ``1m``, ``1h``), e.g. to compare them.
    """
    start, end = _utc(start), _utc(end)
    if end <= start:
        raise ValueError(f"empty window: end {end:%Y-%m-%d %H:%M:%S} is not after start {start:%Y-%m-%d %H:%M:%S}")
    if kind not in ("samples", "requests"):
        raise ValueError("kind must be 'samples' or 'requests'")
    if tier is not None:
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; one of {', '.join(TIERS)}")
        chosen = TIERS[tier]
    else:
        now = _utc(now) if now is not None else datetime.now(UTC)
        r = retention or Retention()
        span = end - start
        raw_days = r.raw_days if kind == "samples" else r.requests_days
        if span <= r.raw_max_span and r.keeps(raw_days, start, now):
            chosen = RAW
        elif span <= r.minute_max_span and r.keeps(r.minute_days, start, now):
            chosen = MINUTE
        else:
            chosen = HOUR
    if chosen.rollup:
        start, end = _align(start, end, chosen.resolution)
    return Plan(chosen, start, end)
