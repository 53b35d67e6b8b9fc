"""LoRA adapters: the engines' adapter states and the request log -> residency, waiting for a
slot, and each adapter's traffic and latency.

In:  a client, a window ``[start, end)``, the usual scope (filters by replica and model apply to
     the engines' states; by model, tenant, route to the request log).
Out: - ``states``: ``[ts, replica, max_lora, running, waiting, blocked]``, one row per adapter
       state a replica's engine was in between a scrape and the one before it (tuples of adapter
       names; ``blocked``: waiting adapters not running while every slot was taken);
     - ``residency``: ``[replica, adapter, resident_share, waiting_share, blocked_share,
       intervals]`` over the scrape intervals in which the replica's engine stepped;
     - ``blocked_over_time``: ``[ts, blocked, waiting]`` per step over the fleet: adapters waiting
       for a slot (and waiting at all), the mean over the step's scrapes, summed over replicas
       (``.attrs``: ``blocked_adapters``, each blocked adapter's scrape intervals, and ``max_lora``);
     - ``deferred_over_time`` / ``deferred``: requests the engines hold back for want of an adapter
       slot (vLLM's ``vllm:num_requests_waiting_by_reason{reason="deferred"}``: the LoRA budget,
       or a KV transfer), per step summed over the fleet / per replica over the window; on vLLM
       0.32 this is what shows slot contention: a waiting request reaches ``lora_requests_info``
       only once it is scheduled (its queued and scheduled events come together), so there an
       adapter is hardly ever listed as waiting behind another one;
     - ``adapter_names``: the adapters the engines reported in the window;
     - ``adapter_pools``: each adapter the engines ever reported -> the model pool (base model)
       of the replicas serving it (what its requests are costed against);
     - ``engine_filters`` / ``request_filters``: a model filter as the engines' series see it
       (an adapter's name becomes its base model: the engines label everything with the base)
       and as the request log sees it (a base model brings its adapters' requests along);
     - ``adapter_traffic``: ``[model, requests, prompt_tokens, completion_tokens, ttft_p50,
       ttft_p99, itl_p99, e2e_p99]`` per adapter, from the request log (an adapter is asked for
       by its name, so it is the request's ``model``).

How the states are read: vLLM's ``vllm:lora_requests_info`` is a gauge whose labels are a state
(``running_lora_adapters``, ``waiting_lora_adapters``: comma-joined names; ``max_lora``) and whose
value is the time the engine last stepped in that state; every state seen stays in the
exposition. A state happened between two scrapes when its series' value grew (or the series
appeared after the replica's first scrape in the read: an engine shows no state before its first
step, so a replica's first scrape is its first of ``vllm:num_requests_running`` too) since the
scrape before; an idle engine's values stand still, so its last state is not counted again.
The raw samples are read (kept ``samples_days``); a series' value before the window is looked up
``LOOKBACK`` earlier.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
from typing_extensions import Unpack

from analytics.counters import present, series_latest
from analytics.filters import Filters
from analytics.frames import query_df
from analytics.requests import log_source, request_quantiles, request_totals
from analytics.tiers import param_time
from analytics.vllm import LORA_INFO, REQUESTS_RUNNING, REQUESTS_WAITING_BY_REASON
from analytics.window import Scope, rescope
from storage.clickhouse import Client

__all__ = [
    "LOOKBACK",
    "adapter_names",
    "adapter_pools",
    "adapter_traffic",
    "blocked_over_time",
    "deferred",
    "deferred_over_time",
    "engine_filters",
    "request_filters",
    "residency",
    "states",
]

LOOKBACK = timedelta(minutes=10)
STATE_COLUMNS = ["ts", "replica", "max_lora", "running", "waiting", "blocked"]


def engine_filters(filters: Filters | None, pools: dict[str, str]) -> Filters | None:
    """``filters`` for the engines' series: adapter names in its model filter become their base
    model (the engines' series carry the base model's name)."""
    if not filters or not filters.model or not any(m in pools for m in filters.model):
        return filters
    models = sorted({pools.get(m, m) for m in filters.model})
    return Filters(model=models, replica=filters.replica, tenant=filters.tenant, route=filters.route)


def request_filters(filters: Filters | None, pools: dict[str, str]) -> Filters | None:
    """``filters`` for the request log: a base model in its model filter brings the requests for
    its adapters along (they ran on its replicas)."""
    if not filters or not filters.model:
        return filters
    models = sorted(set(filters.model) | {a for a, base in pools.items() if base in filters.model})
    return Filters(model=models, replica=filters.replica, tenant=filters.tenant, route=filters.route)


def _names(value: str) -> tuple[str, ...]:
    return tuple(sorted(n for n in value.split(",") if n))


def states(client: Client, start: datetime, end: datetime, **scope: Unpack[Scope]) -> pd.DataFrame:
    """The adapter states each replica's engine was in, scrape by scrape (module docstring)."""
    filters = scope.get("filters")
    if not present(client, LORA_INFO):
        return pd.DataFrame(columns=STATE_COLUMNS)  # no replica ever served an adapter
    pools = adapter_pools(client) if filters and filters.model else {}
    asked = {m for m in (filters.model if filters else ()) if m in pools}  # adapters asked for by name
    series_filters = engine_filters(filters, pools)
    where, params = series_filters.series("") if series_filters else ("", {})
    params = dict(
        params,
        metrics=[LORA_INFO, REQUESTS_RUNNING],
        lora=LORA_INFO,
        a=param_time(start - LOOKBACK),
        start=param_time(start),
        end=param_time(end),
    )
    # the states that grew since the scrape before, found in the store (a series first seen after its
    # replica's first scrape in the read is new); only those rows come back. The replica's first scrape
    # is its first of either metric: an engine exposes no state before its first step, so a state that
    # appeared and stood still within its first few seconds of traffic is first seen together with the
    # first state series of all, and must still count when the engine was scraped before that
    sql = f"""
        SELECT ts, replica, running, waiting, max_lora FROM (
            SELECT v.ts AS ts, v.metric AS metric, v.value AS value, s.replica AS replica,
                   s.labels['running_lora_adapters'] AS running, s.labels['waiting_lora_adapters'] AS waiting,
                   toUInt32OrZero(s.labels['max_lora']) AS max_lora,
                   lagInFrame(toNullable(v.value), 1, NULL) OVER (
                       PARTITION BY v.fingerprint ORDER BY v.ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS prev,
                   min(v.ts) OVER (PARTITION BY s.replica) AS first_scrape
            FROM samples AS v
            INNER JOIN ({series_latest("metrics", many=True)}) AS s ON s.fingerprint = v.fingerprint
            WHERE v.metric IN {{metrics:Array(String)}} AND v.ts >= {{a:DateTime64(3)}} AND v.ts < {{end:DateTime64(3)}}
                  {"AND " + where if where else ""}
        )
        WHERE metric = {{lora:String}} AND ts >= {{start:DateTime64(3)}}
              AND (value > prev OR (prev IS NULL AND ts > first_scrape))
        ORDER BY ts, replica"""
    df = query_df(client, sql, parameters=params)
    if df.empty:
        return pd.DataFrame(columns=STATE_COLUMNS)
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    df["running"] = df["running"].map(_names)
    df["waiting"] = df["waiting"].map(_names)
    df["blocked"] = [
        tuple(a for a in w if a not in r) if len(r) >= m > 0 else ()
        for r, w, m in zip(df["running"], df["waiting"], df["max_lora"], strict=True)
    ]
    if asked:  # only the adapters asked for (the slots they waited for were taken by any adapter)
        for column in ("running", "waiting", "blocked"):
            df[column] = df[column].map(lambda names: tuple(n for n in names if n in asked))
    return df[STATE_COLUMNS].sort_values(["ts", "replica"], ignore_index=True)


