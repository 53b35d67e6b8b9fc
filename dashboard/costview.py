"""Cost on the pages: Investigate's cost explanation, and the cost series with its breaks.

In:  the page ``Context`` (view, client, metadata sessions, settings) and what ``analytics``
     returns: ``analytics.explain.explain_cost`` and ``analytics.cost_series``.
Out: Streamlit elements: the sentence and the figures, the series with its break, the waterfall
     (before -> each driver -> after, in USD per 1M tokens), the tokens of each tenant by pool
     before and after, the evidence and the routing decisions (Investigate, ``metric=cost``);
     the series by fleet, model or tenant with each line's rise marked and linked to
     Investigate (the Cost page). No SQL here.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import streamlit as st

from analytics.cost_series import cost_breaks, cost_over_time
from analytics.explain import CostExplanation, explain_cost
from dashboard.cache import cached
from dashboard.context import Context, plain
from dashboard.format import table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from storage.catalog import gpu_prices

__all__ = ["cached_tokens_note", "investigate_link", "render_cost_investigation", "render_cost_series"]

KIND_WORDS = {"traffic": "own traffic", "volume": "volume", "spend": "spend"}


def _prices(ctx: Context) -> dict[str, float]:
    return gpu_prices(ctx.sessions) if ctx.sessions is not None else {}


def _weights(ctx: Context) -> Any:
    return ctx.settings.cost.weights() if ctx.settings is not None else None


def cached_tokens_note(fleet: pd.Series, tenants: pd.DataFrame) -> str | None:
    """Where the showback's cached prompt tokens (each response's usage, the request log) and the
    engines' (their prefix-cache hits, the By model table) part, which one each table uses and why;
    None where they agree (within 5 %) or nothing was cached."""
    engines, logged = float(fleet["cached_tokens"]), float(tenants["cached_tokens"].sum())
    if engines <= 0 or abs(logged - engines) <= 0.05 * engines:
        return None
    if logged <= 0.01 * engines:
        return (
            f"Cached prompt tokens: the engines counted {engines:,.0f} prefix-cache hits (By model), the request log "
            "none: these engines do not report `usage.prompt_tokens_details.cached_tokens` per response (vLLM "
            "fills it when started with `--enable-prompt-tokens-details`), so the showback prices every tenant's "
            "prompt tokens as computed ones."
        )
    return (
        f"Cached prompt tokens: the showback counts what each response reported ({logged:,.0f}), By model the "
        f"engines' prefix-cache hits ({engines:,.0f}); they part where the request log is sampled or requests "
        "straddle the window's edges."
    )


def investigate_link(start: datetime, end: datetime, **view: str) -> str:
    """The Investigate page on cost around ``[start, end)`` for one view (tenant, model or route)."""
    query = {"metric": "cost", "from": f"{start:%Y-%m-%dT%H:%M:%SZ}", "to": f"{end:%Y-%m-%dT%H:%M:%SZ}"}
    query.update({k: v for k, v in view.items() if v})
    return f"/investigate?{urlencode(query)}"


def waterfall(ex: CostExplanation) -> pd.DataFrame:
    """Bars from before to after: the before level, each driver's step (largest first), the after level."""
    rows = [{"label": "before", "start": 0.0, "end": ex.before, "kind": "level"}]
    level = ex.before
    for r in ex.evidence.to_dict(orient="records"):
        step = float(r["usd_per_million"])
        label = f"{KIND_WORDS[str(r['kind'])]}: {r['pool']}" if r["pool"] else KIND_WORDS[str(r["kind"])]
        rows.append({"label": label, "start": level, "end": level + step, "kind": "up" if step >= 0 else "down"})
        level += step
    rows.append({"label": "after", "start": 0.0, "end": ex.after, "kind": "level"})
    out = pd.DataFrame(rows)
    out["order"] = range(len(out))
    return out


