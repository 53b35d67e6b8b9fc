"""Traffic & drift: prompt and output length distributions now against a reference window, the
model / tenant / context-bucket mix over time, admission at the gateway (its refusals by reason
over time, goodput beside throughput), the drift table (Evidently's tests, scores and flags), and
the gateways in front of the engines (which, what each gives and lacks, their own
figures: per-worker decisions and health for vllm-router, per-team tokens and errors for LiteLLM,
the production-stack router's and llm-d's). Renders what ``analytics`` returns; no SQL here."""

from __future__ import annotations

import altair as alt
import streamlit as st

from analytics.admission import REASONS, admission, over_window
from analytics.drift import drift, length_distribution, reference_window
from analytics.gateways import overview
from analytics.requests import log_source, request_totals
from analytics.timeseries import auto_step
from dashboard.cache import call
from dashboard.context import page_context, plain, shown
from dashboard.format import table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from storage.catalog import slo_targets

SERVED = {"throughput_per_s": "throughput (answered)", "goodput_per_s": "goodput (within the TTFT target)"}
REFERENCES = {"trailing-day": "the 24 hours before", "last-week": "the same hours a week earlier"}

ctx = page_context("Traffic & drift")
v = ctx.view
kind = st.radio("Compare with", list(REFERENCES), format_func=REFERENCES.get, horizontal=True, key="reference")
current = (v.start, v.end)
reference = reference_window(v.start, v.end, kind)
st.caption(
    f"Current {current[0]:%m-%d %H:%M}–{current[1]:%H:%M} UTC against reference "
    f"{reference[0]:%m-%d %H:%M}–{reference[1]:%m-%d %H:%M} UTC, from the request log."
)

step = auto_step(v.start, v.end)
# TTFT targets by model: goodput counts the answers within them
slos = slo_targets(ctx.sessions) if ctx.sessions is not None else []
targets = {t.model: t.threshold_seconds for t in slos if t.metric == "ttft"}
mix_by = st.radio(
    "Mix by",
    ["model", "tenant", "context_bucket"],
    horizontal=True,
    key="mix_by",
    format_func=lambda d: d.replace("_", " "),
)
got = ctx.fetch(  # the page's reads at once
    mix=call(request_totals, v.start, v.end, by=[mix_by], step=step, filters=v.filters),
    prompt_tokens=call(length_distribution, "prompt_tokens", current, reference, filters=v.filters),
    output_tokens=call(length_distribution, "output_tokens", current, reference, filters=v.filters),
    drift=call(drift, current, reference, filters=v.filters),
    source=call(log_source, v.start, v.end, v.filters),
    admission=call(admission, v.start, v.end, targets, by=None, step_s=step, filters=v.filters),
)
gateways = ctx.fetch(gateways=call(overview, v.start, v.end, got["source"]))["gateways"]
for gap in gateways.gaps:  # said where the mix is read, not only in the section below
    st.info(gap + ".")
mix = got["mix"]
if mix.empty:
    st.info(
        f"No request-log rows between {v.start:%H:%M} and {v.end:%H:%M} UTC for these filters: is the gateway "
        "sending its request log, or are the engines exporting `llm_request` spans to the collector?"
    )
    st.stop()
st.subheader(f"Requests per second by {mix_by.replace('_', ' ')}")
rate = mix.assign(per_s=mix["requests"] / mix.attrs.get("step", step))  # older windows read whole rollup buckets
# a step without requests has no row: none were sent, so the area goes down to 0 there
rate = with_gaps(rate, mix.attrs.get("step", step), mix_by).fillna({"per_s": 0.0})
st.altair_chart(
    with_annotations(
        alt.Chart(plain(rate))
        .mark_area()
        .encode(
            x=time_x(v),
            y=alt.Y("per_s:Q", title="requests / s", stack="zero"),
            color=alt.Color(f"{mix_by}:N", title=mix_by.replace("_", " ")),
            tooltip=[TS_TIP, f"{mix_by}:N", alt.Tooltip("per_s:Q", format=".2f", title="requests/s")],
        ),
        ctx,
    ),
    width="stretch",
)


