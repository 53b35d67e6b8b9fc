"""Latency: TTFT / ITL / TPOT / e2e / queue percentiles over time by model or replica, from the
engines' histograms and the request log side by side; a heatmap of the engines' histogram;
SLO attainment and goodput; where replicas decode speculatively, their draft acceptance (over
time, per replica and per draft position) and the decode speed-up it buys.
Renders what ``analytics`` returns; no SQL here."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from analytics.latency import LATENCIES, LEVELS, latency_over_time
from analytics.slo import goodput, slo_attainment
from analytics.specdecode import acceptance, acceptance_over_time, by_position
from dashboard.cache import cached
from dashboard.context import page_context, plain
from dashboard.format import table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from storage.catalog import slo_targets

ctx = page_context("Latency")
v, client = ctx.view, ctx.client
left, right = st.columns(2)
latency = left.selectbox("Latency", list(LATENCIES), format_func=str.upper, key="latency")
by = right.radio("By", ["model", "replica"], horizontal=True, key="by")
df = cached(latency_over_time, client, latency, v.start, v.end, levels=LEVELS, by=by, filters=v.filters)
if df.empty or df["value"].isna().all():
    st.info(f"No {latency.upper()} observations between {v.start:%H:%M} and {v.end:%H:%M} UTC for these filters.")
else:
    for source, frame in df.groupby("source"):
        st.subheader(f"{latency.upper()} percentiles — {source}")
        unapplied = df.attrs.get("unapplied", {}).get(source)
        if unapplied:
            st.caption(f"{source} cannot be filtered by {', '.join(unapplied)}: showing every {', '.join(unapplied)}")
        shown_rows = frame.dropna(subset=["value"]).assign(
            percentile=lambda f: "p" + (f["q"] * 100).round().astype(int).astype(str)
        )
        chart = (
            alt.Chart(plain(with_gaps(shown_rows, df.attrs.get("step"), [by, "percentile"])))
            .mark_line(**LINE)
            .encode(
                x=time_x(v),
                y=alt.Y("value:Q", title=f"{latency.upper()} (s)"),
                color=alt.Color(f"{by}:N"),
                strokeDash=alt.StrokeDash("percentile:N"),
                tooltip=[TS_TIP, f"{by}:N", "percentile:N", alt.Tooltip("value:Q", format=".3f"), "count:Q"],
            )
        )
        st.altair_chart(with_annotations(chart, ctx), width="stretch")
    heat = df.attrs["heatmap"]  # from the same read of the engines' buckets as the percentiles above
    heat = heat[heat["count"] > 0]
    if len(heat):
        st.subheader(f"{latency.upper()} heatmap — engine histograms")
        st.caption("Observations per step and histogram bucket over the fleet; the bucket bounds are the engines' own.")
        heat = heat.assign(
            bucket=heat["high"].map(lambda h: "+Inf" if h == float("inf") else f"≤ {h:g}s"),
            order=heat["high"].rank(method="dense"),
            ts_end=heat["ts"] + pd.Timedelta(seconds=df.attrs["step"]),
        )
        st.altair_chart(
            alt.Chart(plain(heat))
            .mark_rect()
            .encode(
                x=time_x(v),
                x2="ts_end:T",
                y=alt.Y(
                    "bucket:O",
                    title=f"{latency.upper()} bucket",
                    sort=alt.EncodingSortField("order", order="descending"),
                ),
                color=alt.Color("count:Q", title="observations", scale=alt.Scale(type="sqrt", scheme="viridis")),
                tooltip=[TS_TIP, "bucket:O", alt.Tooltip("count:Q", format=",.0f")],
            ),
            width="stretch",
        )
targets = slo_targets(ctx.sessions) if ctx.sessions is not None else []
st.subheader("SLOs")
if not targets:
    st.caption("No SLO targets yet: add one with `fleetscope slo set MODEL ttft 1.0 --objective 0.99`.")
else:
    att = cached(slo_attainment, client, tuple(targets), v.start, v.end, filters=v.filters)
    st.dataframe(
        table(att[["label", "requests", "attainment", "objective", "observed", "met"]]),
        hide_index=True,
        width="stretch",
    )
    good = cached(goodput, client, tuple(targets), v.start, v.end, filters=v.filters)
    st.dataframe(table(good), hide_index=True, width="stretch")

spec = cached(acceptance, client, v.start, v.end, "replica", filters=v.filters)
spec = spec[spec["drafts"] > 0]  # replicas that decoded speculatively in the range
if len(spec):
    st.subheader("Speculative decoding")
    total = spec[["drafts", "draft_tokens", "accepted"]].sum()
    cols = st.columns(3)
    cols[0].metric(
        "Draft acceptance",
        f"{total['accepted'] / total['draft_tokens']:.0%}" if total["draft_tokens"] else "–",
        help="Accepted / proposed draft tokens over the range, every replica that drafts.",
    )
    cols[1].metric(
        "Tokens per decode step",
        f"{1 + total['accepted'] / total['drafts']:.2f}" if total["drafts"] else "–",
        help="1 + accepted / drafts: a step's own token and the drafts accepted with it.",
    )
    output = spec["generation_tokens"].sum()
    cols[2].metric(
        "Decode speed-up (at most)",
        f"{output / (output - total['accepted']):.2f}×" if output > total["accepted"] else "–",
        help="Output tokens / decode steps taken, over the replicas that draft: the steps saved, verification cost "
        "left out.",
    )
    over = cached(acceptance_over_time, client, v.start, v.end, "replica", filters=v.filters)
    over = over.dropna(subset=["acceptance_rate"])
    if len(over):
        st.altair_chart(
            with_annotations(
                alt.Chart(plain(with_gaps(over, over.attrs.get("step"), ["replica"])))
                .mark_line(**LINE)
                .encode(
                    x=time_x(v),
                    y=alt.Y("acceptance_rate:Q", title="draft acceptance", axis=alt.Axis(format="%")),
                    color=alt.Color("replica:N"),
                    tooltip=[
                        TS_TIP,
                        "replica:N",
                        alt.Tooltip("acceptance_rate:Q", format=".0%"),
                        alt.Tooltip("mean_accepted_length:Q", format=".2f"),
                    ],
                ),
                ctx,
            ),
            width="stretch",
        )
    positions = cached(by_position, client, v.start, v.end, "replica", filters=v.filters)
    if len(positions):
        wide = positions.pivot_table(index="replica", columns="position", values="rate").reset_index()
        wide.columns = ["replica", *(f"position_{int(c) + 1}_rate" for c in wide.columns[1:])]
        spec = spec.merge(wide, on="replica", how="left")
    st.caption(
        "A drop in acceptance means each decode step emits fewer tokens: inter-token latency and the cost per "
        "output token rise. Position n: the share of drafts whose n-th token was accepted."
    )
    st.dataframe(table(spec), hide_index=True, width="stretch")
