"""Every read ``explain`` makes of the store: the request log and the engines' gauges and counters.

In:  a client, windows, the request-log source and filters.
Out: frames for ``analytics.explain.scoring`` (the quantile per step, the fleet's capacity
     signals per step, the mix per step, the rows near the break, the BubbleUp dimensions, the
     prompt-length strata, the autoscaler's scale-outs in the window, the gateway's shedding per
     step and model) and a few numbers (rows, the
     baseline's median prompt and quantile).
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd

from analytics.adapters import adapter_pools, blocked_over_time, deferred_over_time, engine_filters
from analytics.admission import admission
from analytics.explain.cost_queries import scaling
from analytics.explain.scoring import split_at
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.requests import CONTEXT_BUCKET
from analytics.saturation import KV, RUNNING, WAITING
from analytics.stalls import stalled_steps
from analytics.tiers import param_time
from analytics.timeseries import counter_rates_over_time, gauges_over_time, histogram_quantiles_over_time
from analytics.vllm import LATENCIES, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, SPEC_ACCEPTED, SPEC_DRAFT_TOKENS
from common.timeutil import as_utc
from storage.clickhouse import Client

__all__ = [
    "baseline_levels",
    "capacity",
    "count_span",
    "dimensions",
    "metric_series",
    "mix",
    "requests_where",
    "rows_near",
    "scale_outs",
    "shedding",
    "split_in_rows",
    "step_grid",
    "strata",
]


def requests_where(
    start: datetime, end: datetime, source: str | None, filters: Filters | None
) -> tuple[str, dict[str, object]]:
    condition, params = request_rows(source, filters)
    params.update(start=param_time(start), end=param_time(end))
    return f"ts >= {{start:DateTime64(3)}} AND ts < {{end:DateTime64(3)}} AND {condition}", params


def metric_series(
    client: Client,
    latency: str,
    q: float,
    start: datetime,
    end: datetime,
    step: int,
    source: str | None,
    filters: Filters | None,
) -> pd.DataFrame:
    column = LATENCIES[latency].column
    if source is not None:
        where, params = requests_where(start, end, source, filters)
        sql = f"""
            SELECT toDateTime64(toStartOfInterval(ts, INTERVAL {step} SECOND), 3, 'UTC') AS step_ts,
                   quantileExactWeighted({q!r})({column}, toUInt64(greatest(1, round(weight)))) AS value, count() AS n
            FROM requests WHERE {where} AND {column} > 0 GROUP BY step_ts ORDER BY step_ts"""
        df = query_df(client, sql, parameters=params).rename(columns={"step_ts": "ts"})
    else:
        df = histogram_quantiles_over_time(
            client, LATENCIES[latency].family, [q], start, end, "fleet", step=step, filters=filters
        )
        df = df.rename(columns={"count": "n"})[["ts", "value", "n"]]
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df[df["n"] > 0].reset_index(drop=True)


def step_grid(start: datetime, end: datetime, step: int) -> pd.DatetimeIndex:
    first = pd.Timestamp(start).floor(f"{step}s")
    return pd.date_range(first, pd.Timestamp(end), freq=f"{step}s", inclusive="left", tz="UTC")


def capacity(client: Client, start: datetime, end: datetime, step: int, filters: Filters | None) -> pd.DataFrame:
    if filters and filters.model:  # the engines label an adapter's work with its base model
        filters = engine_filters(filters, adapter_pools(client))
    grid = pd.DataFrame(index=step_grid(start, end, step))
    # one query for the gauges over the fleet, one for the counters
    gauges = gauges_over_time(client, [KV, RUNNING, WAITING], start, end, "fleet", step=step, filters=filters)
    gauges = gauges.set_index("ts")
    kv, running, waiting = (gauges[gauges["metric"] == m] for m in (KV, RUNNING, WAITING))
    grid = grid.join(kv["avg"].rename("kv_avg")).join(kv["max"].rename("kv_peak"))
    grid = grid.join((waiting["avg"] * waiting["series"]).rename("waiting"))  # summed over the fleet
    grid = grid.join(running["replicas"].rename("replicas_up"))
    counters = {
        "preemptions": PREEMPTIONS,
        "hits": PREFIX_HITS,
        "queries": PREFIX_QUERIES,
        "draft_tokens": SPEC_DRAFT_TOKENS,
        "accepted": SPEC_ACCEPTED,
    }
    rates = counter_rates_over_time(client, list(counters.values()), start, end, "fleet", step=step, filters=filters)
    for name, metric in counters.items():
        r = rates[rates["metric"] == metric]
        grid = grid.join(r.set_index("ts")["increase"].rename(name))
    grid["prefix_hit_rate"] = grid["hits"] / grid["queries"].where(grid["queries"] > 0)
    # speculative decoding: accepted / proposed draft tokens (NaN where no replica drafts)
    grid["draft_acceptance"] = grid["accepted"] / grid["draft_tokens"].where(grid["draft_tokens"] > 0)
    # LoRA: adapters waiting for a slot (none where no replica serves adapters)
    blocked = blocked_over_time(client, start, end, step, filters=filters)
    if len(blocked):
        grid = grid.join(blocked.set_index("ts")[["blocked"]].rename(columns={"blocked": "adapters_blocked"}))
        grid["adapters_blocked"] = grid["adapters_blocked"].fillna(0.0)
    # requests the engines hold back for an adapter slot (vLLM's waiting reason "deferred"): what real
    # engines report of slot contention
    held = deferred_over_time(client, start, end, step, filters=filters)
    if len(held) and float(held["deferred"].max()) > 0:
        grid = grid.join(held.set_index("ts")[["deferred"]].rename(columns={"deferred": "adapters_deferred"}))
        grid["adapters_deferred"] = grid["adapters_deferred"].fillna(0.0)

    # replicas that held requests and generated no token in the step (a wedged engine still scrapes as up)
    wedged = stalled_steps(client, start, end, step=step, filters=filters)
    wedged = wedged[wedged["stalled"]]
    grid = grid.join(wedged.groupby("ts")["replica"].nunique().rename("stalled"))
    grid["stalled"] = grid["stalled"].fillna(0)
    # (first stalled step, stalled steps) per replica, for the evidence's words (plain values: pandas
    # compares attrs when frames are joined)
    grid.attrs["stalled_replicas"] = {str(r): (f["ts"].min(), len(f)) for r, f in wedged.groupby("replica")}
    grid.attrs["blocked_adapters"] = dict(blocked.attrs.get("blocked_adapters") or {})  # each one's intervals
    grid.attrs["max_lora"] = list(blocked.attrs.get("max_lora") or [])
    grid.index.name = "ts"
    return grid


def mix(
    client: Client, start: datetime, end: datetime, step: int, source: str, filters: Filters | None, long_tokens: float
) -> pd.DataFrame:
    """Per step and dimension value: weighted requests (dimension ``long`` splits by prompt length)."""
    where, params = requests_where(start, end, source, filters)
    params["long_tokens"] = float(long_tokens)
    sql = f"""
        SELECT toDateTime64(toStartOfInterval(ts, INTERVAL {step} SECOND), 3, 'UTC') AS step_ts,
               kv.1 AS dimension, kv.2 AS value, sum(weight) AS requests
        FROM requests
        ARRAY JOIN [('tenant', tenant), ('model', model), ('route', route), ('context_bucket', {CONTEXT_BUCKET}),
                    ('long', if(prompt_tokens > {{long_tokens:Float64}}, 'long', 'other'))] AS kv
        WHERE {where}
        GROUP BY step_ts, dimension, value"""
    df = query_df(client, sql, parameters=params).rename(columns={"step_ts": "ts"})
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df


def split_in_rows(
    client: Client,
    where: str,
    params: dict[str, object],
    expr: str,
    a0: pd.Timestamp,
    a1: pd.Timestamp,
    rise: bool = True,
) -> pd.Timestamp | None:
    """Where ``expr`` (per request, in arrival order) shifts within ``[a0, a1)``: the best single
    split of the rows' ranks (a rise when ``rise``)."""
    params = dict(
        params, a0=param_time(pd.Timestamp(a0).to_pydatetime()), a1=param_time(pd.Timestamp(a1).to_pydatetime())
    )
    df = query_df(
        client,
        f"SELECT ts, toFloat64({expr}) AS x FROM requests WHERE {where} AND ts >= {{a0:DateTime64(3)}} "
        f"AND ts < {{a1:DateTime64(3)}} ORDER BY ts",
        parameters=params,
    )
    return split_at(df["ts"], df["x"], rise)


