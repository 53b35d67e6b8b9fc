"""Annotations (deploys, config changes, incident notes) as markers on time charts.

In:  an Altair chart whose x encoding is ``ts:T``, and the page ``Context`` (its ``marks``,
     read once per render from the metadata DB by ``dashboard.context``).
Out: the chart with a dashed rule (and a shaded span for marks with an end) per annotation in
     the window, titled on hover; the chart unchanged when there are none.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

__all__ = ["TS_TIP", "marks_frame", "time_x", "with_annotations"]

# Every time axis and tooltip reads UTC, as the page captions say (Vega would use the browser's zone).
TS_TIP = alt.Tooltip("utcyearmonthdatehoursminutesseconds(ts):T", title="time (UTC)")


def time_x(view: Any = None, title: str | None = "time (UTC)", field: str = "ts") -> alt.X:
    """The x encoding of a time chart: a UTC scale, 24-hour labels (with the date past a day)."""
    long = view is not None and view.span.total_seconds() > 86400
    return alt.X(f"{field}:T", title=title, scale=alt.Scale(type="utc"),
                 axis=alt.Axis(format="%m-%d %H:%M" if long else "%H:%M", labelOverlap=True))


def marks_frame(marks: list[Any]) -> pd.DataFrame:
    return pd.DataFrame([{"ts": m.starts_at, "end": m.ends_at or m.starts_at, "title": m.title,
                          "text": m.text or ""} for m in marks], columns=["ts", "end", "title", "text"])


def with_annotations(chart: alt.Chart, ctx: Any) -> alt.Chart | alt.LayerChart:
    marks = getattr(ctx, "marks", None) or []
    if not marks:
        return chart
    df = marks_frame(marks)
    view = ctx.view  # spans reaching past the window are drawn to its edge (they must not widen the axis)
    df["ts"] = df["ts"].clip(lower=view.start, upper=view.end)
    df["end"] = df["end"].clip(lower=view.start, upper=view.end)
    tooltip = [alt.Tooltip("title:N", title="annotation"), TS_TIP, "text:N"]
    rules = alt.Chart(df).mark_rule(color="#7c3aed", strokeDash=[4, 3], strokeWidth=1.5).encode(
        x=time_x(ctx.view), tooltip=tooltip)
    spans = alt.Chart(df[df["end"] > df["ts"]]).mark_rect(color="#7c3aed", opacity=0.08).encode(
        x=time_x(ctx.view), x2="end:T")
    return alt.layer(chart, spans, rules).resolve_scale(color="independent")
