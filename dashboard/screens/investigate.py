"""Investigate: pick a latency, a percentile and the window (or arrive from an alert with them in
the link) and get the explanation: where the tail broke, the evidence ranked, the driver charts
aligned on one time axis with the change point marked, and the BubbleUp comparison of the slow
requests against the baseline. With ``metric=cost``, the cost per 1M tokens explained instead
(``dashboard.costview``). Renders what ``analytics`` returns; no SQL here."""

from __future__ import annotations

from datetime import timedelta

import altair as alt
import pandas as pd
import streamlit as st

from analytics.explain import Explanation, cost_around, explain, quantile_series
from analytics.latency import LATENCIES
from analytics.requests import request_totals
from dashboard.cache import cached
from dashboard.context import page_context, plain
from dashboard.costview import render_cost_investigation
from dashboard.format import table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from storage.catalog import gpu_prices

PERCENTILES = [0.5, 0.9, 0.95, 0.99]
MAX_SPAN = timedelta(hours=24)
DIMENSION_OF = {
    "tenant mix": "tenant",
    "route decisions": "route",
    "model mix": "model",
    "context length": "context_bucket",
    "long-context share": "context_bucket",
}  # explain's mix signals -> the request-log dimension

ctx = page_context("Investigate")
v, client = ctx.view, ctx.client
asked = st.query_params.get("metric", "ttft")
left, right = st.columns(2)
METRICS = [*LATENCIES, "cost"]
latency = left.selectbox(
    "Explain",
    METRICS,
    index=METRICS.index(asked) if asked in METRICS else 0,
    format_func=lambda m: "cost per 1M tokens" if m == "cost" else m.upper(),
    key="inv_latency",
)
if latency == "cost":
    st.query_params.update(metric="cost")
    cost_start = v.start if v.span <= MAX_SPAN else v.end - MAX_SPAN
    render_cost_investigation(ctx, cost_start)
    st.stop()
asked_q = st.query_params.get("q", "0.99")
q = right.selectbox(
    "Percentile",
    PERCENTILES,
    format_func=lambda p: f"p{p * 100:g}",
    key="inv_q",
    index=PERCENTILES.index(float(asked_q)) if asked_q in {str(p) for p in PERCENTILES} else 3,
)
st.query_params.update(metric=latency, q=str(q))
start = v.start
if v.span > MAX_SPAN:  # explain is for an incident; over weeks its steps are hours wide and it reads every request
    start = v.end - MAX_SPAN
    st.caption(
        f"Investigate reads at most {MAX_SPAN.total_seconds() / 3600:g} hours: the last ones of the range, "
        f"{start:%m-%d %H:%M}–{v.end:%m-%d %H:%M} UTC. To look elsewhere, pick a custom window around the incident."
    )
head = cached(quantile_series, client, start, v.end, latency=latency, q=q, filters=v.filters)
if not len(head.series):
    st.info(
        f"No {latency.upper()} observations between {v.start:%H:%M} and {v.end:%H:%M} UTC for these filters: "
        "nothing to investigate. Try a longer time range."
    )
    st.stop()


def series_chart(ex: Explanation) -> alt.Chart:
    chart: alt.Chart = (  # altair types its mark_* methods as returning Any
        alt.Chart(plain(with_gaps(ex.series.dropna(subset=["value"]))))
        .mark_line(point=True, **LINE)
        .encode(
            x=time_x(v, None),
            y=alt.Y("value:Q", title=f"{ex.metric} (s)"),
            tooltip=[TS_TIP, alt.Tooltip("value:Q", format=".3f"), "n:Q"],
        )
        .properties(height=200)
    )
    return chart


def evidence_table(ex: Explanation) -> None:
    """The evidence rows, score as a bar (where the page draws now)."""
    st.dataframe(
        table(ex.evidence.drop(columns=["resolution_s"], errors="ignore"), {"lead_s": "Lead"}),
        hide_index=True,
        width="stretch",
        column_config={
            "Score": st.column_config.ProgressColumn("Score", min_value=0.0, max_value=1.0, format="%.2f"),
            "Lead": st.column_config.Column(help="how long before the break the signal moved"),
        },
    )


# the quantile first (one cheap query), the explanation above it once worked out
summary = st.container()
drawn = st.empty()
drawn.altair_chart(series_chart(head), width="stretch")
ex = cached(explain, client, start, v.end, latency=latency, q=q, filters=v.filters)
if ex.break_at is None:
    if len(ex.evidence):  # no rise because the gateway shed: what held it
        with summary:
            st.warning(ex.sentence)
            evidence_table(ex)
    else:
        summary.info(ex.sentence + " Widen the time range to include the regression and some normal traffic before it.")
    st.stop()

with summary:
    st.success(ex.sentence)
    cols = st.columns(4)
    cols[0].metric(f"{ex.metric} before", f"{ex.before:.3f} s")
    cols[1].metric(
        f"{ex.metric} after", f"{ex.after:.3f} s", delta=f"{ex.after / ex.before:.1f}×", delta_color="inverse"
    )
    cols[2].metric("Break", f"{ex.break_at:%H:%M:%S} UTC", help=f"±{ex.step}s; read from the {ex.source}")
    cols[3].metric(
        "Onset",
        f"{ex.onset:%H:%M:%S} UTC" if ex.onset else "–",
        help="when the leading evidence moved (at or before the break)",
    )
    st.subheader("Evidence")
    evidence_table(ex)
    st.subheader("Aligned on the break")