def rows_near(
    client: Client, where: str, params: dict[str, object], a0: pd.Timestamp, a1: pd.Timestamp
) -> pd.DataFrame:
    """The requests in ``[a0, a1)`` in arrival order, with what the mix signals split on: one read
    for every dimension (and both passes of the evidence)."""
    params = dict(
        params, a0=param_time(pd.Timestamp(a0).to_pydatetime()), a1=param_time(pd.Timestamp(a1).to_pydatetime())
    )
    return query_df(
        client,
        f"SELECT ts, tenant, model, route, {CONTEXT_BUCKET} AS context_bucket, toFloat64(prompt_tokens) AS "
        f"prompt_tokens "
        f"FROM requests WHERE {where} AND ts >= {{a0:DateTime64(3)}} AND ts < {{a1:DateTime64(3)}} ORDER BY ts",
        parameters=params,
    )


def dimensions(
    client: Client,
    where: str,
    params: dict[str, object],
    periods: tuple[pd.Timestamp, pd.Timestamp],
    column: str,
    slow: float,
    long_tokens: float,
) -> pd.DataFrame:
    """``periods``: (baseline end, after start) — the baseline ends where the regression began."""
    params = dict(
        params,
        bend=param_time(pd.Timestamp(periods[0]).to_pydatetime()),
        brk=param_time(pd.Timestamp(periods[1]).to_pydatetime()),
        slow=float(slow),
        long_tokens=float(long_tokens),
    )
    sql = f"""
        SELECT kv.1 AS dimension, kv.2 AS value,
               sumIf(weight, ts < {{bend:DateTime64(3)}}) AS baseline,
               sumIf(weight, ts >= {{brk:DateTime64(3)}}) AS after,
               sumIf(weight, ts >= {{brk:DateTime64(3)}} AND {column} > {{slow:Float64}}) AS slow
        FROM requests
        ARRAY JOIN [('tenant', tenant), ('model', model), ('route', route), ('context_bucket', {CONTEXT_BUCKET}),
                    ('replica', replica), ('long', if(prompt_tokens > {{long_tokens:Float64}}, 'long', 'other'))] AS kv
        WHERE {where}
        GROUP BY dimension, value"""
    df = query_df(client, sql, parameters=params)
    for col in ("baseline", "after", "slow"):
        df[f"{col}_share"] = df[col] / df.groupby("dimension")[col].transform("sum").replace(0, np.nan)
    df["lift"] = df["slow_share"] - df["baseline_share"]
    return df.sort_values(["dimension", "lift"], ascending=[True, False], ignore_index=True)