def residency(client: Client, start: datetime, end: datetime, **scope: Unpack[Scope]) -> pd.DataFrame:
    """Per replica and adapter: the share of the replica's active scrape intervals the adapter
    ran in (resident), had requests waiting, and waited for a slot (blocked)."""
    st = states(client, start, end, **scope)
    columns = ["replica", "adapter", "resident_share", "waiting_share", "blocked_share", "intervals"]
    if st.empty:
        return pd.DataFrame(columns=columns)
    rows: list[dict[str, object]] = []
    for replica, frame in st.groupby("replica"):
        per = frame.groupby("ts").agg(
            running=("running", lambda s: set().union(*s)),
            waiting=("waiting", lambda s: set().union(*s)),
            blocked=("blocked", lambda s: set().union(*s)),
        )
        names = sorted(set().union(*per["running"], *per["waiting"]))
        n = len(per)
        for name in names:
            rows.append(
                {
                    "replica": replica,
                    "adapter": name,
                    "resident_share": sum(name in r for r in per["running"]) / n,
                    "waiting_share": sum(name in w for w in per["waiting"]) / n,
                    "blocked_share": sum(name in b for b in per["blocked"]) / n,
                    "intervals": n,
                }
            )
    return pd.DataFrame(rows, columns=columns)


def blocked_over_time(
    client: Client, start: datetime, end: datetime, step: int, **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Per step over the fleet: adapters waiting for a slot and adapters waiting at all (each
    scrape's distinct adapters per replica, averaged over the step's scrapes, summed over replicas)."""
    st = states(client, start, end, **scope)
    if st.empty:
        return pd.DataFrame(columns=["ts", "blocked", "waiting"])
    per = st.groupby(["ts", "replica"]).agg(
        blocked=("blocked", lambda s: len(set().union(*s))), waiting=("waiting", lambda s: len(set().union(*s)))
    )
    per = per.reset_index()
    per["step"] = per["ts"].dt.floor(f"{int(step)}s")
    scrapes = per.groupby(["step", "replica"]).size()
    sums = per.groupby(["step", "replica"])[["blocked", "waiting"]].sum()
    # intervals in which the engine did not step count as nothing waiting: divide by the step's scrapes
    intervals = max(1, round(step / _interval(st)))
    out = (sums.div(pd.Series(intervals, index=scrapes.index), axis=0)).groupby("step").sum()
    out = out.reset_index().rename(columns={"step": "ts"})
    # which adapters waited for a slot, and in how many scrape intervals (for the words)
    counts: dict[str, int] = {}
    for _key, frame in st.groupby(["ts", "replica"]):
        for name in set().union(*frame["blocked"]):
            counts[name] = counts.get(name, 0) + 1
    out.attrs["blocked_adapters"] = counts
    out.attrs["max_lora"] = sorted({int(m) for m in st["max_lora"]})
    return out


def _interval(st: pd.DataFrame) -> float:
    """The scrape interval, seconds: the most common gap between a replica's scrapes seen."""
    gaps = st.groupby("replica")["ts"].diff().dt.total_seconds()
    gaps = gaps[gaps > 0]
    return float(gaps.mode().iloc[0]) if len(gaps) else 5.0


def _deferred_rows(client: Client, start: datetime, end: datetime, scope: Scope) -> pd.DataFrame:
    filters = scope.get("filters")
    if filters and filters.model:
        filters = engine_filters(filters, adapter_pools(client))
    where, params = filters.series("s.") if filters else ("", {})
    params = dict(params, metric=REQUESTS_WAITING_BY_REASON, start=param_time(start), end=param_time(end))
    sql = (
        f"SELECT v.ts AS ts, s.replica AS replica, v.value AS value FROM samples AS v "
        f"INNER JOIN ({series_latest('metric')}) AS s ON s.fingerprint = v.fingerprint "
        "WHERE v.metric = {metric:String} AND s.labels['reason'] = 'deferred' "
        "AND v.ts >= {start:DateTime64(3)} AND v.ts < {end:DateTime64(3)}" + (f" AND {where}" if where else "")
    )
    df = query_df(client, sql, parameters=params)
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df


def deferred_over_time(
    client: Client, start: datetime, end: datetime, step: int, **scope: Unpack[Scope]
) -> pd.DataFrame:
    """``[ts, deferred]``: requests held back for an adapter slot per step, each replica's mean over
    the step summed over the fleet (raw samples)."""
    df = _deferred_rows(client, start, end, scope)
    if df.empty:
        return pd.DataFrame(columns=["ts", "deferred"])
    df["step"] = df["ts"].dt.floor(f"{int(step)}s")
    per = df.groupby(["step", "replica"])["value"].mean().groupby("step").sum()
    return per.rename("deferred").reset_index().rename(columns={"step": "ts"})


def deferred(client: Client, start: datetime, end: datetime, **scope: Unpack[Scope]) -> pd.DataFrame:
    """``[replica, deferred_avg, deferred_max]``: requests held back for an adapter slot per replica."""
    df = _deferred_rows(client, start, end, scope)
    if df.empty:
        return pd.DataFrame(columns=["replica", "deferred_avg", "deferred_max"])
    out: pd.DataFrame = df.groupby("replica", as_index=False).agg(
        deferred_avg=("value", "mean"), deferred_max=("value", "max")
    )
    return out


def adapter_names(client: Client, start: datetime, end: datetime, **scope: Unpack[Scope]) -> list[str]:
    """The adapters the engines reported running or waiting in the window, sorted."""
    st = states(client, start, end, **scope)
    return sorted(set().union(*st["running"], *st["waiting"])) if len(st) else []


def adapter_pools(client: Client) -> dict[str, str]:
    """Adapter -> the base model of the replicas that reported it (from the series' labels, as
    ``analytics.stalls.replica_models`` reads a replica's model)."""
    rows = client.query(
        "SELECT argMax(model, last_seen) AS model, argMax(labels['running_lora_adapters'], last_seen), "
        "argMax(labels['waiting_lora_adapters'], last_seen) FROM series WHERE metric = {m:String} GROUP BY fingerprint",
        parameters={"m": LORA_INFO},
    ).result_rows
    pools: dict[str, str] = {}
    for model, running, waiting in rows:
        for name in _names(str(running)) + _names(str(waiting)):
            pools.setdefault(name, str(model))
    return pools


def adapter_traffic(
    client: Client, start: datetime, end: datetime, adapters: list[str], **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Each adapter's requests, tokens and latency quantiles from the request log."""
    columns = [
        "model",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "ttft_p50",
        "ttft_p99",
        "itl_p99",
        "e2e_p99",
    ]
    if not adapters:
        return pd.DataFrame(columns=columns)
    # one request log (the gateway's, else the engines' spans), never their sum; a base model asked for
    # brings its adapters along
    filters = request_filters(scope.get("filters"), adapter_pools(client))
    kw = rescope(scope, filters=filters)
    source = log_source(client, start, end, filters)
    totals = request_totals(client, start, end, ("model",), source=source, **kw)
    quantiles = request_quantiles(
        client, ("ttft", "itl", "e2e"), (0.5, 0.99), start, end, ("model",), source=source, **kw
    )
    df = totals.merge(quantiles, on="model", how="left")
    df = df[df["model"].isin(adapters)].rename(
        columns={"ttft_q0.5": "ttft_p50", "ttft_q0.99": "ttft_p99", "itl_q0.99": "itl_p99", "e2e_q0.99": "e2e_p99"}
    )
    return df[columns].sort_values("model", ignore_index=True)
