"""Plan: what if the fleet had been another one. The window's recorded traffic (at most its last
``PLAN_SPAN``) replayed through the gateway's routing and the engine simulator, fitted to the
recorded fleet, against the replica counts, GPU types, KV budgets, routing policy and traffic
scale picked in the form: latency, SLO attainment, cache hits, saturation, rejections and cost
beside what the fleet did, and the cheapest fleet that meets the SLOs. Renders what
``planner.plan`` returns; no SQL here."""

from __future__ import annotations

from datetime import timedelta

import altair as alt
import pandas as pd
import streamlit as st

from dashboard.cache import cached
from dashboard.context import page_context, plain
from dashboard.format import SECONDS, table
from planner.fleet import GPU_SPEED, POLICIES, PlanError, gateway_routing
from planner.plan import CPU_DEMO, Changes, plan, recorded_fleet
from storage.catalog import gpu_prices, slo_targets

PLAN_SPAN = timedelta(hours=1)  # replayed request by request: the range's last hour at most
STATE = "fleetscope_plan"  # the changes of the last replay asked for (a refresh shows it again)

ctx = page_context("Plan")
v, client = ctx.view, ctx.client
end = v.end
start = max(v.start, end - PLAN_SPAN)
prices = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
targets = tuple(slo_targets(ctx.sessions)) if ctx.sessions is not None else ()
spec = getattr(getattr(ctx.settings, "fleet", None), "spec", None)
router, prefix_tokens = gateway_routing(spec)
try:
    recorded = cached(recorded_fleet, client, start, end, router=router)
except PlanError as exc:
    st.info(f"{exc}. Try a longer time range, or run the fleet (`fleetscope up`).")
    st.stop()

st.caption(
    f"Replays the requests logged from {start:%H:%M} to {end:%H:%M} UTC"
    + (" (the range's last hour)" if start > v.start else "")
    + " through the gateway's routing and the engine simulator, fitted to the fleet as it ran. "
    "Change the fleet below and replay: the first two rows are what the fleet did and its own replay "
    "(how far to trust the rest)."
)
with st.form("plan"):
    columns = st.columns(len(recorded.pools))
    picked: dict[str, tuple[int, str, int]] = {}
    for column, pool in zip(columns, recorded.pools.values(), strict=True):
        with column:
            st.markdown(f"**{pool.model}** — {pool.replicas}× {pool.gpu_type}, {pool.kv_tokens:,} KV tokens")
            # the GPU types with a price and a known speed, on the pool's own scale (CPU engines are on none with GPUs)
            same = [g for g in prices if g in GPU_SPEED and (g == CPU_DEMO) == (pool.gpu_type == CPU_DEMO)]
            gpus = sorted({*same, pool.gpu_type})
            picked[pool.model] = (
                int(st.number_input("Replicas", 1, 256, pool.replicas, key=f"plan_replicas_{pool.model}")),
                str(st.selectbox("GPU type", gpus, index=gpus.index(pool.gpu_type), key=f"plan_gpu_{pool.model}")),
                int(
                    st.number_input(
                        "KV tokens per replica",
                        pool.engine.block_size,
                        100_000_000,
                        pool.kv_tokens,
                        step=pool.engine.block_size,
                        key=f"plan_kv_{pool.model}",
                    )
                ),
            )
    left, middle, right = st.columns(3)
    policy = left.selectbox("Routing policy", POLICIES, index=POLICIES.index(recorded.policy), key="plan_policy")
    scale = middle.number_input("Traffic ×", 0.1, 20.0, 1.0, step=0.25, key="plan_scale")
    cores = right.number_input(
        "CPU cores the engines shared",
        0.0,
        512.0,
        0.0,
        step=0.5,
        key="plan_cores",
        help="The CPU demo fleet's engines share this machine's cores with each other (and with fleetscope): "
        "say how many they had, and the replay slows them down as they did. 0: each replica its own GPU.",
    )
    if any(p.gpu_type == CPU_DEMO for p in recorded.pools.values()):
        st.caption(
            "These replicas are the CPU demo's vLLM engines: they shared this machine's cores. On a 2-core machine "
            "beside the collector and the dashboard, about 1.5 cores reproduce their tail."
        )
    if st.form_submit_button("Replay", type="primary"):
        pools = recorded.pools
        st.session_state[STATE + "_cores"] = float(cores) or None
        st.session_state[STATE] = Changes(
            replicas={m: [n] for m, (n, _g, _k) in picked.items() if n != pools[m].replicas},
            gpu={m: g for m, (_n, g, _k) in picked.items() if g != pools[m].gpu_type},
            kv_tokens={m: k for m, (_n, _g, k) in picked.items() if k != pools[m].kv_tokens},
            policies=[policy] if policy != recorded.policy else [],
            scales=[float(scale)] if scale != 1 else [],
        )