def strata(
    client: Client,
    where: str,
    params: dict[str, object],
    periods: tuple[pd.Timestamp, pd.Timestamp],
    column: str,
    q: float,
    cuts: tuple[float, float],
) -> pd.DataFrame:
    params = dict(
        params,
        bend=param_time(pd.Timestamp(periods[0]).to_pydatetime()),
        brk=param_time(pd.Timestamp(periods[1]).to_pydatetime()),
        c1=float(cuts[0]),
        c2=float(cuts[1]),
    )
    band = "multiIf(prompt_tokens <= {c1:Float64}, 'short', prompt_tokens <= {c2:Float64}, 'medium', 'long')"
    sql = f"""
        SELECT {band} AS band, multiIf(ts < {{bend:DateTime64(3)}}, 'before', ts >= {{brk:DateTime64(3)}}, 'after',
        '') AS period,
               sum(weight) AS requests,
               quantileExactWeightedIf({q!r})({column}, toUInt64(greatest(1, round(weight))), {column} > 0) AS value
        FROM requests WHERE {where} GROUP BY band, period HAVING period != ''"""
    df = query_df(client, sql, parameters=params)
    wide = df.pivot_table(index="band", columns="period", values=["requests", "value"], aggfunc="first")
    out = pd.DataFrame(index=["short", "medium", "long"])
    for period in ("before", "after"):
        req = wide[("requests", period)] if ("requests", period) in wide.columns else pd.Series(dtype=float)
        out[f"share_{period}"] = (req / req.sum()).reindex(out.index)
        out[f"q_{period}"] = (
            wide[("value", period)] if ("value", period) in wide.columns else pd.Series(dtype=float)
        ).reindex(out.index)
    out["slowdown"] = out["q_after"] / out["q_before"]
    out.index.name = "band"
    out.attrs["cuts"] = cuts
    return out.reset_index()


def count_span(client: Client, where: str, params: dict[str, object]) -> tuple[int, datetime | None, datetime | None]:
    """How many rows match ``where``, and the first and the last one's time (None without rows)."""
    row = client.query(f"SELECT count(), min(ts), max(ts) FROM requests WHERE {where}", parameters=params).result_rows[
        0
    ]
    if not row[0]:
        return 0, None, None
    return int(row[0]), as_utc(row[1]), as_utc(row[2])


def baseline_levels(
    client: Client, where: str, params: dict[str, object], column: str, q: float
) -> tuple[float, float]:
    """The baseline's median prompt length (tokens) and its ``q`` quantile of ``column``."""
    row = client.query(
        f"SELECT quantileExactWeighted(0.5)(prompt_tokens, toUInt64(greatest(1, round(weight)))), "
        f"quantileExactWeightedIf({q!r})({column}, toUInt64(greatest(1, round(weight))), {column} > 0) "
        f"FROM requests WHERE {where}",
        parameters=params,
    ).result_rows[0]
    return float(row[0]), float(row[1])


def scale_outs(client: Client, start: datetime, end: datetime, filters: Filters | None) -> pd.DataFrame:
    """The scale-outs decided in ``[start, end)`` (or whose replica became ready in it), of the pools
    the filters pick (a model; every pool without one): ``cost_queries.scaling``'s rows."""
    found = scaling(client, (start, start, end))
    found = found[found["kind"] == "scale_out"]
    if filters and filters.model:
        pools = set((engine_filters(filters, adapter_pools(client)) or filters).model)
        found = found[found["pool"].isin(pools)]
    return found.reset_index(drop=True)


def shedding(client: Client, start: datetime, end: datetime, step: int, filters: Filters | None) -> pd.DataFrame:
    """The gateway's log per step and model over ``[start, end)``: ``requests``, ``shed`` and each
    shed reason (``analytics.admission``; no SLO targets needed, goodput left out)."""
    return admission(client, start, end, {}, by="model", step_s=step, filters=filters)
