"""Cache saturation and capacity: KV-cache usage, queues, preemptions, prefix hits, headroom and a
scale-out recommendation with its reasoning.

In:  a client, a window ``[start, end)``, ``by`` (replica or model), ``Filters`` (model, replica)
     and, for the recommendation, the targets in ``Targets``.
Out: - ``saturation``: one row per ``by``: ``kv_avg``, ``kv_max`` (``vllm:kv_cache_usage_perc``,
       0..1), ``waiting_avg/max``, ``running_avg/max`` (per replica), ``preemptions_per_s``,
       ``prefix_hit_rate`` (prefix-cache hits / queries, tokens), ``iteration_tokens_avg`` (tokens
       per engine step), ``replicas`` (that reported in the window);
     - ``saturation_over_time``: the same per step (``ts`` column), plus ``replicas_up``;
       ``kv_over_time``: its gauges alone (one query; the per-replica heatmap);
     - ``headroom``: per model pool over the window's most recent quarter (read from the
       whole window's tier, so aligned to its resolution): ``kv_recent``,
       ``waiting_per_replica``, ``ttft_p99_recent`` against ``ttft_p99_before`` (the rest of the
       window), ``headroom`` (1 - kv_recent / kv_target, below 0 when past the target), and the
       replicas judged one by one: ``saturated`` (KV cache at ``Targets.replica_kv`` or more on
       average with requests waiting) and ``stalled`` (``analytics.stalls``: requests held and
       no token generated for ``Targets.stall_s`` or longer), each a list of names;
     - ``scale_out``: per model: ``replicas``, ``recommended``, ``change``, ``reasons`` (the
       leading indicators that decided, in words; single replicas first: a pool with stalled or
       saturated replicas never reads "no action", whatever its average) and ``attention``
       (the replicas the reasons name).
A replica is counted up in a step when it reported ``vllm:num_requests_running``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import pandas as pd
from typing_extensions import Unpack

from analytics.filters import Filters
from analytics.metrics import counter_increases, gauge_summaries, histogram_quantile
from analytics.stalls import replica_models, stalls
from analytics.tiers import plan_scope
from analytics.timeseries import counter_rates_over_time, gauges_over_time
from analytics.vllm import (
    ITERATION_TOKENS,
    KV_CACHE_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    TTFT,
)
from analytics.window import Scope, rescope
from storage.clickhouse import Client

__all__ = [
    "KV",
    "PREEMPTIONS",
    "RUNNING",
    "WAITING",
    "Targets",
    "headroom",
    "kv_over_time",
    "recommend",
    "saturation",
    "saturation_over_time",
    "scale_out",
]

KV, WAITING, RUNNING = KV_CACHE_USAGE, REQUESTS_WAITING, REQUESTS_RUNNING
ITERATION = ITERATION_TOKENS
# the counters ``saturation`` reads, by the column they become
COUNTERS = {
    "preemptions": PREEMPTIONS,
    "hits": PREFIX_HITS,
    "queries": PREFIX_QUERIES,
    "it_sum": f"{ITERATION}_sum",
    "it_n": f"{ITERATION}_count",
}


@dataclass(frozen=True)
class Targets:
    """What a healthy pool looks like; the recommendation sizes the pool back to it."""

    kv_target: float = 0.8  # average KV-cache usage a pool should stay under
    waiting_per_replica: float = 1.0  # requests queued per replica, on average, before it counts as a queue
    ttft_growth: float = 1.5  # p99 TTFT recent / before: a rising tail
    kv_scale_in: float = 0.3  # below this, with no queue, a pool of 2+ could give a replica back
    replica_kv: float = 0.9  # a replica this full on average, with requests waiting, is saturated
    replica_waiting: float = 0.5  # ... requests waiting on it on average
    stall_s: float = 60.0  # a replica that held requests without a token this long is stalled


def saturation(
    client: Client, start: datetime, end: datetime, by: str = "replica", **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Saturation indicators per ``by`` over ``[start, end)``."""
    # one query for the gauges and one for the counters (not one per metric: a page shows all of them)
    gauges = gauge_summaries(client, [KV, WAITING, RUNNING], start, end, by, **scope)
    counters = counter_increases(client, list(COUNTERS.values()), start, end, by, **scope)
    return _indicators(gauges, counters, by, (end - start).total_seconds(), scope.get("filters"))


