"""The filters every analytics function takes: model, replica, tenant, route.

In:  ``Filters(model=..., replica=..., tenant=..., route=...)``: each a value or a list of
     values (empty: everything).
Out: SQL conditions with their query parameters, for series (engine metrics carry ``model``
     and ``replica`` labels) and for request rows (``model``, ``tenant``, ``route``, and
     ``replica`` on the raw tier; ``request_rows`` adds the rows' source). ``unapplied(kind)`` names the filters a
     view cannot honour
     (engine metrics know no tenant or route), so a page can say so instead of silently
     showing unfiltered numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analytics.errors import BadInput

__all__ = ["Filters", "request_rows"]


Values = str | list[str] | tuple[str, ...] | None  # one value, several, or none (no filter)


def _values(value: Values) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class Filters:
    model: tuple[str, ...] = field(default=())
    replica: tuple[str, ...] = field(default=())
    tenant: tuple[str, ...] = field(default=())
    route: tuple[str, ...] = field(default=())

    def __init__(
        self, model: Values = None, replica: Values = None, tenant: Values = None, route: Values = None
    ) -> None:
        object.__setattr__(self, "model", _values(model))
        object.__setattr__(self, "replica", _values(replica))
        object.__setattr__(self, "tenant", _values(tenant))
        object.__setattr__(self, "route", _values(route))

    def _conditions(self, columns: dict[str, str], prefix: str) -> tuple[str, dict[str, object]]:
        parts: list[str] = []
        params: dict[str, object] = {}
        for name, column in columns.items():
            values = getattr(self, name)
            if values:
                key = f"{prefix}{name}"
                parts.append(f"{column} IN {{{key}:Array(String)}}")
                params[key] = list(values)
        return " AND ".join(parts), params

    def series(self, alias: str = "s.") -> tuple[str, dict[str, object]]:
        """Conditions on a series row (``model``, ``replica``); "" when none apply."""
        return self._conditions({"model": f"{alias}model", "replica": f"{alias}replica"}, "f_s_")

    def requests(self, raw: bool = True) -> tuple[str, dict[str, object]]:
        """Conditions on request rows (``replica`` only where rows keep it: the raw tier)."""
        columns = {"model": "model", "tenant": "tenant", "route": "route"}
        if raw:
            columns["replica"] = "replica"
        elif self.replica:
            raise BadInput(
                "the request rollups have no replica: filter by replica on the raw tier "
                "(recent windows) or use the engine metrics"
            )
        return self._conditions(columns, "f_r_")

    def unapplied(self, kind: str) -> list[str]:
        """The filters a ``kind`` ('samples' or 'requests') view cannot apply."""
        names = ("tenant", "route") if kind == "samples" else ()
        return [n for n in names if getattr(self, n)]

    def __bool__(self) -> bool:
        return bool(self.model or self.replica or self.tenant or self.route)


NONE = Filters()


def request_rows(source: str | None, filters: Filters | None, raw: bool = True) -> tuple[str, dict[str, object]]:
    """SQL conditions on request rows: their ``source`` (None: every source) and the filters;
    ``"1"`` when there are none."""
    parts: list[str] = []
    params: dict[str, object] = {}
    if source is not None:
        parts.append("source = {source:String}")
        params["source"] = source
    if filters:
        condition, extra = filters.requests(raw=raw)
        if condition:
            parts.append(condition)
            params.update(extra)
    return " AND ".join(parts) or "1", params
