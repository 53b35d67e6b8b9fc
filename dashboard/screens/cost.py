"""Cost: spend by model and replica with its idle share, cost per 1M tokens (and per input /
cached / output token) over the window and over time (by fleet, model or tenant, each rise marked
and linked to Investigate), tenant showback (CSV download), spend per LoRA adapter, and the same tokens at hosted-API
prices. Renders what ``analytics`` returns; no SQL here."""

from __future__ import annotations

import altair as alt
import streamlit as st

from analytics.cost import compare_reference, cost_views
from analytics.cost_series import cost_over_time
from analytics.gateways import gaps
from analytics.requests import log_source
from dashboard.cache import call
from dashboard.context import page_context, plain, shown
from dashboard.costview import cached_tokens_note, render_cost_series
from dashboard.format import table
from storage.catalog import gpu_prices

MAX_BARS = 30
SPEND_KINDS = {"busy_spend": "busy (requests running)", "idle_spend": "idle (up, nothing running)"}

ctx = page_context("Cost")
v = ctx.view
prices = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
weights = ctx.settings.cost.weights() if ctx.settings is not None else None
# the tables and the series below, read at once (the series by what its radio button last said)
by = st.session_state.get("cost_by", "fleet")
got = ctx.fetch(
    views=call(cost_views, v.start, v.end, prices, weights=weights, filters=v.filters),
    series=call(cost_over_time, v.start, v.end, prices, by=by, weights=weights, filters=v.filters),
    source=call(log_source, v.start, v.end, v.filters),
)
# what the gateway in front does not give of a tenant's cost (vllm-router: no tenant), said in words
tenant_gaps = ctx.fetch(gaps=call(gaps, v.start, v.end, got["source"], ("tenant",)))["gaps"]
try:
    spend, per_model, tenants, adapters = got["views"]
except KeyError as exc:
    st.error(f"{exc.args[0]}. GPU prices: `fleetscope prices list`.")
    st.stop()
if spend.empty:
    st.info(
        f"No replica reported between {v.start:%H:%M} and {v.end:%H:%M} UTC: nothing was spent that fleetscope saw."
    )
    st.stop()
fleet = per_model.set_index("model").loc["(fleet)"]
cols = st.columns(4)
cols[0].metric("Spend", shown(fleet["spend"], "${:,.2f}"))
cols[1].metric(
    "Idle", shown(fleet["idle_share"], "{:.0%}"), help=f"{shown(fleet['idle_spend'], '${:,.2f}')} with nothing running"
)
cols[2].metric(
    "Per 1M tokens",
    shown(fleet["cost_per_million_tokens"], "${:,.2f}"),
    help="– when no tokens were served in the window",
)
cols[3].metric(
    "Per 1M output tokens",
    shown(fleet["output_per_million"], "${:,.2f}"),
    help=f"input {shown(fleet['input_per_million'], '${:,.2f}')}, "
    f"cached {shown(fleet['cached_per_million'], '${:,.2f}')} per 1M",
)
st.subheader("Cost per 1M tokens over time")
render_cost_series(ctx)
st.subheader("Spend by replica")
# the costliest replicas: a bar per replica reads well up to a few dozen (200 took the browser long to lay out)
totals = spend["busy_spend"] + spend["idle_spend"]
many = len(spend) > MAX_BARS
top = spend.loc[totals.nlargest(MAX_BARS).index] if many else spend
if many:
    st.caption(
        f"The {MAX_BARS} of {len(spend)} replicas that cost the most "
        f"({totals[top.index].sum() / totals.sum():.0%} of the spend), costliest first; "
        "pick replicas in the sidebar to see others."
    )
long = top.melt(
    id_vars=["replica", "model"], value_vars=["busy_spend", "idle_spend"], var_name="kind", value_name="usd"
)
long["kind"] = long["kind"].map(SPEND_KINDS)
st.altair_chart(
    alt.Chart(plain(long))
    .mark_bar()
    .encode(
        x=alt.X("usd:Q", title="USD"),
        y=alt.Y("replica:N", sort=list(top["replica"]) if many else "ascending"),
        color=alt.Color("kind:N", title=""),
        tooltip=["replica:N", "model:N", "kind:N", alt.Tooltip("usd:Q", format=",.4f")],
    ),
    width="stretch",
)
st.subheader("By model")
st.dataframe(table(per_model), hide_index=True, width="stretch")
st.subheader("Showback by tenant")
for gap in tenant_gaps:
    st.info(gap + ".")
if tenants.empty:
    st.caption("No request-log rows in this window: tenants cannot be told apart.")
else:
    st.dataframe(table(tenants), hide_index=True, width="stretch")
    # the two counts of cached tokens compare where the showback holds every tenant of the pools shown
    said = None if v.filters.tenant or v.filters.route else cached_tokens_note(fleet, tenants)
    if said:
        st.caption(said)
    st.download_button("Download CSV", tenants.to_csv(index=False), file_name="showback.csv", mime="text/csv")
if len(adapters):
    st.subheader("Spend per LoRA adapter")
    st.caption(
        "An adapter's requests share its base model's pool with the base model's own requests, by weighted tokens "
        "(idle time in proportion), as the tenant showback shares it; Share is of the whole fleet's spend."
    )
    st.dataframe(
        table(adapters[["adapter", "base", "requests", "share", "spend", "cost_per_million_tokens"]]),
        hide_index=True,
        width="stretch",
    )
if ctx.settings is not None:
    st.subheader("Self-hosted vs API list prices")
    st.dataframe(table(compare_reference(fleet, ctx.settings.cost.references())), hide_index=True, width="stretch")
