"""Overview: is the fleet healthy? Replicas up (and the targets that stopped answering), the
alerts firing (as the evaluator left them in ``alerts.store``), requests and tokens per second,
p99 TTFT and ITL with sparklines, KV-cache usage, cost per hour and per 1M tokens, SLO
attainment, and p99 TTFT over time per model.
Renders what ``analytics`` returns; no SQL here."""

from __future__ import annotations

from typing import Any

import altair as alt
import streamlit as st
from sqlalchemy.exc import SQLAlchemyError
from streamlit.delta_generator import DeltaGenerator
from streamlit.errors import StreamlitPageNotFoundError

from alerts.store import load_states
from analytics.cost import cost_per_token
from analytics.health import current, scrape_health, silent_targets
from analytics.requests import request_totals
from analytics.saturation import KV, saturation
from analytics.slo import slo_attainment
from analytics.timeseries import gauge_over_time, histograms
from analytics.vllm import ITL, TTFT
from dashboard.cache import cached, call
from dashboard.context import page_context, plain, shown
from dashboard.format import table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from storage.catalog import gpu_prices, slo_targets


def firing_alerts(sessions: Any) -> tuple[str, str]:
    """The number of alerts firing now (shown, and 0 is a number) and the metric's help."""
    if sessions is None:
        return "–", "no metadata DB configured: alert states live there"
    try:
        states = load_states(sessions)
    except SQLAlchemyError:
        return "–", "the alert tables cannot be read: run `fleetscope migrate`"
    n = sum(inst.state == "firing" for found in states.values() for inst in found.values())
    return f"{n}", "alerts firing now; the Alerts page lists them, the pending ones and the silences"


def link_to_alerts(count: str) -> None:
    if count in ("–", "0"):
        return
    try:  # in the app (dashboard/app.py registers the page); a page run on its own has no navigation
        st.page_link("screens/alerts.py", label="See the firing alerts", icon=":material/notifications_active:")
    except StreamlitPageNotFoundError:
        st.caption("See them on the Alerts page.")


ctx = page_context("Overview")
v, client = ctx.view, ctx.client
alerts_firing, alerts_help = firing_alerts(ctx.sessions)
seconds = v.span.total_seconds()
prices = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
# what the page shows, read at once: p99 TTFT and ITL per step by model (the chart below), for the
# fleet (the sparklines) and over the window from one histogram query
got = ctx.fetch(
    health=call(scrape_health, v.start, v.end),
    sat=call(saturation, v.start, v.end, "replica", filters=v.filters),
    hist=call(histograms, (TTFT, ITL), (0.99,), v.start, v.end, "model", filters=v.filters, total=True),
    by_source=call(request_totals, v.start, v.end, by=["source"], source=None, filters=v.filters),
    kv=call(gauge_over_time, KV, v.start, v.end, "fleet", filters=v.filters),
    cost=call(cost_per_token, v.start, v.end, prices, filters=v.filters),
)
health = got["health"]
for why in silent_targets(health)["why"] if len(health) else []:
    st.error(why)
sat = got["sat"]
if sat.empty:
    st.info(
        f"No engine metrics between {v.start:%H:%M} and {v.end:%H:%M} UTC: no replica was scraped in this window "
        "(is `fleetscope collect` running, and are the targets up?). Try a longer time range."
    )
    st.columns(4)[0].metric("Firing alerts", alerts_firing, help=alerts_help)
    link_to_alerts(alerts_firing)
    st.stop()
