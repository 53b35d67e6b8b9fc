"""The Capacity page's elasticity section: replicas per pool over time with the autoscaler's
decisions on it, each scale-out's cold start (decided -> healthy -> first token), flapping, and the
spare capacity (headroom) with what it costs per hour.

In:  the page ``Context`` (its client, view, metadata sessions for GPU prices, and marks) and the
     page's step; every number from ``analytics.elasticity`` (``headroom``, which carries the
     replicas up per step; ``scale_events``; ``cold_starts``; ``flapping``), no SQL here.
Out: ``render_elasticity(ctx, step)`` draws the section: a step line of replicas per pool with a
     point per decision at the size it asked for, the cold-start table, a flapping note per pool
     that reversed direction, and the headroom chart and table (replicas, demand at the KV target,
     spare replicas and their USD per hour). Without scale events in the window it says so once
     and still draws replicas and headroom (a fixed fleet has headroom too).
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from analytics.elasticity import cold_starts, flapping, headroom, scale_events
from analytics.errors import NoPrice
from dashboard.cache import call
from dashboard.context import Context, plain
from dashboard.format import NUM, SECONDS, TIME, USD, table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from storage.catalog import gpu_prices

__all__ = ["COLD_START_LABELS", "FLAP_WINDOW_S", "render_elasticity"]

FLAP_WINDOW_S = 900  # reversals counted within any 15 minutes (the ScaleFlapping rule's window: 30 min)
DECISIONS = ("scale_out", "scale_in", "held_at_max", "flap_guard")  # the autoscaler's decisions (not replica steps)
COLD_START_LABELS: dict[str, str | tuple[str, str]] = {
    "pool": "Pool",
    "replica": "Replica",
    "decided_at": ("Decided", TIME),
    "ready_at": ("Healthy", TIME),
    "serving_at": ("First token", TIME),
    "time_to_ready_s": ("Time to ready", SECONDS),
    "time_to_first_token_s": ("Time to first token", SECONDS),
    "scale_out_lag_s": ("Scale-out lag", SECONDS),
}
HEADROOM_LABELS: dict[str, str | tuple[str, str]] = {
    "pool": "Pool",
    "replicas": ("Replicas up (avg)", NUM),
    "demand_replicas": ("Needed at the KV target (avg)", NUM),
    "headroom_replicas": ("Spare replicas (avg)", NUM),
    "headroom_usd_per_hour": ("Spare capacity ($/h, avg)", USD),
}


def render_elasticity(ctx: Context, step: float | None) -> None:
    v = ctx.view
    prices: dict[str, float] | None = gpu_prices(ctx.sessions) if ctx.sessions is not None else None
    step_s = float(step or 60)
    got = ctx.fetch(
        room=call(headroom, v.start, v.end, step_s, prices=prices),
        events=call(scale_events, v.start, v.end, kinds=list(DECISIONS)),
        starts=call(cold_starts, v.start, v.end),
        flaps=call(flapping, v.start, v.end, FLAP_WINDOW_S),
    )
    try:
        room = got["room"]
    except NoPrice as exc:  # the replicas still draw; their spend cannot be priced
        st.caption(f"Headroom not priced: {exc.args[0] if exc.args else exc} (`fleetscope prices`).")
        room = ctx.fetch(room=call(headroom, v.start, v.end, step_s))["room"]
    events, starts, flaps = got["events"], got["starts"], got["flaps"]
    st.subheader("Replicas and scale events")
    if events.empty:
        st.caption("No scale events in this window: no autoscaler decided anything (or none runs).")
    _replicas_chart(ctx, room, events)
    if len(starts):
        _cold_starts(starts)
    for row in flaps[flaps["reversals"] >= 2].itertuples():
        st.warning(
            f"**{row.pool}** reversed direction {row.reversals} times within {FLAP_WINDOW_S // 60} minutes "
            f"(last at {row.last_at:%H:%M:%S} UTC): the autoscaler is flapping; widen its cooldowns or thresholds."
        )
    _headroom(ctx, room)


def _replicas_chart(ctx: Context, room: pd.DataFrame, events: pd.DataFrame) -> None:
    """Replicas up per pool per step (a step line), a point per decision at the size it asked for."""
    v, step = ctx.view, room.attrs.get("step")
    lines = (
        alt.Chart(plain(with_gaps(room[["ts", "pool", "replicas"]], step, "pool")))
        .mark_line(interpolate="step-after", **LINE)
        .encode(
            x=time_x(v),
            y=alt.Y("replicas:Q", title="replicas up (avg per step)"),
            color=alt.Color("pool:N", title="Pool"),
            tooltip=[TS_TIP, "pool:N", alt.Tooltip("replicas:Q", format=".2f")],
        )
    )
    chart: Any = lines
    if len(events):
        points = events.assign(
            decision=events["kind"].str.replace("_", " "), replicas=events["to_replicas"].astype(float)
        )[["ts", "pool", "decision", "replicas", "from_replicas", "signal", "value", "threshold", "detail"]]
        chart = alt.layer(
            lines,
            alt.Chart(plain(points))
            .mark_point(size=90, filled=True)
            .encode(
                x=time_x(v),
                y="replicas:Q",
                color=alt.Color("pool:N"),
                shape=alt.Shape("decision:N", title="Decision"),
                tooltip=[
                    TS_TIP,
                    "pool:N",
                    "decision:N",
                    alt.Tooltip("from_replicas:Q", title="from"),
                    alt.Tooltip("replicas:Q", title="to"),
                    "signal:N",
                    alt.Tooltip("value:Q", format=".3g"),
                    alt.Tooltip("threshold:Q", format=".3g"),
                    "detail:N",
                ],
            ),
        )
    st.altair_chart(with_annotations(chart, ctx), width="stretch")


def _cold_starts(starts: pd.DataFrame) -> None:
    st.markdown("**Cold starts**")
    st.caption(
        "Per scale-out: decided, healthy (in the gateway's pool) and its first token; time to ready and to first "
        "token from the decision, and the scale-out lag from when the signal first crossed its threshold to the "
        "first token (what users waited for). A replica is billed from its first scrape: the cold start is not."
    )
    st.dataframe(table(starts[list(COLD_START_LABELS)], COLD_START_LABELS), hide_index=True, width="stretch")


def _headroom(ctx: Context, room: pd.DataFrame) -> None:
    kv_target = float(room.attrs.get("kv_target", 0.8))
    st.markdown("**Headroom: spare replicas and what they cost**")
    st.caption(
        f"Spare replicas = replicas up - the replicas the pool's KV cache use needs at {kv_target:.0%} of each "
        "(at least 0); their cost per hour is spare replicas x GPUs x the GPU price."
    )
    priced = room["headroom_usd_per_hour"].notna().any()
    y = "headroom_usd_per_hour" if priced else "headroom_replicas"
    title = "spare capacity ($/h)" if priced else "spare replicas"
    st.altair_chart(
        with_annotations(
            alt.Chart(plain(with_gaps(room[["ts", "pool", y]], room.attrs.get("step"), "pool")))
            .mark_line(**LINE)
            .encode(
                x=time_x(ctx.view),
                y=alt.Y(f"{y}:Q", title=title),
                color=alt.Color("pool:N", title="Pool"),
                tooltip=[TS_TIP, "pool:N", alt.Tooltip(f"{y}:Q", format=".3g")],
            ),
            ctx,
        ),
        width="stretch",
    )
    summary: Any = room.groupby("pool", as_index=False)[list(HEADROOM_LABELS)[1:]].mean()
    st.dataframe(table(summary, HEADROOM_LABELS), hide_index=True, width="stretch")
