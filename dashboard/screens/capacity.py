"""Cache & capacity: KV-cache usage per replica over time (heatmap, with the replicas that stalled
outlined), requests waiting and running, preemptions, prefix-cache hit rate, headroom per model
pool and the scale-out recommendation with its reasons (single replicas named: stalled or
saturated ones); replicas per pool over time with the autoscaler's scale events, each scale-out's
cold start, flapping and the spare capacity's spend per hour (``dashboard.elasticity``); where
replicas serve LoRA adapters, which adapters ran, which waited for an
adapter slot, and each adapter's traffic and latency. Renders what ``analytics`` returns; no SQL
here."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from analytics.adapters import adapter_traffic, blocked_over_time, deferred_over_time, residency
from analytics.filters import Filters
from analytics.metrics import gauge_summary
from analytics.prefix import CLASSES, MAX_SPAN, misses_words, prefix_misses
from analytics.saturation import KV, Targets, headroom, kv_over_time, recommend, saturation_over_time
from analytics.stalls import stalls
from dashboard.cache import cached, call
from dashboard.context import page_context, plain
from dashboard.elasticity import render_elasticity
from dashboard.format import PCT, cell, table
from dashboard.marks import LINE, TS_TIP, time_x, with_annotations, with_gaps
from planner.fleet import PlanError, gateway_routing
from planner.plan import Changes, effect
from planner.plan import plan as replay_plan
from storage.catalog import gpu_prices

MAX_LINES = 12
HEAT_ROWS = 30
REPLAY_SPAN = pd.Timedelta(minutes=30)  # the recommendation is replayed on the range's last half hour


def pct(x: float) -> str:
    return str(cell(x, PCT))


MISS_NAMES = {"routing": "routing miss", "evicted": "evicted", "new_prefix": "new prefix"}

ctx = page_context("Cache & capacity")
v, client = ctx.view, ctx.client
targets = Targets()
got = ctx.fetch(  # read at once; the lines below need the replicas' count and the step first
    peaks=call(gauge_summary, KV, v.start, v.end, "replica", filters=v.filters),
    wedged=call(stalls, v.start, v.end, min_seconds=targets.stall_s, filters=v.filters),
    room=call(headroom, v.start, v.end, targets=targets, filters=v.filters),
)
peaks = got["peaks"].set_index("replica").rename(columns={"max": "peak"})
if peaks.empty:
    st.info(
        f"No KV-cache samples between {v.start:%H:%M} and {v.end:%H:%M} UTC: no replica was scraped in this window "
        "(is `fleetscope collect` running?). Try a longer time range."
    )
    st.stop()
replicas = len(peaks)
st.subheader("KV-cache usage per replica")
# the replicas that came closest to full: a row per replica stays readable, and the chart light, up to a few dozen
hottest = (
    peaks.sort_values(["peak", "avg"], ascending=False).index[:HEAT_ROWS] if replicas > HEAT_ROWS else peaks.index
)  # a small fleet keeps its rows in name order (they do not move on a refresh)
shown_filters = v.filters
if replicas > HEAT_ROWS:  # their steps alone are read
    f = v.filters
    shown_filters = Filters(model=f.model, replica=list(hottest), tenant=f.tenant, route=f.route)
cells = cached(kv_over_time, client, v.start, v.end, "replica", filters=shown_filters)
step = cells.attrs.get("step")
st.caption(
    f"Average of each {step:g}s step; a replica at 100% queues or preempts requests (target {targets.kv_target:.0%})."
    + (
        f" The {len(hottest)} of {replicas} replicas with the highest peak, hottest first "
        f"({int((peaks['peak'] >= targets.kv_target).sum())} of {replicas} went past the target); "
        "pick replicas in the sidebar to see others."
        if replicas > HEAT_ROWS
        else ""
    )
)
cells = cells.assign(ts_end=cells["ts"] + pd.Timedelta(seconds=step))  # each step a cell of its own width
wedged = got["wedged"]
for row in wedged.itertuples():
    st.error(
        f"**{row.replica}** ({row.model}) {'is' if row.ongoing else 'was'} stalled: it held {row.requests} "
        f"request(s) and generated no token from {row.since:%H:%M:%S} to "
        + ("now" if row.ongoing else f"{row.until:%H:%M:%S}")
        + f" UTC ({row.seconds / 60:.1f} min)."
    )
heat = (
    alt.Chart(plain(cells))
    .mark_rect()
    .encode(
        x=time_x(v),
        x2="ts_end:T",
        y=alt.Y("replica:N", title=None, sort=list(hottest)),
        color=alt.Color(
            "kv_avg:Q",
            title="KV used",
            scale=alt.Scale(domain=[0, 1], scheme="orangered"),
            legend=alt.Legend(format="%"),
        ),
        tooltip=[
            TS_TIP,
            "replica:N",
            alt.Tooltip("kv_avg:Q", format=".0%", title="KV avg"),
            alt.Tooltip("kv_max:Q", format=".0%", title="KV max"),
            alt.Tooltip("waiting:Q", format=".1f"),
        ],
    )
)
shown = wedged[wedged["replica"].isin(hottest)]
if len(shown):  # a stalled replica's steps outlined on its row
    heat = alt.layer(
        heat,
        alt.Chart(plain(shown))
        .mark_rect(fill=None, stroke="#111827", strokeWidth=2, strokeDash=[3, 2])
        .encode(
            x=time_x(v, field="since"),
            x2="until:T",
            y=alt.Y("replica:N", sort=list(hottest)),
            tooltip=["replica:N", alt.Tooltip("seconds:Q", title="stalled (s)", format=",.0f"), "requests:Q"],
        ),
    )
st.altair_chart(with_annotations(heat, ctx), width="stretch")

# a line per replica reads well up to a dozen; beyond, per model pool (filter replicas to see them one by one)
by = "replica" if replicas <= MAX_LINES else "model"
lines = cached(saturation_over_time, client, v.start, v.end, by, step=step, filters=v.filters)
if by == "model":
    st.caption(
        f"{replicas} replicas: the charts below show each model pool (requests per replica, preemptions summed); "
        "pick replicas in the sidebar to see them one by one."
    )
queue = lines.melt(id_vars=["ts", by], value_vars=["waiting", "running"], var_name="state", value_name="requests")
left, right = st.columns(2)
with left:
    st.subheader("Requests waiting and running")
    st.altair_chart(
        with_annotations(
            alt.Chart(plain(with_gaps(queue, step, [by, "state"])))
            .mark_line(**LINE)
            .encode(
                x=time_x(v),
                y=alt.Y("requests:Q", title="requests (avg per step)"),
                color=alt.Color(f"{by}:N"),
                strokeDash=alt.StrokeDash("state:N"),
                tooltip=[TS_TIP, f"{by}:N", "state:N", alt.Tooltip("requests:Q", format=".1f")],
            ),
            ctx,
        ),
        width="stretch",
    )
with right:
    st.subheader("Preemptions")
    st.altair_chart(
        with_annotations(
            alt.Chart(plain(with_gaps(lines, step, by)))
            .mark_line(**LINE)
            .encode(
                x=time_x(v),
                y=alt.Y("preemptions_per_s:Q", title="preemptions / s"),
                color=alt.Color(f"{by}:N"),
                tooltip=[TS_TIP, f"{by}:N", alt.Tooltip("preemptions_per_s:Q", format=".3f")],
            ),
            ctx,
        ),
        width="stretch",
    )
hits = lines.dropna(subset=["prefix_hit_rate"])
st.subheader("Prefix-cache hit rate")
if hits.empty:
    st.caption("No prefix-cache queries in this window (prefix caching off, or no traffic).")
else:
    st.altair_chart(
        with_annotations(
            alt.Chart(plain(with_gaps(hits, step, by)))
            .mark_line(**LINE)
            .encode(
                x=time_x(v),
                y=alt.Y("prefix_hit_rate:Q", title="hit rate", axis=alt.Axis(format="%")),
                color=alt.Color(f"{by}:N"),
                tooltip=[TS_TIP, f"{by}:N", alt.Tooltip("prefix_hit_rate:Q", format=".0%")],
            ),
            ctx,
        ),
        width="stretch",
    )

router, prefix_tokens = gateway_routing(getattr(getattr(ctx.settings, "fleet", None), "spec", None))
st.subheader("Why the prefix cache missed")
if st.toggle(
    "Classify the misses from the request log",
    value=v.end - v.start <= MAX_SPAN,  # request by request: on for a range of hours, asked for beyond
    key="capacity_misses",
    help=f"Reads the request log of the range's last {MAX_SPAN.total_seconds() / 3600:g} hours at most.",
):
    misses = cached(prefix_misses, client, v.start, v.end, by, prefix_tokens=prefix_tokens, filters=v.filters)
    if misses.empty:
        st.caption("No request log in this window: the misses are classified from the gateway's log.")
    else:
        a = misses.attrs
        said = misses_words(a.get("misses") or {}, a.get("affinity_hit_rate"))
        st.caption(
            f"Since {a['start']:%H:%M} UTC, prompt tokens that missed a reusable prefix: a *routing miss* was warm "
            "on another replica, *evicted* was seen before and gone from every cache, a *new prefix* never seen. "
            f"Modelled hit rate {pct(a['hit_rate'])} (the engines counted {pct(a['observed_hit_rate'])})"
            + (f"; {said}." if said else ".")
        )
        long = misses.melt(id_vars=["ts", by], value_vars=list(MISS_NAMES), var_name="class", value_name="tokens")
        long = long.groupby(["ts", "class"], as_index=False)["tokens"].sum()
        long["class"] = long["class"].map(MISS_NAMES)
        st.altair_chart(
            with_annotations(
                alt.Chart(plain(long))
                .mark_area(opacity=0.85)
                .encode(
                    x=time_x(v),
                    y=alt.Y("tokens:Q", title="missed prefix tokens", stack=True),
                    color=alt.Color("class:N", title="Why", sort=list(MISS_NAMES.values())),
                    tooltip=[TS_TIP, "class:N", alt.Tooltip("tokens:Q", format=",.0f")],
                ),
                ctx,
            ),
            width="stretch",
        )
        per = misses.groupby(by, as_index=False)[list(CLASSES)].sum()
        per["hit_rate"] = per["hit"] / per[list(CLASSES)].sum(axis=1).where(lambda x: x > 0)
        st.dataframe(table(per[[by, "hit_rate", *MISS_NAMES]]), hide_index=True, width="stretch")

lora = cached(residency, client, v.start, v.end, filters=v.filters)
if len(lora):  # replicas that serve LoRA adapters
    st.subheader("LoRA adapters")
    names = sorted(set(lora["adapter"]))
    # requests held back for a slot (vLLM's waiting reason "deferred") and the adapters listed waiting
    # behind another (what the simulator reports; vLLM 0.32 lists an adapter once its request is scheduled)
    held = cached(deferred_over_time, client, v.start, v.end, int(step or 60), filters=v.filters)
    blocked = cached(blocked_over_time, client, v.start, v.end, int(step or 60), filters=v.filters)
    waits = pd.concat(
        [
            held.rename(columns={"deferred": "value"}).assign(what="requests deferred")[["ts", "what", "value"]],
            blocked.rename(columns={"blocked": "value"}).assign(what="adapters waiting")[["ts", "what", "value"]],
        ],
        ignore_index=True,
    )
    if len(waits) and float(waits["value"].max()) > 0:
        st.altair_chart(
            with_annotations(
                alt.Chart(plain(waits))
                .mark_line(**LINE)
                .encode(
                    x=time_x(v),
                    y=alt.Y("value:Q", title="waiting for an adapter slot (avg per step)"),
                    color=alt.Color("what:N", title=""),
                    tooltip=[TS_TIP, "what:N", alt.Tooltip("value:Q", format=".1f")],
                ),
                ctx,
            ),
            width="stretch",
        )
    traffic = cached(adapter_traffic, client, v.start, v.end, names, filters=v.filters)
    shown_lora = lora.merge(traffic.rename(columns={"model": "adapter"}), on="adapter", how="left")
    st.caption(
        "Of the scrape intervals in which the replica's engine stepped: the share in which the adapter ran at some "
        "point, and the share in which its requests waited for a slot at some point (every adapter slot, max_loras, "
        "ran another adapter), which raises their TTFT; adapters taking turns in one slot can each run in most "
        "intervals. Requests and latency are the adapter's over the fleet."
    )
    cols = ["replica", "adapter", "resident_share", "blocked_share", "requests", "ttft_p50", "ttft_p99", "itl_p99"]
    st.dataframe(table(shown_lora[cols]), hide_index=True, width="stretch")

render_elasticity(ctx, step)  # replicas over time, scale events, cold starts, flapping, headroom's $/h

st.subheader("Headroom and scale-out")
room = got["room"]
plan = recommend(room, targets)  # from the headroom just read: no second query
recent = room.attrs.get("window")
if recent:
    st.caption(f"Judged on the window's last quarter ({recent[0]:%H:%M}–{recent[1]:%H:%M} UTC).")
for row in plan.to_dict("records"):
    verb = (
        ("add " + str(row["change"]))
        if row["change"] > 0
        else ("remove " + str(-row["change"]))
        if row["change"] < 0
        else "keep"
    )
    box = (
        st.error
        if row["stalled"]
        else st.warning
        if row["change"] > 0 or row["attention"]
        else st.success
        if row["change"] == 0
        else st.info
    )
    box(
        f"**{row['model']}**: {row['replicas']} → {row['recommended']} replicas ({verb}). "
        + "; ".join(row["reasons"])
        + "."
    )
st.dataframe(table(room.drop(columns=["saturated", "stalled"])), hide_index=True, width="stretch")

moves = {
    str(r["model"]): [int(r["recommended"])]
    for r in plan.to_dict("records")
    if r["change"] != 0 and r["recommended"] > 0
}
if moves and st.toggle(
    "Replay the recommendation on the fleet's own traffic",
    key="capacity_replay",
    help="`fleetscope plan` on the range's last half hour: the recorded requests through the recommended fleet.",
):
    begin = max(v.start, v.end - REPLAY_SPAN.to_pytimedelta())
    prices = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
    try:
        with st.spinner("Replaying…"):
            planned = cached(
                replay_plan,
                client,
                begin,
                v.end,
                prices=prices,
                changes=Changes(replicas=moves),
                router=router,
                prefix_tokens=prefix_tokens,
            )
    except PlanError as exc:
        st.info(f"No replay: {exc}.")
    else:
        name = str(planned.table["fleet"].iloc[-1])
        st.info(
            f"Replayed from {begin:%H:%M} to {v.end:%H:%M} UTC with "
            + ", ".join(f"{m} at {n[0]} replica{'s' if n[0] != 1 else ''}" for m, n in moves.items())
            + f": {effect(planned, name)}. More variants on the Plan page."
        )