def admission_section() -> None:
    """The gateway's refusals per second by reason over time, goodput (answered within the model's
    TTFT target) beside throughput, and the shed and refused shares over the range."""
    st.subheader("Admission at the gateway")
    over = got["admission"]
    whole = over_window(over)  # the range's figures from the same read
    if whole.empty:
        st.caption("No gateway request log in the range: the gateway's log is where refusals are told.")
        return
    t = whole.iloc[0]
    cols = st.columns(4)
    cols[0].metric(
        "Shed",
        shown(t["shed_share"], "{:.1%}"),
        help="Refused on purpose to hold the admitted requests' latency (429 + Retry-After): past the model's "
        "queue-time budget, or a tenant over its share while the model was busy. Not failures.",
    )
    cols[1].metric(
        "All refusals",
        shown(t["refused_share"], "{:.1%}"),
        help="Shed, and a tenant over its rate or the gateway's fixed limits full, and no replica.",
    )
    cols[2].metric("Throughput", shown(t["throughput_per_s"], "{:.2f}/s"), help="Requests answered whole per second.")
    cols[3].metric(
        "Goodput",
        shown(t["goodput_per_s"], "{:.2f}/s"),
        help="Requests answered within their model's TTFT target per second; – without a target.",
    )
    refused = over.melt(id_vars=["ts"], value_vars=list(REASONS), var_name="reason", value_name="n")
    refused = refused[refused["n"] > 0]
    if refused.empty:
        st.caption(f"The gateway refused nothing between {v.start:%H:%M} and {v.end:%H:%M} UTC.")
    else:
        refused = refused.assign(per_s=refused["n"] / over.attrs["seconds"], reason=refused["reason"].map(REASONS))
        bars = (
            alt.Chart(plain(refused))
            .mark_bar()
            .encode(
                x=time_x(v),
                y=alt.Y("per_s:Q", title="refused / s", stack="zero"),
                color=alt.Color("reason:N", title="refused for", scale=alt.Scale(domain=list(REASONS.values()))),
                tooltip=[TS_TIP, "reason:N", alt.Tooltip("per_s:Q", format=".2f", title="refused/s")],
            )
        )
        st.altair_chart(with_annotations(bars, ctx), width="stretch")
    if not targets:
        st.caption("Goodput needs a TTFT target: `fleetscope slo set MODEL ttft 1.0 --objective 0.99`.")
    served = over.melt(id_vars=["ts"], value_vars=list(SERVED), var_name="what", value_name="per_s")
    served["what"] = served["what"].map(SERVED)
    lines = (
        alt.Chart(plain(with_gaps(served.dropna(subset=["per_s"]), over.attrs["seconds"], "what")))
        .mark_line(**LINE)
        .encode(
            x=time_x(v),
            y=alt.Y("per_s:Q", title="requests / s"),
            color=alt.Color("what:N", title=None),
            tooltip=[TS_TIP, "what:N", alt.Tooltip("per_s:Q", format=".2f", title="requests/s")],
        )
    )
    st.altair_chart(with_annotations(lines, ctx), width="stretch")


admission_section()

left, right = st.columns(2)
for column, feature, label in ((left, "prompt_tokens", "Prompt length"), (right, "output_tokens", "Output length")):
    dist = got[feature]
    with column:
        st.subheader(f"{label}: now vs reference")
        if dist.empty or dist[dist["window"] == "reference"]["requests"].sum() == 0:
            st.caption("The reference window holds no request-log rows: nothing to compare with yet.")
        if len(dist):
            st.altair_chart(
                alt.Chart(plain(dist))
                .mark_bar(opacity=0.55)
                .encode(
                    x=alt.X("low:Q", title=f"{label.lower()} (tokens, log scale)", scale=alt.Scale(type="log")),
                    x2="high:Q",
                    y=alt.Y("share:Q", title="share of requests", axis=alt.Axis(format="%"), stack=None),
                    color=alt.Color("window:N", sort=["reference", "current"]),
                    tooltip=[
                        "window:N",
                        alt.Tooltip("low:Q", format=",.0f"),
                        alt.Tooltip("high:Q", format=",.0f"),
                        alt.Tooltip("share:Q", format=".1%"),
                    ],
                ),
                width="stretch",
            )

st.subheader("Drift")
try:
    features = got["drift"]
except ValueError as exc:
    st.caption(f"No drift test: {exc}.")
else:
    share = features.attrs.get("share_drifted", 0.0)
    verdict = "the traffic has drifted" if features.attrs.get("dataset_drift") else "no dataset drift"
    st.metric(
        "Features drifted",
        f"{int(features['drifted'].sum())} of {len(features)}",
        help=f"{share:.0%}: {verdict} (Evidently's rule: half the features or more)",
    )
    st.dataframe(
        table(features),
        hide_index=True,
        width="stretch",
        column_config={
            "Score": st.column_config.Column(help="distance (drift at >= threshold) or p-value (drift below it)"),
            "Drifted": st.column_config.CheckboxColumn("Drifted"),
        },
    )

st.subheader("Gateways")
if gateways.seen.empty:
    st.caption(
        f"No gateway seen between {v.start:%H:%M} and {v.end:%H:%M} UTC: no gateway request log and no gateway's "
        "or router's own metrics (docs/gateways.md: LiteLLM, vllm-router, Envoy, the production-stack router, llm-d)."
    )
else:
    st.dataframe(
        table(gateways.seen.assign(gives=gateways.seen["gateway"].map(gateways.gives))),
        hide_index=True,
        width="stretch",
        column_config={
            "Requests logged": st.column_config.Column(help="requests its request log (or spans) told of"),
            "Families": st.column_config.Column(help="its own metric families scraped"),
        },
    )
    for kind, figures in gateways.figures.items():
        st.markdown(f"**{kind}**, per {figures.attrs.get('by', 'row')}")
        st.dataframe(table(figures), hide_index=True, width="stretch")