def _indicators(
    gauges: pd.DataFrame, counters: pd.DataFrame, by: str, seconds: float, filters: Filters | None
) -> pd.DataFrame:
    """``saturation``'s frame from its two reads (``gauge_summaries``, ``counter_increases``)."""
    out = pd.DataFrame({by: pd.Series(sorted(set(gauges[by])), dtype=object)})
    for name, metric in (("kv", KV), ("waiting", WAITING), ("running", RUNNING)):
        g = gauges[gauges["metric"] == metric]
        out = out.merge(
            g[[by, "avg", "max"]].rename(columns={"avg": f"{name}_avg", "max": f"{name}_max"}), on=by, how="left"
        )
    for name, metric in COUNTERS.items():
        c = counters[counters["metric"] == metric]
        out = out.merge(c[[by, "increase"]].rename(columns={"increase": name}), on=by, how="left")
    out["preemptions_per_s"] = out["preemptions"].fillna(0) / seconds
    out["prefix_hit_rate"] = (out["hits"] / out["queries"]).where(out["queries"] > 0)
    out["iteration_tokens_avg"] = (out["it_sum"] / out["it_n"]).where(out["it_n"] > 0)
    # the pool's gauges above are per-replica averages (every sample weighs the same); a replica
    # counts where it reported requests running
    running = gauges[gauges["metric"] == RUNNING].set_index(by)["replicas"]
    out["replicas"] = out[by].map(running).fillna(0).astype(int)
    columns = [
        by,
        "kv_avg",
        "kv_max",
        "waiting_avg",
        "waiting_max",
        "running_avg",
        "running_max",
        "preemptions_per_s",
        "prefix_hit_rate",
        "iteration_tokens_avg",
        "replicas",
    ]
    out = out[columns].sort_values(by, ignore_index=True)
    out.attrs.update(plan=gauges.attrs.get("plan"), unapplied=filters.unapplied("samples") if filters else [])
    return out


