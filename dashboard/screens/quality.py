"""Quality: the answers the gateway scored (a sample of them), over the window and over time. The
truncation, refusal and empty-answer rates over time, broken down by model (an adapter is its own
model), tenant, route or route reason, each lasting rise marked where ``analytics.explain.quality``
finds it and said in its sentence ("consistent with ..."); the rates per group over the window
with the share of the requests that was evaluated; the model router's audit (shadow replays on the
other model: agreement per route reason and direction, the judge's quality gap, the spend the
routing saved per hour, and the audit's measured extra load), or why there is none. Renders what
``analytics`` returns (``quality``, ``router_audit``, ``explain``); no SQL here."""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd
import streamlit as st
from clickhouse_connect.driver.exceptions import DatabaseError

from analytics.explain import explain_quality
from analytics.quality import quality_rates
from analytics.router_audit import LOW_AGREEMENT, router_audit
from analytics.timeseries import auto_step
from dashboard.cache import cached, call
from dashboard.context import Context, page_context, plain, shown
from dashboard.format import COUNT, NUM, PCT, SIGNED_USD, USD, table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from storage.catalog import gpu_prices

# the rates drawn and explained: rate column -> (explain's name, what a chart and a table call it)
RATES = {
    "truncation_rate": ("truncation", "Truncated"),
    "refusal_rate": ("refusal", "Refused"),
    "empty_rate": ("empty", "Empty"),
}
BREAKDOWNS = {  # the first is the default
    "model": "model / adapter",
    "tenant": "tenant",
    "route": "route",
    "route_reason": "route reason",
    "fleet": "whole fleet",
}
DIRECTIONS = {"small_to_large": "sent small, replayed large", "large_to_small": "sent large, replayed small"}
POINTS = 30  # steps over the window: a rate over sampled answers needs a few dozen of them per step
MIN_TOP = 0.05  # the rate axis reaches at least 5 %
MAX_GROUPS = 10  # lines per chart: the groups with the most evaluated answers
NONE = "(none)"
GROUP_LABELS: dict[str, str | tuple[str, str]] = {
    "route_reason": "Route reason",
    "evaluated": ("Evaluated answers", COUNT),
    "evaluated_share": ("Evaluated share", PCT),
    "truncation_rate": ("Truncated", PCT),
    "refusal_rate": ("Refused", PCT),
    "empty_rate": ("Empty", PCT),
    "repetition": ("Repetition (mean)", PCT),
    "json_asked": ("JSON asked", COUNT),
    "json_invalid_rate": ("Invalid JSON (of those asked)", PCT),
}
AUDIT_LABELS: dict[str, str | tuple[str, str]] = {
    "reason": "Route reason",
    "direction": "Direction",
    "routed_model": "Routed to",
    "shadow_model": "Replayed on",
    "decisions": ("Decisions", COUNT),
    "audits": ("Audits", COUNT),
    "failed": ("Shadows failed", COUNT),
    "agreement": ("Agreement (word F1)", NUM),
    "agreement_low": (f"Agreement < {LOW_AGREEMENT:g}", PCT),
    "judged": ("Judged", COUNT),
    "judge_routed": ("Judge: routed answer", NUM),
    "judge_shadow": ("Judge: shadow answer", NUM),
    "quality_gap": ("Quality gap (shadow − routed)", NUM),
    "cost_routed": ("Routed pool per 1M tokens ($)", USD),
    "cost_other": ("Other pool per 1M tokens ($)", USD),
    "saved_per_hour": ("Saved per hour ($)", SIGNED_USD),
}


def _read(ctx: Context, by: str, step: int, prices: dict[str, float]) -> dict[str, Any]:
    """The page's answers, read at once: each one, or the ``ValueError``/``KeyError`` its call raised (said
    where it is shown); a store without the quality columns stops the page with one error."""
    v = ctx.view
    dims = None if by == "fleet" else by
    calls = {
        "total": call(quality_rates, v.start, v.end, by=None, filters=v.filters),
        "groups": call(quality_rates, v.start, v.end, by=dims, filters=v.filters),
        "series": call(quality_rates, v.start, v.end, by=dims, step_s=step, filters=v.filters),
        "audit": call(router_audit, v.start, v.end, prices=prices, filters=v.filters),
        **{name: call(explain_quality, v.start, v.end, rate=name, filters=v.filters) for name, _ in RATES.values()},
    }
    try:
        got = ctx.fetch(**calls)
    except DatabaseError as exc:  # a store migrated before the scores' columns (0014, 0015)
        first = str(exc).strip().splitlines()[0][:300]
        st.error(f"The quality scores cannot be read (run `fleetscope migrate`): {first}")
        st.stop()
    out: dict[str, Any] = {}
    for name in calls:
        try:
            out[name] = got[name]
        except (ValueError, KeyError) as exc:  # "no price for L40S", a window the analytics refuse
            out[name] = exc
    return out


