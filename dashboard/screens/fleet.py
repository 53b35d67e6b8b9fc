"""Fleet: the replicas and their scrape endpoints (up or failing, and why; stalled: requests held
and no token generated), GPU types and prices
(editable), SLO targets (editable) and annotations (deploys, config changes, incident notes)
that show as markers on every time chart. Numbers come from ``analytics``; edits go to the
metadata DB through ``storage.catalog``, which checks them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import altair as alt
import pandas as pd
import streamlit as st

from analytics.cost import gpu_hours
from analytics.health import scrape_health, silent_targets
from analytics.saturation import Targets
from analytics.stalls import stalls
from dashboard.cache import call
from dashboard.context import page_context, plain
from dashboard.format import table
from storage.catalog import (
    METRICS,
    SloTarget,
    add_annotation,
    annotations_in,
    check_slo,
    delete_annotation,
    delete_gpu_price,
    delete_slo,
    gpu_prices,
    set_gpu_price,
    set_slo,
    slo_targets,
)

STALL_S = Targets().stall_s  # a stall this long is named

ctx = page_context("Fleet")
v, client, sessions = ctx.view, ctx.client, ctx.sessions

st.subheader("Replicas")
got = ctx.fetch(  # read at once
    health=call(scrape_health, v.start, v.end),
    hours=call(gpu_hours, v.start, v.end, filters=v.filters),
    wedged=call(stalls, v.start, v.end, min_seconds=STALL_S, filters=v.filters),
)
health, hours = got["health"], got["hours"]
if health.empty and hours.empty:
    st.info(
        f"No scrape between {v.start:%H:%M} and {v.end:%H:%M} UTC: add targets to the collector "
        "(`fleetscope collect --help`) or start the bundled fleet (`fleetscope fleet up`)."
    )
else:
    for why in silent_targets(health)["why"] if len(health) else []:
        st.error(why)
    wedged = got["wedged"]
    for row in wedged.itertuples():
        st.error(
            f"replica {row.replica} {'is' if row.ongoing else 'was'} stalled "
            f"since {row.since:%Y-%m-%d %H:%M:%S} UTC"
            + ("" if row.ongoing else f" until {row.until:%H:%M:%S}")
            + f" ({row.seconds / 60:.1f} min): it answers /metrics but held {row.requests} request(s) and "
            "generated no token"
        )
    targets = health.merge(
        hours[["replica", "model", "gpu_type", "gpu_count", "up_seconds"]], on="replica", how="outer"
    )
    if v.filters.model or v.filters.replica:  # the targets of the replicas asked for (a model is known by its metrics)
        picked = targets["replica"].isin(set(hours["replica"]) | set(v.filters.replica))
        if (~picked).any():
            st.caption(
                f"{int((~picked).sum())} other scrape target(s) not shown: not the "
                + ("model" if v.filters.model else "replica")
                + " picked in the filters, or no engine metrics in the window to tell their model."
            )
        targets = targets[picked]
    worst = wedged.groupby("replica")["seconds"].max() if len(wedged) else pd.Series(dtype=float)
    ongoing = set(wedged.loc[wedged["ongoing"], "replica"]) if len(wedged) else set()
    targets["stalled"] = [
        ("now, " if r in ongoing else "") + f"{worst[r] / 60:.1f} min" if r in worst.index else ""
        for r in targets["replica"]
    ]
    if len(hours):
        st.altair_chart(
            alt.Chart(plain(hours))
            .mark_bar()
            .encode(
                x=alt.X("gpu_hours:Q", title="GPU-hours in the window"),
                y=alt.Y("replica:N", title=None),
                color=alt.Color("gpu_type:N", title="GPU type"),
                tooltip=[
                    "replica:N",
                    "model:N",
                    "gpu_type:N",
                    "gpu_count:Q",
                    alt.Tooltip("gpu_hours:Q", format=",.2f"),
                ],
            ),
            width="stretch",
        )
    st.dataframe(table(targets), hide_index=True, width="stretch")

if sessions is None:
    st.caption("No metadata DB configured: prices, SLOs and annotations cannot be edited here.")
    st.stop()

st.subheader("GPU prices")
st.caption("USD per GPU-hour, by the `gpu_type` label of the scrape targets. Edit a price or add a row, then save.")
prices = pd.DataFrame(sorted(gpu_prices(sessions).items()), columns=["gpu_type", "usd_per_gpu_hour"])
edited = st.data_editor(
    prices,
    num_rows="dynamic",
    hide_index=True,
    key="prices",
    column_config={
        "gpu_type": st.column_config.TextColumn("GPU type", required=True),
        "usd_per_gpu_hour": st.column_config.NumberColumn(
            "USD / GPU-hour", min_value=0.0, format="%.2f", required=True
        ),
    },
)
if st.button("Save prices", key="save_prices"):
    rows = edited.dropna(how="all")
    problems = [
        f"row {i + 1}: GPU type and price are both needed"
        for i, r in enumerate(rows.to_dict("records"))
        if not str(r["gpu_type"] or "").strip() or pd.isna(r["usd_per_gpu_hour"])
    ]
    names = [str(t).strip() for t in rows["gpu_type"].dropna()]
    problems += [f"{name} is listed twice" for name in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        st.error("Not saved: " + "; ".join(problems) + ".")
    else:
        try:
            for r in rows.to_dict("records"):
                set_gpu_price(sessions, str(r["gpu_type"]).strip(), float(r["usd_per_gpu_hour"]))
            gone = set(prices["gpu_type"]) - set(names)
            for name in gone:
                delete_gpu_price(sessions, name)
        except ValueError as exc:
            st.error(f"Not saved: {exc}")
        else:
            st.success(f"Saved {len(rows)} prices" + (f", removed {', '.join(sorted(gone))}" if gone else "") + ".")

st.subheader("SLO targets")
targets = pd.DataFrame(
    [t.__dict__ for t in slo_targets(sessions)],
    columns=["model", "metric", "threshold_seconds", "objective", "window_days", "percentile"],
)
edited_slo = st.data_editor(
    targets,
    num_rows="dynamic",
    hide_index=True,
    key="slos",
    column_config={
        "model": st.column_config.TextColumn("model", required=True),
        "metric": st.column_config.SelectboxColumn("metric", options=list(METRICS), required=True),
        "threshold_seconds": st.column_config.NumberColumn(
            "threshold (s)", min_value=0.0, format="%.3f", required=True
        ),
        "objective": st.column_config.NumberColumn("objective", min_value=0.0, max_value=1.0, format="%.4f"),
        "window_days": st.column_config.NumberColumn("window (days)", min_value=1, step=1),
        "percentile": st.column_config.NumberColumn("percentile", min_value=0.0, max_value=1.0, format="%.3f"),
    },
)
if st.button("Save SLOs", key="save_slos"):
    keep = edited_slo.dropna(how="all")
    problems = [
        f"row {i + 1}: model, metric and threshold are needed"
        for i, r in enumerate(keep.to_dict("records"))
        if not str(r["model"] or "").strip() or pd.isna(r["metric"]) or pd.isna(r["threshold_seconds"])
    ]
    keys = list(zip(keep["model"].astype(str).str.strip(), keep["metric"].astype(str), strict=True))
    problems += [f"{m} {k} is listed twice" for m, k in sorted({key for key in keys if keys.count(key) > 1})]
    try:  # every row checked before any is written
        wanted = (
            []
            if problems
            else [
                SloTarget(
                    str(r["model"]).strip(),
                    str(r["metric"]),
                    float(r["threshold_seconds"]),
                    0.99 if pd.isna(r["objective"]) else float(r["objective"]),
                    30 if pd.isna(r["window_days"]) else int(r["window_days"]),
                    None if pd.isna(r["percentile"]) else float(r["percentile"]),
                )
                for r in keep.to_dict("records")
            ]
        )
        for target in wanted:
            check_slo(target)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        st.error("Not saved: " + "; ".join(problems) + ".")
    else:
        for target in wanted:
            set_slo(sessions, target)
        gone = set(zip(targets["model"], targets["metric"], strict=True)) - set(keys)
        for model, metric in gone:
            delete_slo(sessions, model, metric)
        st.success(f"Saved {len(wanted)} SLO targets" + (f", deleted {len(gone)}" if gone else "") + ".")

st.subheader("Annotations")
st.caption("Marks on every time chart: deploys, config changes, incidents.")
with st.form("annotate", clear_on_submit=True):
    a, b, c = st.columns([2, 1, 1])
    title = a.text_input("Title", placeholder="deploy vllm 0.32.1 to pool large")
    day = b.date_input("Date (UTC)", value=datetime.now(UTC).date(), key="mark_day")
    at = c.time_input("Time (UTC)", value=datetime.now(UTC).time().replace(second=0, microsecond=0), key="mark_time")
    text = st.text_input("Details (optional)")
    if st.form_submit_button("Add annotation"):
        try:
            add_annotation(
                sessions, datetime.combine(day, at, tzinfo=UTC), title, text=text or None, created_by="dashboard"
            )
        except ValueError as exc:
            st.error(f"Not added: {exc}")
        else:
            st.success(f"Added “{title}”.")
# up to now, not to the window's end (a relative window ends on its grain, up to 10 s back):
# a mark just added must be listed at once
marks = annotations_in(sessions, v.start, max(v.end, datetime.now(UTC)) + timedelta(seconds=1))
if not marks:
    st.caption("No annotations in this window.")
for mark in marks:
    left, right = st.columns([6, 1])
    left.markdown(f"**{mark.starts_at:%Y-%m-%d %H:%M} UTC** — {mark.title}" + (f": {mark.text}" if mark.text else ""))
    if right.button("Delete", key=f"del_{mark.id}"):
        delete_annotation(sessions, mark.id)
        st.rerun()