def _pools(gauges: pd.DataFrame, counters: pd.DataFrame, models: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-replica reads summed to model pools: the same numbers as reading by model (a pool's
    gauge averages weigh every sample alike, its counters add up), without reading again."""
    g = gauges.assign(model=gauges["replica"].map(models).fillna(""), weighted=gauges["avg"] * gauges["samples"])
    pooled = g.groupby(["metric", "model"], as_index=False).agg(
        min=("min", "min"),
        max=("max", "max"),
        weighted=("weighted", "sum"),
        samples=("samples", "sum"),
        last=("last", "mean"),
        replicas=("replica", "nunique"),
    )
    pooled["avg"] = (pooled["weighted"] / pooled["samples"]).where(pooled["samples"] > 0)
    pooled.attrs.update(gauges.attrs)
    c = counters.assign(model=counters["replica"].map(models).fillna(""))
    summed = c.groupby(["metric", "model"], as_index=False).agg(increase=("increase", "sum"))
    return pooled.drop(columns=["weighted"]), summed


def kv_over_time(
    client: Client,
    start: datetime,
    end: datetime,
    by: str = "replica",
    *,
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Per step and ``by``, from one query of the gauges: kv_avg, kv_max, waiting, running (per
    replica), replicas_up."""
    gauges = gauges_over_time(client, [KV, WAITING, RUNNING], start, end, by, step=step, **scope)
    keys = ["ts", by]
    out = gauges[keys].drop_duplicates().sort_values(keys, ignore_index=True)
    for metric, columns in (
        (KV, {"avg": "kv_avg", "max": "kv_max"}),
        (WAITING, {"avg": "waiting"}),
        (RUNNING, {"avg": "running", "replicas": "replicas_up"}),
    ):
        g = gauges[gauges["metric"] == metric]
        out = out.merge(g[keys + list(columns)].rename(columns=columns), on=keys, how="left")
    out["replicas_up"] = out["replicas_up"].fillna(0).astype(int)
    out.attrs.update(step=gauges.attrs["step"], plan=gauges.attrs["plan"], unapplied=gauges.attrs["unapplied"])
    return out


def saturation_over_time(
    client: Client,
    start: datetime,
    end: datetime,
    by: str = "replica",
    *,
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Per step and ``by``: ``kv_over_time``'s columns, preemptions_per_s, prefix_hit_rate
    (two queries)."""
    out = kv_over_time(client, start, end, by, step=step, **scope)
    attrs = dict(out.attrs)
    step = attrs["step"]
    keys = ["ts", by]
    rates = counter_rates_over_time(
        client, [PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES], start, end, by, step=step, **scope
    )
    for name, metric in (("preemptions", PREEMPTIONS), ("hits", PREFIX_HITS), ("queries", PREFIX_QUERIES)):
        r = rates[rates["metric"] == metric]
        out = out.merge(r[keys + ["increase"]].rename(columns={"increase": name}), on=keys, how="left")
    out["preemptions_per_s"] = out["preemptions"].fillna(0) / step
    out["prefix_hit_rate"] = (out["hits"] / out["queries"]).where(out["queries"] > 0)
    out = out.drop(columns=["preemptions", "hits", "queries"]).sort_values(keys, ignore_index=True)
    out.attrs.update(attrs)
    return out


def headroom(
    client: Client, start: datetime, end: datetime, *, targets: Targets | None = None, **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Per model pool: how close it runs to saturation now (the window's last quarter)."""
    targets = targets or Targets()
    filters = scope.get("filters")
    # the recent quarter is read from the whole window's tier (on its own it would often get a
    # finer one: 30 days read from the 6-hour rollup, their last 7.5 from the hourly)
    kw = (
        scope if scope.get("tier") is not None else rescope(scope, tier=plan_scope(client, start, end, scope).tier.name)
    )
    recent = end - (end - start) / 4
    seconds = (end - recent).total_seconds()
    # read per replica once: the pools' figures are their sums (see _pools)
    gauges = gauge_summaries(client, [KV, WAITING, RUNNING], recent, end, "replica", **kw)
    counters = counter_increases(client, list(COUNTERS.values()), recent, end, "replica", **kw)
    pools = replica_models(client)
    sat = _indicators(*_pools(gauges, counters, pools), "model", seconds, filters)
    each = _indicators(gauges, counters, "replica", seconds, filters)
    before = histogram_quantile(client, TTFT, 0.99, start, recent, "model", **kw).rename(
        columns={"quantile": "ttft_p99_before"}
    )
    after = histogram_quantile(client, TTFT, 0.99, recent, end, "model", **kw).rename(
        columns={"quantile": "ttft_p99_recent"}
    )
    out = sat[["model", "replicas", "kv_avg", "kv_max", "waiting_avg", "preemptions_per_s"]].rename(
        columns={"kv_avg": "kv_recent", "kv_max": "kv_max_recent", "waiting_avg": "waiting_per_replica"}
    )
    out = out.merge(after[["model", "ttft_p99_recent"]], on="model", how="left")
    out = out.merge(before[["model", "ttft_p99_before"]], on="model", how="left")
    out["headroom"] = 1 - out["kv_recent"] / targets.kv_target
    # each replica on its own: a pool's average hides the one at 100 % with a queue, or wedged
    each["model"] = [pools.get(str(r), "") for r in each["replica"]]
    hot = each[(each["kv_avg"] >= targets.replica_kv) & (each["waiting_avg"] >= targets.replica_waiting)]
    wedged = stalls(client, recent, end, min_seconds=targets.stall_s, **kw)
    out["saturated"] = [sorted(hot.loc[hot["model"] == m, "replica"].astype(str)) for m in out["model"]]
    out["stalled"] = [sorted(wedged.loc[wedged["model"] == m, "replica"].astype(str)) for m in out["model"]]
    out.attrs.update(window=(recent, end), targets=targets, stalls=wedged)
    return out


def _names(replicas: list[str], most: int = 5) -> str:
    shown = ", ".join(replicas[:most])
    return shown + (f" and {len(replicas) - most} more" if len(replicas) > most else "")


def _recommend(row: pd.Series, t: Targets) -> tuple[int, list[str]]:
    n = int(row["replicas"])
    kv, waiting = float(row["kv_recent"]), float(row["waiting_per_replica"])
    before, recent = row["ttft_p99_before"], row["ttft_p99_recent"]
    reasons, want = [], n
    stalled = list(row.get("stalled") or [])
    saturated = [r for r in (row.get("saturated") or []) if r not in stalled]
    if stalled:
        they = "it holds" if len(stalled) == 1 else "they hold"
        reasons.append(
            f"{len(stalled)} of {n} replicas stalled ({_names(stalled)}): {they} requests and "
            f"generate{'s' if len(stalled) == 1 else ''} "
            f"no token; restart {'it' if len(stalled) == 1 else 'them'} (keep the logs), the pool serves on the others"
        )
    if saturated:
        reasons.append(
            f"{len(saturated)} of {n} replicas at >= {t.replica_kv:.0%} KV cache with requests waiting "
            f"({_names(saturated)}) while the pool averages {kv:.0%}: their requests queue; check how the "
            "gateway spreads long prompts"
        )
    if kv > t.kv_target:
        need = math.ceil(n * kv / t.kv_target)
        reasons.append(
            f"KV cache {kv:.0%} used on average (target {t.kv_target:.0%}): {need} replicas bring it to the target"
        )
        want = max(want, need)
    if waiting > t.waiting_per_replica:
        reasons.append(f"{waiting:.1f} requests waiting per replica: the pool is queueing")
        want = max(want, n + 1)
    if row["preemptions_per_s"] > 0:
        reasons.append(
            f"{row['preemptions_per_s'] * 60:.1f} preemptions per minute: requests are evicted for lack of KV blocks"
        )
        if kv > 0.9 * t.kv_target:
            want = max(want, n + 1)
    if pd.notna(before) and pd.notna(recent) and before > 0 and recent / before >= t.ttft_growth:
        reasons.append(f"p99 TTFT rose from {before:.2f}s to {recent:.2f}s")
        if want == n and (kv > 0.75 * t.kv_target or waiting > 0):
            want = n + 1
    if want == n and not (stalled or saturated):
        if n > 1 and kv < t.kv_scale_in and waiting < 0.1 and not row["preemptions_per_s"]:
            scaled_kv = kv * n / (n - 1)
            reasons.append(
                f"KV cache only {kv:.0%} used and no queue: {n - 1} replica{'s' if n > 2 else ''} would run at "
                f"about {scaled_kv:.0%}"
            )
            want = n - 1
        else:
            reasons.append(
                f"no action: KV cache {kv:.0%} (target {t.kv_target:.0%}), "
                f"{waiting:.1f} waiting per replica" + (f", p99 TTFT {recent:.2f}s" if pd.notna(recent) else "")
            )
    return want, reasons


def scale_out(
    client: Client, start: datetime, end: datetime, *, targets: Targets | None = None, **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Per model pool: replicas now, replicas recommended, and why (leading indicators first:
    KV usage, queue depth, preemptions, the TTFT trend)."""
    targets = targets or Targets()
    room = headroom(client, start, end, targets=targets, **scope)
    return recommend(room, targets)


def recommend(room: pd.DataFrame, targets: Targets | None = None) -> pd.DataFrame:
    """``scale_out``'s answer from a ``headroom`` frame already read (no query)."""
    targets = targets or Targets()
    rows = []
    for _, row in room.iterrows():
        want, reasons = _recommend(row, targets)
        attention = sorted({*(row.get("stalled") or []), *(row.get("saturated") or [])})
        rows.append(
            {
                "model": row["model"],
                "replicas": int(row["replicas"]),
                "recommended": want,
                "change": want - int(row["replicas"]),
                "kv_recent": row["kv_recent"],
                "waiting_per_replica": row["waiting_per_replica"],
                "ttft_p99_recent": row["ttft_p99_recent"],
                "reasons": reasons,
                "attention": attention,
                "stalled": list(row.get("stalled") or []),
            }
        )
    out = pd.DataFrame(
        rows,
        columns=[
            "model",
            "replicas",
            "recommended",
            "change",
            "kv_recent",
            "waiting_per_replica",
            "ttft_p99_recent",
            "reasons",
            "attention",
            "stalled",
        ],
    )
    out.attrs.update(room.attrs)
    return out
