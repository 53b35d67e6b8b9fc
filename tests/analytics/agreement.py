"""One cost rule, read three ways: for a view and a period, the showback's figure (``analytics.cost``),
the cost series' mean over the period's steps (``analytics.cost_series``: its spend over its tokens)
and explain's before / after (``analytics.explain.cost``) must be the same number."""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from analytics.cost import cost_by_adapter, cost_by_tenant, cost_per_token
from analytics.cost_series import cost_over_time
from analytics.explain import explain_cost
from analytics.filters import Filters

FLEET = "(fleet)"


def _by(view: Filters | None, adapters: set[str]) -> tuple[str, str]:
    """(the series' by, the value of the line) for a view."""
    if view is None:
        return "fleet", FLEET
    if view.tenant:
        return "tenant", view.tenant[0]
    if view.model and view.model[0] in adapters:
        return "adapter", view.model[0]
    return "model", view.model[0]


def showback_figure(
    client, a: datetime, b: datetime, prices, weights, view: Filters | None, adapters: set[str]
) -> float:
    """USD per 1M tokens of the view over ``[a, b)`` as the Cost page's tables read it."""
    by, value = _by(view, adapters)
    if by in ("fleet", "model"):
        table = cost_per_token(client, a, b, prices, weights=weights).set_index("model")
    elif by == "adapter":
        table = cost_by_adapter(client, a, b, prices, weights=weights).set_index("adapter")
    else:
        table = cost_by_tenant(client, a, b, prices, weights=weights).set_index("tenant")
    return float(table.loc[value, "cost_per_million_tokens"])


def series_figure(client, window, prices, weights, view: Filters | None, adapters: set[str], a, b, step) -> float:
    """The series over the whole window, its steps in ``[a, b)``: their spend over their tokens."""
    by, value = _by(view, adapters)
    series = cost_over_time(client, *window, prices, by=by, step=step, weights=weights)
    line = series[(series[by] == value) & (series["ts"] >= pd.Timestamp(a)) & (series["ts"] < pd.Timestamp(b))]
    return float(line["spend"].sum() / line["tokens"].sum() * 1e6)


def figures(client, window, prices, views, *, at: datetime, step=None, weights=None, adapters=()) -> list[dict]:
    """Per view and period: the three figures (and the period), for the caller to compare."""
    out = []
    for view in views:
        ex = explain_cost(client, *window, prices, filters=view, weights=weights, step=step, at=at)
        assert ex.periods is not None, (view, ex.sentence)
        p0, p1, p2 = ex.periods
        for name, (a, b), figure in (("before", (p0, p1), ex.before), ("after", (p1, p2), ex.after)):
            out.append(
                {
                    "view": ex.view,
                    "period": name,
                    "explain": figure,
                    "showback": showback_figure(client, a, b, prices, weights, view, set(adapters)),
                    "series": series_figure(client, window, prices, weights, view, set(adapters), a, b, ex.step),
                }
            )
    return out


def disagreements(rows: list[dict], rel: float = 0.005) -> list[dict]:
    """The rows whose showback or series figure is more than ``rel`` away from explain's."""
    return [
        r
        for r in rows
        if abs(r["showback"] - r["explain"]) > rel * abs(r["explain"])
        or abs(r["series"] - r["explain"]) > rel * abs(r["explain"])
    ]
