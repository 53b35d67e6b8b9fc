"""What every query of ``analytics`` is asked over: a window, and the options that shape the read.

In:  the window's ``start`` and ``end`` and, optionally, a forced tier, the retention the planner
     assumes, the current time and ``Filters``.
Out: ``Scope`` (the options alone, a ``TypedDict``: the functions of ``analytics`` take them as
     ``**scope``, typed, instead of repeating four keyword parameters each, and hand them on
     whole; ``analytics.tiers.plan_scope`` plans a read from one), ``rescope`` (the same
     scope with some options replaced: other filters, a tier already chosen) and ``Window`` (the window
     and its scope in one value, for code that carries both).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from typing_extensions import Unpack

from analytics.filters import Filters
from storage.retention import Retention

__all__ = ["Scope", "Window", "rescope"]


class Scope(TypedDict, total=False):
    tier: str | None  # a tier forced by name (raw, 1m, 1h, 6h); None: the planner picks
    retention: Retention | None  # what each tier keeps; None: the defaults
    now: datetime | None  # the current time (tests, replays); None: now
    filters: Filters | None  # model, replica, tenant, route


def rescope(scope: Scope, **changes: Unpack[Scope]) -> Scope:
    """``scope`` with some of its options replaced (a caller that narrows the filters, or reads on
    a tier already chosen), the others handed on as they are."""
    out = Scope(**scope)
    out.update(changes)
    return out


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
