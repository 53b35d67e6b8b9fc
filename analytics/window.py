"""What every query of ``analytics`` is asked over: a window, and the options that shape the read.

In:  the window's ``start`` and ``end`` and, optionally, a forced tier, the retention the planner
     assumes, the current time and ``Filters``.
Out: ``Scope`` (the options alone, a ``TypedDict``: the functions of ``analytics`` take them as
     ``**scope``, typed, instead of repeating four keyword parameters each), ``scope_parts``
     (the four, for a body that reads them) and ``Window`` (the window and its scope in one
     value, for code that carries both).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from analytics.filters import Filters
from storage.retention import Retention

__all__ = ["Scope", "Window", "scope_parts"]


class Scope(TypedDict, total=False):
    tier: str | None  # a tier forced by name (raw, 1m, 1h, 6h); None: the planner picks
    retention: Retention | None  # what each tier keeps; None: the defaults
    now: datetime | None  # the current time (tests, replays); None: now
    filters: Filters | None  # model, replica, tenant, route


def scope_parts(scope: Scope) -> tuple[str | None, Retention | None, datetime | None, Filters | None]:
    return scope.get("tier"), scope.get("retention"), scope.get("now"), scope.get("filters")


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    tier: str | None = None
    retention: Retention | None = None
    now: datetime | None = None
    filters: Filters | None = None

    def scope(self) -> Scope:
        return Scope(tier=self.tier, retention=self.retention, now=self.now, filters=self.filters)