changes = st.session_state.get(STATE)
if changes is None:
    st.stop()
try:
    with st.spinner("Replaying the window…"):
        planned = cached(
            plan,
            client,
            start,
            end,
            prices=prices,
            targets=targets,
            changes=changes,
            router=router,
            prefix_tokens=prefix_tokens,
            shared_cores=st.session_state.get(STATE + "_cores"),
        )
except PlanError as exc:
    st.error(str(exc))
    st.stop()

for row in planned.backtest.itertuples():
    line = (
        f"**{row.model}** replayed as it ran: p99 TTFT {row.p99_ttft_replayed:.2f} s against "
        f"{row.p99_ttft_observed:.2f} s observed ({row.p99_ttft_error:+.0%}), mean KV used "
        f"{row.kv_mean_replayed:.0%} against {row.kv_mean_observed:.0%}"
    )
    kv_points = row.kv_tolerance_points
    tolerance = "25 %" + ("" if pd.isna(kv_points) else f" and {kv_points:.0f} points")  # NaN: no KV observed
    if row.within:
        st.caption(line + f" — within {tolerance}.")
    else:
        st.warning(line + f": outside {tolerance} — read the variants as a direction, not a forecast.")
if planned.fit is not None:
    st.caption(f"Simulator fitted to the recorded fleet: {planned.fit.describe()}.")

models = [str(c).removeprefix("p99_ttft ") for c in planned.table.columns if str(c).startswith("p99_ttft ")]
bars = planned.table.melt(
    id_vars=["fleet"], value_vars=[f"p99_ttft {m}" for m in models], var_name="model", value_name="p99"
)
bars["model"] = bars["model"].str.removeprefix("p99_ttft ")
st.subheader("p99 TTFT by fleet")
chart = (
    alt.Chart(plain(bars))
    .mark_bar()
    .encode(
        y=alt.Y("fleet:N", title=None, sort=list(planned.table["fleet"])),
        x=alt.X("p99:Q", title="p99 TTFT (s)"),
        color=alt.Color("model:N", title="Model"),
        yOffset="model:N",
        tooltip=["fleet:N", "model:N", alt.Tooltip("p99:Q", format=".2f", title="p99 TTFT (s)")],
    )
)
slo = pd.DataFrame(
    [{"model": t.model, "target": t.threshold_seconds} for t in targets if t.metric == "ttft" and t.model in models]
)
if len(slo):
    chart = alt.layer(
        chart,
        alt.Chart(slo)
        .mark_rule(strokeDash=[4, 3])
        .encode(x="target:Q", color=alt.Color("model:N"), tooltip=["model:N", "target:Q"]),
    )
st.altair_chart(chart, width="stretch")
st.subheader("Side by side")
labels = {f"p99_ttft {m}": (f"p99 TTFT {m}", SECONDS) for m in models}
st.dataframe(table(planned.table, labels=labels), hide_index=True, width="stretch")
if planned.cheapest:
    st.success(planned.cheapest_note)
else:
    st.info(planned.cheapest_note)
st.caption(f"Replayed at {planned.requests_per_s:,.0f} requests/s. The same from a shell: `fleetscope plan --help`.")