def render_cost_investigation(ctx: Context, start: datetime) -> None:
    v, client = ctx.view, ctx.client
    try:
        ex = cached(explain_cost, client, start, v.end, _prices(ctx), filters=v.filters, weights=_weights(ctx))
    except KeyError as exc:
        st.error(f"{exc.args[0]}. GPU prices: `fleetscope prices list`.")
        return
    except ValueError as exc:
        st.info(f"{exc}. Pick one tenant, model or route in the sidebar, or none for the fleet.")
        return
    if ex.series.empty:
        st.info(f"Nothing was spent or served between {start:%H:%M} and {v.end:%H:%M} UTC for {ex.view}.")
        return
    for problem in ex.problems:
        st.warning(problem)
    if ex.break_at is None:
        st.info(ex.sentence + " Widen the time range to include the rise and some time before it.")
    else:
        st.success(ex.sentence)
        _figures(ex, ex.break_at)
    st.subheader(f"Cost per 1M tokens of {ex.view}")
    st.altair_chart(with_annotations(_series_chart(ctx, ex), ctx), width="stretch")
    if ex.break_at is None:
        return
    left, right = st.columns(2)
    with left:
        st.subheader("Where the change comes from")
        st.caption("Before, each driver's part (an exact shift-share: they add up), after; USD per 1M tokens.")
        st.altair_chart(_waterfall_chart(ex), width="stretch")
    with right:
        st.subheader("Tokens by pool, before and after")
        if ex.flows.empty:
            st.caption("No request log in this window: the pools' tokens come from the engines, tenants are unknown.")
        else:
            st.altair_chart(_flows_chart(ex), width="stretch")
    _evidence(ex)


def _figures(ex: CostExplanation, break_at: datetime) -> None:
    """Before, after, the break and the change, side by side."""
    cols = st.columns(4)
    cols[0].metric("Before", f"${ex.before:,.4g} / 1M")
    cols[1].metric("After", f"${ex.after:,.4g} / 1M", delta=f"{ex.after / ex.before - 1:+.0%}", delta_color="inverse")
    cols[2].metric("Break", f"{break_at:%H:%M:%S} UTC", help=f"±{ex.step}s; tokens from the {ex.source}")
    cols[3].metric("Change", f"{ex.after - ex.before:+,.4g} $/1M", help="after - before: the waterfall's sum")


def _series_chart(ctx: Context, ex: CostExplanation) -> alt.Chart | alt.LayerChart:
    """Cost per 1M tokens per step, with the break and the end of the rise ruled where there is one."""
    v = ctx.view
    series = plain(with_gaps(ex.series.dropna(subset=["value"]), ex.step))
    chart: alt.Chart | alt.LayerChart = (
        alt.Chart(series)
        .mark_line(point=True, **LINE)
        .encode(
            x=time_x(v, None),
            y=alt.Y("value:Q", title="USD per 1M tokens"),
            tooltip=[
                TS_TIP,
                alt.Tooltip("value:Q", format=",.4g", title="$/1M"),
                alt.Tooltip("tokens:Q", format=",.0f"),
                alt.Tooltip("spend:Q", format=",.4f", title="spend ($)"),
            ],
        )
        .properties(height=220)
    )
    if ex.break_at is not None and ex.periods is not None:
        moments = pd.DataFrame([{"ts": ex.break_at, "what": "break"}, {"ts": ex.periods[2], "what": "end of the rise"}])
        chart = alt.layer(
            chart,
            alt.Chart(moments)
            .mark_rule(strokeWidth=2)
            .encode(
                x=time_x(v),
                color=alt.Color("what:N", title="", scale=alt.Scale(range=["#dc2626", "#6b7280"])),
                tooltip=["what:N", TS_TIP],
            ),
        ).resolve_scale(color="independent")
    return chart


def _waterfall_chart(ex: CostExplanation) -> alt.Chart:
    chart: alt.Chart = (  # altair types its mark_* methods as returning Any
        alt.Chart(waterfall(ex))
        .mark_bar()
        .encode(
            x=alt.X("label:N", sort=alt.EncodingSortField("order"), title=None, axis=alt.Axis(labelAngle=-30)),
            y=alt.Y("start:Q", title="USD per 1M tokens"),
            y2="end:Q",
            color=alt.Color(
                "kind:N",
                title="",
                scale=alt.Scale(domain=["level", "up", "down"], range=["#6b7280", "#dc2626", "#16a34a"]),
            ),
            tooltip=["label:N", alt.Tooltip("start:Q", format=",.4g"), alt.Tooltip("end:Q", format=",.4g")],
        )
    )
    return chart