def _headline(total: pd.DataFrame) -> None:
    row = total.iloc[0]
    cols = st.columns(4)
    cols[0].metric(
        "Evaluated answers",
        shown(row["evaluated"], "{:,.0f}"),
        help=f"{shown(row['evaluated'] / row['requests'], '{:.0%}')} of {shown(row['requests'], '{:,.0f}')} "
        "requests (weighted): the gateway scores a sample of the answers (gateway.quality.sample_rate)",
    )
    for col, (rate, (_, title)) in zip(cols[1:], RATES.items(), strict=True):
        col.metric(title, shown(row[rate], "{:.1%}"), help="share of the evaluated answers, weighted")


def _labelled(df: pd.DataFrame, by: str) -> pd.DataFrame:
    """``df`` with its group column readable: an empty value (no route reason) named."""
    if by == "fleet" or by not in df:
        return df
    return df.assign(**{by: df[by].astype(str).replace("", NONE)})


def _top_groups(groups: Any, by: str) -> list[str]:
    if by == "fleet" or isinstance(groups, Exception) or groups.empty:
        return []
    return list(_labelled(groups, by).nlargest(MAX_GROUPS, "evaluated")[by])


def _rate_chart(ctx: Context, series: pd.DataFrame, by: str, rate: str, ex: Any) -> Any:
    """One rate over time, a line per group; the explanation's break as a rule."""
    name, title = RATES[rate]
    keys = [] if by == "fleet" else [by]
    df = series[["ts", *keys, "evaluated", rate]].rename(columns={rate: name})
    df = with_gaps(df, series.attrs.get("step"), keys)
    highest = df[name].max()
    top = max(MIN_TOP, float(highest)) if pd.notna(highest) else MIN_TOP
    colour = (
        alt.Color(f"{by}:N", title=BREAKDOWNS[by], legend=alt.Legend(orient="bottom")) if keys else alt.value("#4c78a8")
    )
    tips = [TS_TIP, *[f"{k}:N" for k in keys], alt.Tooltip(f"{name}:Q", format=".1%", title=title.lower())]
    tips.append(alt.Tooltip("evaluated:Q", format=",.0f", title="evaluated answers"))
    chart: Any = (
        alt.Chart(plain(df))
        .mark_line(point=True, **LINE)
        .encode(
            x=time_x(ctx.view),
            y=alt.Y(
                f"{name}:Q",
                title=f"{title.lower()} (share of evaluated)",
                axis=alt.Axis(format=".0%"),
                scale=alt.Scale(domain=[0, top], nice=True),  # a rate of 0 throughout reads 0%, not 0.000000%
            ),
            color=colour,
            tooltip=tips,
        )
    )
    if getattr(ex, "break_at", None) is not None:
        at = pd.DataFrame({"ts": [pd.Timestamp(ex.break_at)], "what": [f"{ex.metric} rose"]})
        chart = alt.layer(
            chart,
            alt.Chart(at)
            .mark_rule(color="#dc2626", strokeWidth=2)
            .encode(x=time_x(ctx.view), tooltip=[alt.Tooltip("what:N", title="break"), TS_TIP]),
        )
    return with_annotations(chart, ctx)


def _over_time(ctx: Context, got: dict[str, Any], by: str) -> None:
    series = got["series"]
    st.subheader("Rates over time")
    if isinstance(series, Exception) or series.empty:
        st.caption(f"No rates to draw{f': {series}' if isinstance(series, Exception) else ''}.")
        return
    st.caption(
        "Share of the evaluated answers that were truncated (finish reason 'length'), refused, or empty, per "
        f"{series.attrs.get('step', 0)} s step; a red rule marks a lasting rise the explanation found."
    )
    top = _top_groups(got["groups"], by)
    series = _labelled(series, by)
    if top:
        series = series[series[by].isin(top)]
        if len(top) < len(got["groups"]):
            st.caption(f"The {len(top)} {BREAKDOWNS[by]} values with the most evaluated answers.")
    for col, rate in zip(st.columns(len(RATES)), RATES, strict=True):
        with col:
            ex = got[RATES[rate][0]]
            st.altair_chart(_rate_chart(ctx, series, by, rate, ex), width="stretch")


def _explained(got: dict[str, Any]) -> None:
    """The explanation's sentence for each rate with a lasting rise; one line when there is none."""
    found = False
    for name, _ in RATES.values():
        ex = got[name]
        if isinstance(ex, Exception):
            st.caption(f"The {name} rate could not be explained: {ex}.")
        elif ex.break_at is not None:
            st.warning(ex.sentence)
            found = True
    if not found:
        st.caption("No lasting rise of the truncation, refusal or empty-answer rate in this window.")