hist = got["hist"]
ttft_steps, ttft_window = hist[TTFT].steps, hist[TTFT].window
itl_steps = hist[ITL].steps[hist[ITL].steps["model"] == "(fleet)"]
ttft = ttft_window[ttft_window["model"] == "(fleet)"].rename(columns={"value": "quantile"})
itl = hist[ITL].window[hist[ITL].window["model"] == "(fleet)"].rename(columns={"value": "quantile"})
by_source = got["by_source"]
by_source = by_source.set_index("source") if "source" in by_source else by_source
# the gateway logs every request it routes; engine spans are the fallback (not both: the same requests)
requests = (
    by_source.loc[["gateway"]]
    if "gateway" in by_source.index
    else by_source.loc[[s for s in by_source.index if s == "otlp"]]
)
ttft_line = ttft_steps.loc[ttft_steps["model"] == "(fleet)", "value"].dropna().round(4).tolist()
itl_line = itl_steps["value"].dropna().round(5).tolist()
kv_line = got["kv"]["avg"].dropna().round(3).tolist()
cols: list[DeltaGenerator] = list(st.columns(5))  # a row of five, then one of four
down = int((~current(health)["up"]).sum()) if len(health) else 0  # a replica a scale-in removed is not down
cols[0].metric(
    "Replicas reporting",
    f"{len(sat)}",
    help="replicas with engine metrics in the window" + (f"; {down} scrape target(s) failing now" if down else ""),
)
with cols[1]:
    st.metric("Firing alerts", alerts_firing, help=alerts_help)
    link_to_alerts(alerts_firing)
cols[2].metric(
    "Requests/s",
    f"{float(requests['requests'].sum()) / seconds:.2f}" if len(requests) else "–",
    help="From the request log (weighted rows)",
)
cols[3].metric(
    "p99 TTFT",
    shown(ttft["quantile"].iloc[0], "{:.3f} s") if len(ttft) else "–",
    chart_data=ttft_line or None,
    chart_type="line",
    help="over the window (widened to whole steps of the line); the line: per step",
)
cols[4].metric(
    "p99 ITL",
    shown(itl["quantile"].iloc[0], "{:.1f} ms", 1000) if len(itl) else "–",
    chart_data=itl_line or None,
    chart_type="line",
)
cols = list(st.columns(4))
cols[0].metric(
    "KV cache used (avg)", shown(sat["kv_avg"].mean(), "{:.0%}"), chart_data=kv_line or None, chart_type="area"
)
cols[1].metric("KV cache peak", shown(sat["kv_max"].max(), "{:.0%}"))
try:
    cost = got["cost"].set_index("model").loc["(fleet)"]
    tokens_per_s = (cost["prompt_tokens"] + cost["completion_tokens"]) / seconds
    cols[2].metric("Tokens/s", f"{tokens_per_s:,.0f}")
    cols[3].metric(
        "Cost per hour",
        shown(cost["spend"], "${:,.2f}", 3600 / seconds),
        help=f"{shown(cost['cost_per_million_tokens'], '${:.2f}')} per 1M tokens; "
        f"{shown(cost['idle_share'], '{:.0%}')} of it idle",
    )
except KeyError as exc:
    cols[3].metric("Cost per hour", "–", help=str(exc).strip("'\""))
series = ttft_steps[ttft_steps["model"] != "(fleet)"]
if len(series):
    st.subheader("p99 TTFT by model")
    chart = (
        alt.Chart(plain(with_gaps(series.dropna(subset=["value"]), ttft_steps.attrs.get("step"), "model")))
        .mark_line(**LINE)
        .encode(
            x=time_x(v),
            y=alt.Y("value:Q", title="p99 TTFT (s)"),
            color=alt.Color("model:N"),
            tooltip=[TS_TIP, "model:N", alt.Tooltip("value:Q", format=".3f")],
        )
    )
    st.altair_chart(with_annotations(chart, ctx), width="stretch")
targets = slo_targets(ctx.sessions) if ctx.sessions is not None else []
if targets:
    st.subheader("SLOs")
    att = cached(slo_attainment, client, tuple(targets), v.start, v.end, filters=v.filters)
    for col, row in zip(st.columns(min(len(att), 4)), att.head(4).itertuples(), strict=False):
        col.metric(
            row.label,
            f"{row.attainment:.2%}" if row.requests else "–",
            delta=("met" if row.met else "missed") if row.requests else None,
            delta_color="normal" if row.met else "inverse",
            help=f"objective {row.objective:.2%}",
        )
st.subheader("Replicas")
st.dataframe(table(sat.drop(columns=["replicas"])), hide_index=True, width="stretch")