moments = pd.DataFrame(
    [{"ts": ex.break_at, "what": "latency break"}]
    + ([{"ts": ex.onset, "what": "onset"}] if ex.onset and ex.onset < ex.break_at else [])
)
rules = (
    alt.Chart(moments)
    .mark_rule(strokeWidth=2)
    .encode(
        x=time_x(v),
        color=alt.Color("what:N", title="", scale=alt.Scale(range=["#dc2626", "#f59e0b"])),
        tooltip=["what:N", TS_TIP],
    )
)


def aligned(chart: alt.Chart, height: int = 160) -> alt.LayerChart:
    layered: alt.LayerChart = alt.layer(with_annotations(chart.properties(height=height), ctx), rules).resolve_scale(
        color="independent"
    )  # resolve_scale of alt.layer's union is typed Any
    return layered


drawn.altair_chart(aligned(series_chart(ex), 200), width="stretch")
cap = ex.capacity.reset_index()  # the fleet's capacity signals the evidence above was judged on
if len(cap):
    kv = cap.melt(id_vars=["ts"], value_vars=["kv_avg", "kv_peak"], var_name="of", value_name="used")
    kv["of"] = kv["of"].map({"kv_avg": "engines' average", "kv_peak": "fullest engine"})
    st.altair_chart(
        aligned(
            alt.Chart(plain(with_gaps(kv.dropna(subset=["used"]), ex.step, "of")))
            .mark_line(**LINE)
            .encode(
                x=time_x(v, None),
                y=alt.Y("used:Q", title="KV used", axis=alt.Axis(format="%")),
                color=alt.Color("of:N", title=""),
                tooltip=[TS_TIP, "of:N", alt.Tooltip("used:Q", format=".0%")],
            )
        ),
        width="stretch",
    )
    st.altair_chart(
        aligned(
            alt.Chart(plain(with_gaps(cap.dropna(subset=["waiting"]), ex.step)))
            .mark_line(**LINE)
            .encode(
                x=time_x(v, None),
                y=alt.Y("waiting:Q", title="requests waiting (fleet)"),
                tooltip=[TS_TIP, alt.Tooltip("waiting:Q", format=".1f")],
            )
        ),
        width="stretch",
    )
top_mix = (
    next((DIMENSION_OF[s] for s in ex.evidence["signal"] if s in DIMENSION_OF), "tenant")
    if len(ex.evidence)
    else "tenant"
)
if ex.source == "request log":
    mix = cached(
        request_totals, client, start, v.end, by=[top_mix], step=ex.request_step, source=None, filters=v.filters
    )
    if len(mix):
        mix = mix.assign(share=mix["requests"] / mix.groupby("ts")["requests"].transform("sum"))
        mix = with_gaps(mix, ex.request_step, top_mix)
        st.altair_chart(
            aligned(
                alt.Chart(plain(mix))
                .mark_area(**LINE)
                .encode(
                    x=time_x(v),
                    y=alt.Y(
                        "share:Q",
                        title=f"{top_mix.replace('_', ' ')} share",
                        axis=alt.Axis(format="%"),
                        stack="normalize",
                    ),
                    color=alt.Color(f"{top_mix}:N"),
                    tooltip=[TS_TIP, f"{top_mix}:N", alt.Tooltip("share:Q", format=".0%")],
                )
            ),
            width="stretch",
        )

if len(ex.dimensions):
    st.subheader("Slow requests against the baseline")
    st.caption(
        "Each value's share of the requests slower than the baseline's "
        f"p{q * 100:g} after the break, against its share of baseline requests (BubbleUp)."
    )
    dims = sorted(ex.dimensions["dimension"].unique())
    # long-context share: the split at explain's own "long" cut says more than the stored context buckets
    first = "long" if len(ex.evidence) and ex.evidence["signal"].iloc[:2].eq("long-context share").any() else top_mix
    dim = st.selectbox("Dimension", dims, key="inv_dim", index=dims.index(first) if first in dims else 0)
    part = ex.dimensions[ex.dimensions["dimension"] == dim]
    pairs = part.melt(
        id_vars=["value"], value_vars=["baseline_share", "slow_share"], var_name="group", value_name="share"
    )
    pairs["group"] = pairs["group"].map({"baseline_share": "baseline", "slow_share": "slow after the break"})
    st.altair_chart(
        alt.Chart(plain(pairs))
        .mark_bar()
        .encode(
            y=alt.Y("value:N", title=dim.replace("_", " ")),
            x=alt.X("share:Q", axis=alt.Axis(format="%"), title="share"),
            yOffset="group:N",
            color=alt.Color("group:N", title=""),
            tooltip=["value:N", "group:N", alt.Tooltip("share:Q", format=".1%")],
        ),
        width="stretch",
    )
if len(ex.strata):
    st.subheader("By prompt length")
    st.dataframe(
        table(ex.strata, {"q_before": f"{ex.metric} before", "q_after": f"{ex.metric} after"}),
        hide_index=True,
        width="stretch",
    )
st.subheader("Cost before and after")
# on request: the spend of both periods is four more queries, and the page answers "why" first
if st.toggle("Compare the cost of the baseline and of the regression", key="inv_cost"):
    prices = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
    try:
        cost = cached(cost_around, client, ex.periods, prices, filters=v.filters)
    except KeyError as exc:  # a replica on a GPU type without a price
        st.caption(f"No cost: {exc.args[0]}. GPU prices: `fleetscope prices list`.")
    else:
        st.dataframe(table(cost), hide_index=True, width="stretch")
