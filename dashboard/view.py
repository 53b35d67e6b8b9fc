"""The global controls every page shares, as plain data: time range, refresh interval, filters.

In:  the URL query string (``range=1h``, or ``from=...&to=...`` in ISO 8601; ``refresh=30``;
     ``model=a,b``, ``replica=``, ``tenant=``, ``route=``) and the current time.
Out: a ``View`` (the window, the refresh interval, ``analytics.filters.Filters``) and back, the
     query-string parameters of a view, so that a view can be shared as a link. Bad values fall
     back to the defaults and are listed in ``View.problems`` (shown, not raised).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from analytics.filters import Filters
from common.timeutil import as_utc

__all__ = ["MAX_GRAIN_S", "RANGES", "REFRESH", "View", "floor_time", "grain", "read_view", "view_params"]

RANGES = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
REFRESH = (0, 10, 30, 60, 300)  # seconds; 0: off
DEFAULT_RANGE, DEFAULT_REFRESH = "1h", 0
FILTER_KEYS = ("model", "replica", "tenant", "route")


@dataclass(frozen=True)
class View:
    start: datetime
    end: datetime
    range_key: str  # one of RANGES, or "custom"
    refresh_s: int
    filters: Filters
    problems: tuple[str, ...] = field(default=())

    @property
    def span(self) -> timedelta:
        return self.end - self.start


MAX_GRAIN_S = 600


def grain(span: timedelta, longest: int = MAX_GRAIN_S) -> int:
    """Seconds a relative window of ``span`` moves by: 10 s up to 12 hours, then span/4320 (20 s
    for a day, 140 s for a week), at most ``longest`` (``dashboard.max_grain_s``; 10 minutes by
    default: 30 days, a 6-hour chart step, move by 10 minutes)."""
    return int(max(10, min(longest, span.total_seconds() // 4320 // 10 * 10)))


def floor_time(t: datetime, seconds: int) -> datetime:
    epoch = int(t.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, UTC)


def _time(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return as_utc(parsed)


def read_view(params: Mapping[str, str], now: datetime | None = None, *, longest_grain: int = MAX_GRAIN_S) -> View:
    """The view a query string asks for (defaults: the last hour, no auto-refresh); a relative
    window moves by ``grain``, at most ``longest_grain`` seconds at a time."""
    now = now or datetime.now(UTC)
    problems: list[str] = []
    range_key = params.get("range", DEFAULT_RANGE)
    # a relative window ends at a whole multiple of its grain, so that reruns, refreshes and other
    # viewers within it share one window and read the cached answers
    now = floor_time(now, grain(RANGES.get(range_key, RANGES[DEFAULT_RANGE]), longest_grain))
    start = end = None
    if "from" in params or "to" in params:
        try:
            start, end = _time(params["from"]), _time(params.get("to") or now.isoformat())
            if end <= start:
                raise ValueError("it ends before it starts")
            range_key = "custom"
        except (KeyError, ValueError) as exc:
            problems.append(f"time range from={params.get('from')!r} to={params.get('to')!r} ignored: {exc}")
            start = end = None
            range_key = DEFAULT_RANGE
    if start is None or end is None:
        if range_key not in RANGES:
            problems.append(f"range={range_key!r} is not one of {', '.join(RANGES)}: showing {DEFAULT_RANGE}")
            range_key = DEFAULT_RANGE
        start, end = now - RANGES[range_key], now
    try:
        refresh = int(params.get("refresh", DEFAULT_REFRESH))
        if refresh < 0:
            raise ValueError
    except ValueError:
        problems.append(f"refresh={params.get('refresh')!r} is not a number of seconds: using {DEFAULT_REFRESH}")
        refresh = DEFAULT_REFRESH
    chosen = {key: [v for v in params.get(key, "").split(",") if v] for key in FILTER_KEYS}
    return View(start, end, range_key, refresh, Filters(**chosen), tuple(problems))


def view_params(view: View) -> dict[str, str]:
    """The query-string parameters of ``view`` (what ``read_view`` reads back)."""
    out: dict[str, str] = {}
    if view.range_key == "custom":
        out["from"], out["to"] = view.start.isoformat(), view.end.isoformat()
    else:
        out["range"] = view.range_key
    out["refresh"] = str(view.refresh_s)
    for key in FILTER_KEYS:
        values = getattr(view.filters, key)
        if values:
            out[key] = ",".join(values)
    return out