def _flows_chart(ex: CostExplanation) -> alt.Chart:
    """Each tenant's tokens by pool, before and after."""
    flows = ex.flows.melt(
        id_vars=["tenant", "pool"], value_vars=["share_before", "share_after"], var_name="period", value_name="share"
    )
    flows["period"] = flows["period"].str.removeprefix("share_")
    chart: alt.Chart = (  # altair types its mark_* methods as returning Any
        alt.Chart(flows)
        .mark_bar()
        .encode(
            y=alt.Y("tenant:N", title=None),
            x=alt.X("share:Q", title="share of the tenant's tokens", axis=alt.Axis(format="%"), stack="normalize"),
            color=alt.Color("pool:N"),
            row=alt.Row("period:N", title=None, sort=["before", "after"]),
            tooltip=["tenant:N", "pool:N", "period:N", alt.Tooltip("share:Q", format=".0%")],
        )
    )
    return chart


def _evidence(ex: CostExplanation) -> None:
    """The drivers' figures, the requests that changed pool and the routing decisions."""
    st.subheader("Evidence")
    st.dataframe(
        table(ex.evidence, {"share": "Share of the change"}),
        hide_index=True,
        width="stretch",
    )
    if len(ex.movers):
        st.subheader("Requests that changed pool")
        st.dataframe(table(ex.movers), hide_index=True, width="stretch")
    if len(ex.routes):
        with st.expander("Routing decisions before and after (the gateway's log)"):
            st.dataframe(table(ex.routes, {"model": "Pool"}), hide_index=True, width="stretch")


def render_cost_series(ctx: Context) -> None:
    """The Cost page's series: cost per 1M tokens per step by fleet, model or tenant, each line's
    rise marked, with a link that explains it."""
    v, client = ctx.view, ctx.client
    by = st.radio("Cost per 1M tokens by", ["fleet", "model", "tenant"], horizontal=True, key="cost_by")
    series = cached(
        cost_over_time, client, v.start, v.end, _prices(ctx), by=by, weights=_weights(ctx), filters=v.filters
    )
    if series.empty or series["cost_per_million_tokens"].isna().all():
        st.caption("No tokens served in this window: no cost per token to draw.")
        return
    step = int(series.attrs["step"])
    drawn = plain(with_gaps(series.dropna(subset=["cost_per_million_tokens"]), step, by))
    chart: alt.Chart | alt.LayerChart = (
        alt.Chart(drawn)
        .mark_line(**LINE)
        .encode(
            x=time_x(v),
            y=alt.Y("cost_per_million_tokens:Q", title="USD per 1M tokens"),
            color=alt.Color(f"{by}:N", title=by),
            tooltip=[
                TS_TIP,
                f"{by}:N",
                alt.Tooltip("cost_per_million_tokens:Q", format=",.4g", title="$/1M"),
                alt.Tooltip("tokens:Q", format=",.0f"),
                alt.Tooltip("spend:Q", format=",.4f"),
            ],
        )
    )
    found = cost_breaks(series, by)
    if len(found):
        marks = found.assign(what=found[by].astype(str) + " rises")
        chart = cast(  # alt.layer of charts is a LayerChart; altair types it LayerChart | FacetChart
            alt.LayerChart,
            alt.layer(
                chart,
                alt.Chart(plain(marks))
                .mark_rule(strokeDash=[6, 3], strokeWidth=2, color="#dc2626")
                .encode(
                    x=time_x(v, field="break_at"),
                    tooltip=["what:N", alt.Tooltip("before:Q", format=",.4g"), alt.Tooltip("after:Q", format=",.4g")],
                ),
            ),
        )
    st.altair_chart(with_annotations(chart, ctx), width="stretch")
    st.caption(
        f"Spend of the replicas up in each {step:g}s step over the tokens served in it"
        + ("; tenants share each pool's spend by their weighted tokens, step by step" if by == "tenant" else "")
        + f". Tokens from the {series.attrs.get('source', 'engines')}."
    )
    for r in found.to_dict(orient="records"):
        view = {} if by == "fleet" else {by: str(r[by])}
        who = "the fleet" if by == "fleet" else f"{by} {r[by]}"
        link = investigate_link(pd.Timestamp(r["break_at"]) - timedelta(minutes=30), v.end, **view)
        st.markdown(
            f"Cost per 1M tokens of **{who}** rose from ${r['before']:,.4g} to ${r['after']:,.4g} at "
            f"{pd.Timestamp(r['break_at']):%H:%M} UTC: [explain it]({link})"
        )