def _per_group(got: dict[str, Any], by: str) -> None:
    groups = got["groups"]
    st.subheader(f"Rates by {BREAKDOWNS[by]} over the window")
    if isinstance(groups, Exception) or groups.empty:
        st.caption("No request rows for this breakdown.")
        return
    df = _labelled(groups, by).assign(evaluated_share=groups["evaluated"] / groups["requests"])
    keys = [] if by == "fleet" else [by]
    columns = [*keys, "requests", "evaluated", "evaluated_share", *RATES, "repetition", "json_asked"]
    df = df[[*columns, "json_invalid_rate"]].sort_values("evaluated", ascending=False)
    st.dataframe(
        table(df, GROUP_LABELS),
        hide_index=True,
        width="stretch",
        column_config={
            "Evaluated share": st.column_config.Column(help="evaluated answers / requests (both weighted)"),
            "Repetition (mean)": st.column_config.Column(help="share of repeated word n-grams, mean over answers"),
        },
    )


def _audit(ctx: Context, got: dict[str, Any]) -> None:
    v = ctx.view
    st.subheader("Router audit")
    audit = got["audit"]
    if isinstance(audit, KeyError):  # a pool without a GPU price: the audit without the spend saved
        st.caption(f"Spend saved needs every pool's GPU price ({audit.args[0]}; `fleetscope prices list`).")
        audit = cached(router_audit, ctx.client, v.start, v.end, filters=v.filters)
    if isinstance(audit, Exception):
        st.caption(f"The router audit cannot be read: {audit}.")
        return
    if audit.empty:
        st.info(
            f"No router-audit data between {v.start:%H:%M} and {v.end:%H:%M} UTC: enable `gateway.router_audit` "
            "in the fleet spec to replay a sample of the model router's decisions on the other model "
            "(docs/quality.md); its agreement, the judge's quality gap and the spend saved are shown here."
        )
        return
    cols = st.columns(3)
    cols[0].metric("Audits", shown(audit.attrs.get("audits"), "{:,.0f}"), help="shadow replays that answered")
    cols[1].metric("Shadows failed", shown(audit.attrs.get("failed"), "{:,.0f}"))
    cols[2].metric(
        "Audit's extra load",
        shown(audit.attrs.get("shadow_share"), "{:.1%}"),
        help="the shadows' tokens / the users' tokens in the window, as the store measured them; the gateway "
        "keeps it under gateway.router_audit.max_share (configured in the fleet spec, not in the store)",
    )
    df = audit.assign(direction=audit["direction"].map(DIRECTIONS).fillna(audit["direction"]))
    df = df.drop(columns=["tokens_per_hour"])
    st.dataframe(table(df, AUDIT_LABELS), hide_index=True, width="stretch")
    st.caption(
        "Agreement: the word F1 of the routed and the shadow answer (lexical, not semantic). Quality gap: the "
        "judge's score of the shadow minus the routed answer (> 0: the other model answers better). Saved per "
        "hour: the routed tokens per hour at the other pool's cost per 1M tokens minus the routed pool's."
    )


def _empty(ctx: Context, total: Any) -> bool:
    """Say why there is nothing to rate; True when the rates' sections have nothing to show."""
    v = ctx.view
    window = f"between {v.start:%H:%M} and {v.end:%H:%M} UTC"
    if isinstance(total, Exception):
        st.error(f"The quality rates cannot be read: {total}.")
        return True
    if total.empty:
        st.info(
            f"No gateway request-log rows {window} for these filters: only the gateway scores answers "
            "(is it sending its request log to the collector?)."
        )
        return True
    if float(total["evaluated"].iloc[0]) == 0:
        st.info(
            f"None of the requests {window} was evaluated: set `gateway.quality.sample_rate` in the fleet spec "
            "to score a sample of the answers (docs/quality.md)."
        )
        return True
    return False


def render() -> None:
    ctx = page_context("Quality")
    v = ctx.view
    prices = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
    by = st.session_state.get("quality_by", next(iter(BREAKDOWNS)))  # the radio below, as it last said
    got = _read(ctx, by, auto_step(v.start, v.end, points=POINTS), prices)
    if not _empty(ctx, got["total"]):
        _headline(got["total"])
        _explained(got)
        st.radio("Break down by", list(BREAKDOWNS), format_func=BREAKDOWNS.get, horizontal=True, key="quality_by")
        _over_time(ctx, got, by)
        _per_group(got, by)
    _audit(ctx, got)


render()
