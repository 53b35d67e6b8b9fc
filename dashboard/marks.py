"""What every time chart shares: the UTC time axis, gaps where a series has no data, and
annotations (deploys, config changes, incident notes) and the autoscaler's scale events as
markers.

In:  a long frame of time series (``ts`` and the columns a chart draws, a row per step and
     series); an Altair chart whose x encoding is ``ts:T``, and the page ``Context`` (its
     ``marks``, read once per render from the metadata DB by ``dashboard.context``).
Out: ``with_gaps``: the frame with a row of empty values wherever a series has no row for more
     than ``GAP_STEPS`` steps (a path mark breaks there, ``LINE``: Vega-Lite's
     "break-paths-show-domains", instead of drawing a straight line across the hole);
     ``with_annotations``: the chart with a dashed rule (and a shaded span for marks with an
     end) per annotation in the window, titled on hover, purple for annotations and teal for
     scale events (a mark tagged ``kind: scale``); unchanged when there are none.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

__all__ = [
    "GAP_STEPS",
    "LINE",
    "MARK_KINDS",
    "TS_TIP",
    "marks_frame",
    "tick_minutes",
    "time_x",
    "with_annotations",
    "with_gaps",
]

GAP_STEPS = 3  # a series silent for more than this many steps draws a gap
LINE: dict[str, Any] = {
    "invalid": "break-paths-show-domains"
}  # path marks break at empty values (Vega-Lite's default, said here)

# Every time axis and tooltip reads UTC, as the page captions say (Vega would use the browser's zone).
TS_TIP = alt.Tooltip("utcyearmonthdatehoursminutesseconds(ts):T", title="time (UTC)")


# minutes between ticks, by the window: about 6-15 ticks, never closer than the labels' minute
TICK_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720)


def tick_minutes(seconds: float) -> int:
    """Minutes between two ticks of a time axis over ``seconds``: the first step that gives at most
    15 ticks (a label reads HH:MM, so ticks under a minute apart printed 07:27 07:27 07:28)."""
    return next((m for m in TICK_MINUTES if seconds / (60 * m) <= 15), TICK_MINUTES[-1])


def time_x(view: Any = None, title: str | None = "time (UTC)", field: str = "ts") -> alt.X:
    """The x encoding of a time chart: a UTC scale, 24-hour labels (with the date past a day),
    ticks at least ``tick_minutes`` apart up to a day."""
    seconds = view.span.total_seconds() if view is not None else None
    long = seconds is not None and seconds > 86400
    axis: dict[str, Any] = {"format": "%m-%d %H:%M" if long else "%H:%M", "labelOverlap": True}
    if seconds is not None and not long:
        # the smallest step between ticks, in the scale's milliseconds: Vega then picks whole minutes. (A
        # tickCount of {"interval": "minute", "step": n} passes Vega-Lite's schema, but the Vega in
        # Streamlit's bundle fails on it on a utc scale and leaves the chart blank: seen in the demo)
        axis["tickMinStep"] = 60_000 * tick_minutes(seconds)
    return alt.X(f"{field}:T", title=title, scale=alt.Scale(type="utc"), axis=alt.Axis(**axis))


def with_gaps(
    df: pd.DataFrame, step: float | None = None, by: str | list[str] | tuple[str, ...] = (), x: str = "ts"
) -> pd.DataFrame:
    """``df`` with empty rows (every numeric value NaN) a step after each point that the next
    point of its series (a group of ``by``) follows by more than ``GAP_STEPS`` steps, and a step
    before that next point (a chart that reads "no rows" as zero fills them with 0). ``step``
    (seconds): the data's step; by default the most common distance between points."""
    if df.empty:
        return df
    keys = [by] if isinstance(by, str) else list(by)
    times = pd.to_datetime(df[x], utc=True)
    if step is None:
        diffs = times.sort_values().drop_duplicates().diff().dropna()
        if diffs.empty:
            return df
        width = diffs.mode().iloc[0]
    else:
        width = pd.Timedelta(seconds=float(step))
    ordered = df.assign(**{x: times}).sort_values([*keys, x], kind="stable")
    following = ordered.groupby(keys, sort=False)[x].shift(-1) if keys else ordered[x].shift(-1)
    hole = (following - ordered[x]) > width * GAP_STEPS
    last = ordered[hole]
    if last.empty:
        return df
    values = [c for c in df.columns if c != x and c not in keys]
    holes = pd.concat(
        [last[[*keys, x]].assign(**{x: last[x] + width}), last[[*keys]].assign(**{x: following[hole] - width})],
        ignore_index=True,
    )
    holes = holes.assign(
        **{c: pd.Series(float("nan"), index=holes.index) for c in values if pd.api.types.is_numeric_dtype(df[c])}
    )
    out = pd.concat([ordered, holes], ignore_index=True).sort_values([*keys, x], kind="stable", ignore_index=True)
    out.attrs = dict(df.attrs)
    return out


MARK_KINDS = {"annotation": "#7c3aed", "scale event": "#0d9488"}  # the rule's colour by what the mark is


def marks_frame(marks: list[Any]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "ts": m.starts_at,
                "end": m.ends_at or m.starts_at,
                "title": m.title,
                "text": m.text or "",
                "kind": "scale event" if (m.tags or {}).get("kind") == "scale" else "annotation",
            }
            for m in marks
        ],
        columns=["ts", "end", "title", "text", "kind"],
    )


def with_annotations(chart: alt.Chart | alt.LayerChart, ctx: Any) -> alt.Chart | alt.LayerChart:
    marks = getattr(ctx, "marks", None) or []
    if not marks:
        return chart
    df = marks_frame(marks)
    view = ctx.view  # spans reaching past the window are drawn to its edge (they must not widen the axis)
    df["ts"] = df["ts"].clip(lower=view.start, upper=view.end)
    df["end"] = df["end"].clip(lower=view.start, upper=view.end)
    tooltip = [alt.Tooltip("title:N", title="mark"), alt.Tooltip("kind:N", title="what"), TS_TIP, "text:N"]
    colour = alt.Color("kind:N", scale=alt.Scale(domain=list(MARK_KINDS), range=list(MARK_KINDS.values())), legend=None)
    rules = (
        alt.Chart(df)
        .mark_rule(strokeDash=[4, 3], strokeWidth=1.5)
        .encode(x=time_x(ctx.view), color=colour, tooltip=tooltip)
    )
    spans = (
        alt.Chart(df[df["end"] > df["ts"]])
        .mark_rect(color="#7c3aed", opacity=0.08)
        .encode(x=time_x(ctx.view), x2="end:T")
    )
    layered: alt.LayerChart = alt.layer(chart, spans, rules).resolve_scale(color="independent")  # typed Any
    return layered
