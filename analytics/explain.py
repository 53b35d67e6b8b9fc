"""Explain a regression: find the break in a latency quantile, line up what moved with it, and
say what the evidence is consistent with.

In:  a client, a window ``[start, end)``, the latency and quantile to explain (default p99
     TTFT), optionally a step (default about 180 points; the quantile series widens it until a
     step holds ``MIN_PER_STEP`` requests on average), ``Filters`` and GPU prices.
Out: an ``Explanation``:
     - ``series``: ``[ts, value]`` the quantile per step (from the request log by arrival time
       when it has rows, else the engines' histograms; ``source`` says which);
     - ``breaks``: every change point found in the quantile series (``ts``, ``before``, ``after``);
       ``break_at``: the start of the regression explained, or None (then the rest is empty):
       the run of segments that stays 1.5x above the level before it (the last one seen for 3
       steps or more) with the largest excess (log level x time), so bursts inside one incident
       do not split it, its start sharpened on the requests themselves (the best split of log
       latency in arrival order near it);
       ``before`` / ``after`` are the levels before and during it;
     - ``evidence``: one row per candidate signal, ranked by ``score``: traffic mix
       (long-context share, tenant, model, route decisions, context length) and capacity
       (KV-cache saturation with its queue and preemptions, stalled replicas, prefix-cache hit
       rate, replicas up, request rate): ``before`` / ``after`` (in words), ``moved_at`` (its own change point
       near the break), ``lead_s`` (seconds it moved before the break; negative: after) and
       ``detail``; ties (scores within 0.02) go to the signal nearer a decision (``PRIORITY``:
       tenant, route, prompt length, model, then capacity); ``onset``: when the regression
       began, the earliest ``moved_at`` of the leading evidence (the top two rows, where they
       moved at or before the break), else the break;
     - ``dimensions``: BubbleUp-style comparison of the slow requests after the break (slower
       than the baseline's quantile) with all baseline requests, value by value;
     - ``strata``: per prompt-length band (short up to the baseline's median prompt, long above
       ``LONG_FACTOR`` times it, medium between; "long-context" means the same) the share of
       requests and the quantile before and after: flat short requests mean "the mix got
       heavier", slower short requests mean "everyone got slower" (contention);
     - ``cost``: cost per 1M tokens per model before and after (when prices are given;
       ``cost_around`` answers it later for an explanation made without them); ``periods``:
       the baseline's start, the break and the regression's end;
     - ``capacity``: the fleet's capacity signals per step over the window (index ``ts``:
       ``kv_avg``, ``kv_peak``, ``waiting``, ``replicas_up``, ``preemptions``,
       ``prefix_hit_rate``, ``stalled`` (replicas holding requests without a token,
       ``analytics.stalls``); ``kv_avg`` the mean over the engines' series, ``kv_peak`` the
       fullest engine's), the capacity evidence judged on the part from the baseline's start to
       the regression's end;
     - ``sentence``: one line, phrased as "consistent with ...".
``quantile_series`` is the first, cheap part alone (``series`` and its step and source, no
break looked for): a page draws it while ``explain`` works out the rest.

Scores are on one scale: a mix signal scores the difference between its share among the slow
requests after the break and among baseline requests (BubbleUp), scaled down when its share of
all traffic moved less than 10 points (then it says where the slow requests are, not why); a
capacity signal the change in the share of steps it was "on" (KV-cache saturation: some
replica >= 90 % used, or >= 50 % with requests waiting, which is when a long prompt's blocks
no longer fit; queueing: requests waiting below that), or its relative change. A signal that
moved more than two steps after the break scores half: it followed the regression rather than
led it. Request-level evidence reads the raw request
log (kept ``requests_days``), so explain windows within it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from analytics.changepoints import best_split, change_points, episode
from analytics.cost import cost_per_token
from analytics.filters import Filters, request_rows
from analytics.frames import query_df
from analytics.vllm import LATENCIES
from analytics.requests import CONTEXT_BUCKET, log_source
from analytics.saturation import KV, PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES, RUNNING, WAITING
from analytics.stalls import stalled_steps
from analytics.tiers import param_time
from analytics.timeseries import (
    auto_step,
    counter_rates_over_time,
    gauges_over_time,
    histogram_quantiles_over_time,
)
from common.timeutil import as_utc

__all__ = ["Explanation", "cost_around", "explain", "quantile_series"]

SATURATED = 0.9  # KV-cache usage at which a replica counts as saturated
PRESSURE = 0.5  # ... or this much with requests waiting (a long prompt's blocks no longer fit)
MIN_PER_STEP = 10  # requests per step the quantile series needs on average (its step widens to get them)
MIX_CHANGE = 0.1  # a share that moved this much (10 points) or more counts in full
LONG_FACTOR = 3.0  # a "long-context" prompt: more than this many times the baseline's median prompt
# tie-break order: who sent the traffic and what the router did before what it looked like and
# what it did to the engines
PRIORITY = ("tenant mix", "route decisions", "long-context share", "context length", "model mix", "request rate",
            "stalled replicas", "KV-cache saturation", "replicas up", "prefix-cache hit rate",
            "queueing without KV saturation")
MIX_DIMENSIONS = {"tenant": "tenant mix", "model": "model mix", "route": "route decisions", "context_bucket": "context length"}


@dataclass
class Explanation:
    metric: str
    source: str
    step: int  # the step of the engine signals and of the timing (``lead_s``)
    series: pd.DataFrame
    breaks: list[dict] = field(default_factory=list)
    break_at: datetime | None = None
    onset: datetime | None = None  # when the leading evidence moved (at or before break_at)
    before: float = math.nan
    after: float = math.nan
    evidence: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EVIDENCE_COLUMNS))
    dimensions: pd.DataFrame = field(default_factory=pd.DataFrame)
    strata: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per step (index ts) over the fleet: kv_avg, kv_peak, waiting, replicas_up, preemptions, prefix_hit_rate
    capacity: pd.DataFrame = field(default_factory=pd.DataFrame)
    periods: tuple[datetime, datetime, datetime] | None = None  # baseline start, break, end of the regression
    sentence: str = ""
    request_step: int = 0  # the step of the quantile series (wider when requests are few)
    log_source: str | None = None  # the request log's rows read ("gateway" or "otlp"); None: engine histograms


# --------------------------------------------------------------------------- inputs


def _requests_where(start: datetime, end: datetime, source: str | None, filters: Filters | None) -> tuple[str, dict]:
    condition, params = request_rows(source, filters)
    params.update(start=param_time(start), end=param_time(end))
    return f"ts >= {{start:DateTime64(3)}} AND ts < {{end:DateTime64(3)}} AND {condition}", params


def _metric_series(client, latency: str, q: float, start, end, step: int, source: str | None, filters) -> pd.DataFrame:  # noqa: ANN001
    column = LATENCIES[latency].column
    if source is not None:
        where, params = _requests_where(start, end, source, filters)
        sql = f"""
            SELECT toDateTime64(toStartOfInterval(ts, INTERVAL {step} SECOND), 3, 'UTC') AS step_ts,
                   quantileExactWeighted({q!r})({column}, toUInt64(greatest(1, round(weight)))) AS value, count() AS n
            FROM requests WHERE {where} AND {column} > 0 GROUP BY step_ts ORDER BY step_ts"""
        df = query_df(client, sql, parameters=params).rename(columns={"step_ts": "ts"})
    else:
        df = histogram_quantiles_over_time(client, LATENCIES[latency].family, [q], start, end, "fleet", step=step,
                                           filters=filters)
        df = df.rename(columns={"count": "n"})[["ts", "value", "n"]]
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    return df[df["n"] > 0].reset_index(drop=True)


def _grid(start: datetime, end: datetime, step: int) -> pd.DatetimeIndex:
    first = pd.Timestamp(start).floor(f"{step}s")
    return pd.date_range(first, pd.Timestamp(end), freq=f"{step}s", inclusive="left", tz="UTC")


def _capacity(client, start, end, step: int, filters) -> pd.DataFrame:  # noqa: ANN001
    kw = {"step": step, "filters": filters}
    grid = pd.DataFrame(index=_grid(start, end, step))
    # one query for the gauges over the fleet, one for the counters
    gauges = gauges_over_time(client, [KV, RUNNING, WAITING], start, end, "fleet", **kw).set_index("ts")
    kv, running, waiting = (gauges[gauges["metric"] == m] for m in (KV, RUNNING, WAITING))
    grid = grid.join(kv["avg"].rename("kv_avg")).join(kv["max"].rename("kv_peak"))
    grid = grid.join((waiting["avg"] * waiting["series"]).rename("waiting"))  # summed over the fleet
    grid = grid.join(running["replicas"].rename("replicas_up"))
    rates = counter_rates_over_time(client, [PREEMPTIONS, PREFIX_HITS, PREFIX_QUERIES], start, end, "fleet", **kw)
    for name, metric in (("preemptions", PREEMPTIONS), ("hits", PREFIX_HITS), ("queries", PREFIX_QUERIES)):
        r = rates[rates["metric"] == metric]
        grid = grid.join(r.set_index("ts")["increase"].rename(name))
    grid["prefix_hit_rate"] = grid["hits"] / grid["queries"].where(grid["queries"] > 0)
    # replicas that held requests and generated no token in the step (a wedged engine still scrapes as up)
    wedged = stalled_steps(client, start, end, step=step, filters=filters)
    wedged = wedged[wedged["stalled"]]
    grid = grid.join(wedged.groupby("ts")["replica"].nunique().rename("stalled"))
    grid["stalled"] = grid["stalled"].fillna(0)
    # (first stalled step, stalled steps) per replica, for the evidence's words (plain values: pandas
    # compares attrs when frames are joined)
    grid.attrs["stalled_replicas"] = {str(r): (f["ts"].min(), len(f)) for r, f in wedged.groupby("replica")}
    grid.index.name = "ts"
    return grid


def _mix(client, start, end, step: int, source: str, filters, long_tokens: float) -> pd.DataFrame:  # noqa: ANN001
    """Per step and dimension value: weighted requests (dimension ``long`` splits by prompt length)."""
    where, params = _requests_where(start, end, source, filters)
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


# --------------------------------------------------------------------------- evidence

def _moved_at(series: pd.Series, break_at: pd.Timestamp, step: int, radius: int = 12) -> pd.Timestamp | None:
    """The signal's own change point nearest the break (within ``radius`` steps around it)."""
    s = series.dropna()
    if len(s) < 6:
        return None
    window = s[(s.index >= break_at - pd.Timedelta(seconds=step * radius * 2)) &
               (s.index < break_at + pd.Timedelta(seconds=step * radius * 2))]
    if len(window) < 6:
        return None
    k, gain = best_split(window.to_numpy(float), 2)
    return window.index[k] if k > 0 and gain > 0 else None


def _timing(moved: pd.Timestamp | None, break_at: pd.Timestamp, step: int) -> tuple[float | None, float]:
    if moved is None:
        return None, 1.0
    lead = (break_at - moved).total_seconds()
    return lead, (1.0 if lead >= -2 * step else 0.5)


def _row(signal: str, kind: str, before: str, after: str, score: float, moved, lead, detail: str,  # noqa: ANN001
         resolution_s: float) -> dict:
    """``resolution_s``: how finely ``moved`` is known (0: a request's own time; else the step)."""
    return {"signal": signal, "kind": kind, "before": before, "after": after, "score": round(float(score), 4),
            "moved_at": moved, "lead_s": lead, "detail": detail, "resolution_s": float(resolution_s)}


def _split_in_rows(client, where: str, params: dict, expr: str, a0: pd.Timestamp, a1: pd.Timestamp,  # noqa: ANN001
                   rise: bool = True) -> pd.Timestamp | None:
    """Where ``expr`` (per request, in arrival order) shifts within ``[a0, a1)``: the best single
    split of the rows' ranks (a rise when ``rise``)."""
    params = dict(params, a0=param_time(pd.Timestamp(a0).to_pydatetime()), a1=param_time(pd.Timestamp(a1).to_pydatetime()))
    df = query_df(client,
        f"SELECT ts, toFloat64({expr}) AS x FROM requests WHERE {where} AND ts >= {{a0:DateTime64(3)}} "
        f"AND ts < {{a1:DateTime64(3)}} ORDER BY ts", parameters=params)
    return _split_at(df["ts"], df["x"], rise)


def _split_at(ts: pd.Series, values: pd.Series, rise: bool = True) -> pd.Timestamp | None:
    """The arrival time where ``values`` (in arrival order) shift: the best single split of their
    ranks (a rise when ``rise``); None for fewer than 8 rows or no shift."""
    if len(values) < 8:
        return None
    x = values.rank().to_numpy(float)  # ranks: a few outliers cannot pull the split (0/1 values keep their order)
    k, gain = best_split(x, 3)
    if k <= 0 or gain <= 0 or (rise and x[k:].mean() <= x[:k].mean()):
        return None
    at = pd.Timestamp(ts.iloc[k])
    return at.tz_convert("UTC") if at.tzinfo else at.tz_localize("UTC")


def _rows_near(client, where: str, params: dict, a0: pd.Timestamp, a1: pd.Timestamp) -> pd.DataFrame:  # noqa: ANN001
    """The requests in ``[a0, a1)`` in arrival order, with what the mix signals split on: one read
    for every dimension (and both passes of the evidence)."""
    params = dict(params, a0=param_time(pd.Timestamp(a0).to_pydatetime()), a1=param_time(pd.Timestamp(a1).to_pydatetime()))
    return query_df(client,
        f"SELECT ts, tenant, model, route, {CONTEXT_BUCKET} AS context_bucket, toFloat64(prompt_tokens) AS prompt_tokens "
        f"FROM requests WHERE {where} AND ts >= {{a0:DateTime64(3)}} AND ts < {{a1:DateTime64(3)}} ORDER BY ts",
        parameters=params)


def _mix_evidence(mix: pd.DataFrame, dims: pd.DataFrame, break_at, step: int, long_tokens: float,  # noqa: ANN001
                  near: pd.DataFrame) -> list[dict]:
    rows = []
    totals = mix[mix["dimension"] == "tenant"].groupby("ts")["requests"].sum()
    for dim, label in [("long", "long-context share"), *MIX_DIMENSIONS.items()]:
        d = dims[dims["dimension"] == dim]
        if d.empty:
            continue
        d = d.assign(diff=d["slow_share"] - d["baseline_share"])
        if dim == "long":
            top = d[d["value"] == "long"]
            if top.empty:
                continue
            top = top.iloc[0]
        else:
            top = d.sort_values("diff", ascending=False).iloc[0]
        on = near["prompt_tokens"] > float(long_tokens) if dim == "long" else near[dim] == str(top["value"])
        up = float(top["after_share"]) >= float(top["baseline_share"])
        moved = _split_at(near["ts"], on.astype(float), rise=up)
        resolution = 0.0
        if moved is None:  # too few rows near the break: the per-step shares
            per_step = mix[(mix["dimension"] == dim) & (mix["value"] == top["value"])].set_index("ts")["requests"]
            moved = _moved_at((per_step.reindex(totals.index).fillna(0) / totals).sort_index(), break_at, step)
            resolution = step
        lead, factor = _timing(moved, break_at, step)
        name = f"prompts > {long_tokens:,.0f} tokens" if dim == "long" else f"{dim} {top['value'] or '(none)'}"
        detail = (f"{name}: {top['baseline_share']:.0%} of baseline requests, {top['slow_share']:.0%} of the slow ones "
                  f"after the break ({top['after_share']:.0%} of all after)")
        # concentrated among the slow requests (BubbleUp), and more of the traffic than before:
        # a share that did not change says where the slow requests are, not why
        changed = min(1.0, abs(float(top["after_share"]) - float(top["baseline_share"])) / MIX_CHANGE)
        rows.append(_row(label, "mix", f"{top['baseline_share']:.0%}", f"{top['after_share']:.0%}",
                         max(float(top["diff"]), 0.0) * changed * factor, moved, lead, detail, resolution))
    return rows


def _capacity_evidence(cap: pd.DataFrame, break_at, after_end, step: int) -> list[dict]:  # noqa: ANN001
    before = cap[cap.index < break_at]
    after = cap[(cap.index >= break_at) & (cap.index < after_end)]
    rows = []
    if before.empty or after.empty:
        return rows

    def frac(frame: pd.DataFrame, condition: pd.Series) -> float:
        return float(condition.mean()) if len(frame) else 0.0

    if "kv_peak" in cap:
        # full, or so full that the next request's blocks do not fit: requests wait at half use
        on = (cap["kv_peak"] >= SATURATED) | ((cap["waiting"] > 0.5) & (cap["kv_peak"] >= PRESSURE))
        f_b, f_a = frac(before, on[before.index]), frac(after, on[after.index])
        moved = _moved_at(cap["kv_avg"], break_at, step)
        lead, factor = _timing(moved, break_at, step)
        detail = (f"KV usage {before['kv_avg'].mean():.0%} -> {after['kv_avg'].mean():.0%} on average; a replica at "
                  f">= {SATURATED:.0%}, or >= {PRESSURE:.0%} with requests waiting, in {f_b:.0%} -> {f_a:.0%} of steps; "
                  f"{before['waiting'].mean():.1f} -> "
                  f"{after['waiting'].mean():.1f} requests waiting; {before['preemptions'].sum() / max(len(before) * step, 1) * 60:.1f} -> "
                  f"{after['preemptions'].sum() / max(len(after) * step, 1) * 60:.1f} preemptions/min")
        rows.append(_row("KV-cache saturation", "capacity", f"{f_b:.0%} of steps", f"{f_a:.0%} of steps",
                         max(f_a - f_b, 0.0) * factor, moved, lead, detail, step))
        queue_on = (cap["waiting"] > 0.5) & ~on
    else:
        queue_on = cap["waiting"] > 0.5
    q_b, q_a = frac(before, queue_on[before.index]), frac(after, queue_on[after.index])
    moved = _moved_at(cap["waiting"], break_at, step)
    lead, factor = _timing(moved, break_at, step)
    rows.append(_row("queueing without KV saturation", "capacity", f"{q_b:.0%} of steps", f"{q_a:.0%} of steps",
                     max(q_a - q_b, 0.0) * factor, moved, lead,
                     f"requests waiting while no replica's KV cache was {PRESSURE:.0%} used: batch or compute limits", step))
    hb, ha = before["prefix_hit_rate"].mean(), after["prefix_hit_rate"].mean()
    if pd.notna(hb) and pd.notna(ha):
        moved = _moved_at(cap["prefix_hit_rate"], break_at, step)
        lead, factor = _timing(moved, break_at, step)
        rows.append(_row("prefix-cache hit rate", "capacity", f"{hb:.0%}", f"{ha:.0%}", max(hb - ha, 0.0) * factor,
                         moved, lead, "a lower hit rate means more prompt tokens to compute", step))
    if "stalled" in cap:
        on = cap["stalled"] > 0
        s_b, s_a = frac(before, on[before.index]), frac(after, on[after.index])
        if s_a > 0 or s_b > 0:
            moved = _moved_at(cap["stalled"], break_at, step)
            lead, factor = _timing(moved, break_at, step)
            who = sorted((cap.attrs.get("stalled_replicas") or {}).items(), key=lambda item: -item[1][1])
            named = ", ".join(f"{r} (from {first:%H:%M:%S}, {n * step / 60:.1f} min)" for r, (first, n) in who[:5])
            rows.append(_row("stalled replicas", "capacity", f"{s_b:.0%} of steps", f"{s_a:.0%} of steps",
                             max(s_a - s_b, 0.0) * factor, moved, lead,
                             f"replicas that held requests and generated no token: {named or 'none named'}; their "
                             "requests wait, the others take the rest", step))
    ub, ua = before["replicas_up"].mean(), after["replicas_up"].mean()
    if pd.notna(ub) and ub > 0:
        moved = _moved_at(cap["replicas_up"], break_at, step)
        lead, factor = _timing(moved, break_at, step)
        rows.append(_row("replicas up", "capacity", f"{ub:.1f}", f"{ua:.1f}", max(1 - ua / ub, 0.0) * factor,
                         moved, lead, "fewer replicas serving the same traffic", step))
    return rows


def _rate_evidence(mix: pd.DataFrame, break_at, after_end, step: int) -> list[dict]:  # noqa: ANN001
    totals = mix[mix["dimension"] == "tenant"].groupby("ts")["requests"].sum().sort_index() / step
    b, a = totals[totals.index < break_at].mean(), totals[(totals.index >= break_at) & (totals.index < after_end)].mean()
    if not (pd.notna(b) and b > 0 and pd.notna(a)):
        return []
    moved = _moved_at(totals, break_at, step)
    lead, factor = _timing(moved, break_at, step)
    return [_row("request rate", "mix", f"{b:.2f}/s", f"{a:.2f}/s", min(max(a / b - 1, 0.0), 1.0) * factor, moved, lead,
                 "more requests per second", step)]


def _dimensions(client, where: str, params: dict, periods: tuple, column: str, slow: float,  # noqa: ANN001
                long_tokens: float) -> pd.DataFrame:
    """``periods``: (baseline end, after start) — the baseline ends where the regression began."""
    params = dict(params, bend=param_time(pd.Timestamp(periods[0]).to_pydatetime()),
                  brk=param_time(pd.Timestamp(periods[1]).to_pydatetime()), slow=float(slow), long_tokens=float(long_tokens))
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


def _strata(client, where: str, params: dict, periods: tuple, column: str, q: float,  # noqa: ANN001
            cuts: tuple[float, float]) -> pd.DataFrame:
    params = dict(params, bend=param_time(pd.Timestamp(periods[0]).to_pydatetime()),
                  brk=param_time(pd.Timestamp(periods[1]).to_pydatetime()), c1=float(cuts[0]), c2=float(cuts[1]))
    band = ("multiIf(prompt_tokens <= {c1:Float64}, 'short', prompt_tokens <= {c2:Float64}, 'medium', 'long')")
    sql = f"""
        SELECT {band} AS band, multiIf(ts < {{bend:DateTime64(3)}}, 'before', ts >= {{brk:DateTime64(3)}}, 'after', '') AS period,
               sum(weight) AS requests,
               quantileExactWeightedIf({q!r})({column}, toUInt64(greatest(1, round(weight))), {column} > 0) AS value
        FROM requests WHERE {where} GROUP BY band, period HAVING period != ''"""
    df = query_df(client, sql, parameters=params)
    wide = df.pivot_table(index="band", columns="period", values=["requests", "value"], aggfunc="first")
    out = pd.DataFrame(index=["short", "medium", "long"])
    for period in ("before", "after"):
        req = wide[("requests", period)] if ("requests", period) in wide.columns else pd.Series(dtype=float)
        out[f"share_{period}"] = (req / req.sum()).reindex(out.index)
        out[f"q_{period}"] = (wide[("value", period)] if ("value", period) in wide.columns else pd.Series(dtype=float)).reindex(out.index)
    out["slowdown"] = out["q_after"] / out["q_before"]
    out.index.name = "band"
    out.attrs["cuts"] = cuts
    return out.reset_index()


def _onset(ex: Explanation) -> datetime:
    """When the regression began: the earliest move of the top two signals, if before the break.

    A move found on per-step values (a gauge, a per-step share) is known to a few steps; where it
    falls within that of a move found on the requests themselves, the requests' time is used."""
    top = ex.evidence.head(2)
    leading = top[(top["score"] > 0.1) & (top["lead_s"].fillna(-1) >= 0)]
    if not len(leading):
        return ex.break_at
    moves = [(pd.Timestamp(t), float(r)) for t, r in zip(leading["moved_at"], leading["resolution_s"], strict=True)]
    exact = [t for t, r in moves if r == 0]
    kept = [t for t, r in moves if r == 0 or not any(abs((t - e).total_seconds()) <= 3 * r for e in exact)]
    return min(ex.break_at, min(t.to_pydatetime() for t in kept))


EVIDENCE_COLUMNS = ["signal", "kind", "before", "after", "score", "moved_at", "lead_s", "detail", "resolution_s"]


def _rank(rows: list[dict]) -> pd.DataFrame:
    columns = EVIDENCE_COLUMNS
    if not rows:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(rows, columns=columns)
    df["_tie"] = (df["score"] / 0.02).round()
    df["_priority"] = df["signal"].map({s: i for i, s in enumerate(PRIORITY)}).fillna(len(PRIORITY))
    df = df.sort_values(["_tie", "_priority"], ascending=[False, True], kind="stable", ignore_index=True)
    return df.drop(columns=["_tie", "_priority"])


def _sentence(ex: Explanation, latency: str, q: float, strata: pd.DataFrame, long_tokens: float) -> str:
    head = (f"p{q * 100:g} {latency.upper()} rose from {ex.before:.2f}s to {ex.after:.2f}s at "
            f"{ex.break_at:%H:%M:%S} UTC (±{ex.step}s)")
    if ex.onset is not None and ex.onset < ex.break_at:
        first = ex.evidence[ex.evidence["moved_at"] == pd.Timestamp(ex.onset)].iloc[0]["signal"]
        head += f"; it began at {ex.onset:%H:%M:%S}, when the {first} moved"
    top = ex.evidence[ex.evidence["score"] > 0.05].head(3)
    if top.empty:
        return head + "; none of the signals fleetscope watches moved with it (look at deploys and annotations)."
    causes = [f"{r.signal} ({r.before} -> {r.after})" for r in top.itertuples()]
    short = strata.set_index("band").loc["short"] if "short" in set(strata["band"]) else None
    long = strata.set_index("band").loc["long"] if "long" in set(strata["band"]) else None
    verdict = ""
    if short is not None and pd.notna(short["slowdown"]):
        heavier = long is not None and pd.notna(long["share_after"]) and long["share_after"] - long["share_before"] >= 0.05
        if short["slowdown"] >= 1.5:
            verdict = (f"; short prompts slowed too (p{q * 100:g} {short['q_before']:.2f}s -> {short['q_after']:.2f}s): "
                       "everyone got slower, contention" + (" brought on by a heavier mix" if heavier else ""))
        elif heavier:
            verdict = (f"; short prompts kept their latency ({short['q_before']:.2f}s -> {short['q_after']:.2f}s): "
                       f"the mix got heavier (prompts over {long_tokens:,.0f} tokens {long['share_before']:.0%} -> "
                       f"{long['share_after']:.0%})")
    return f"{head}. Consistent with {', '.join(causes)}{verdict}."


def quantile_series(
    client,  # noqa: ANN001
    start: datetime,
    end: datetime,
    *,
    latency: str = "ttft",
    q: float = 0.99,
    step: float | None = None,
    filters: Filters | None = None,
) -> Explanation:
    """The first, cheap part of ``explain``: the ``q`` quantile of ``latency`` per step over ``[start,
    end)`` (``series``, ``source``, ``step``, ``request_step``), before any break is looked for; a page
    draws it while the rest is worked out."""
    if latency not in LATENCIES:
        raise ValueError(f"unknown latency {latency!r}; one of {', '.join(LATENCIES)}")
    if not 0 < q < 1:
        raise ValueError(f"q must be within (0, 1), got {q}")
    start, end = as_utc(start), as_utc(end)
    step_s = int(step) if step else auto_step(start, end, points=180)
    source = log_source(client, start, end, filters)
    column = LATENCIES[latency].column
    coarse = step_s
    if source is not None:  # enough requests per step for a quantile to mean something
        where, params = _requests_where(start, end, source, filters)
        rows_n = int(client.command(f"SELECT count() FROM requests WHERE {where} AND {column} > 0", parameters=params))
        if rows_n:
            wanted = (end - start).total_seconds() * MIN_PER_STEP / rows_n
            coarse = max(step_s, auto_step(start, start + timedelta(seconds=max(wanted, 1)), points=1))
            coarse = -(-coarse // step_s) * step_s
    series = _metric_series(client, latency, q, start, end, coarse, source, filters)
    return Explanation(f"p{q * 100:g} {latency}", "request log" if source else "engine histograms", step_s, series,
                       request_step=coarse, log_source=source)


def explain(
    client,  # noqa: ANN001
    start: datetime,
    end: datetime,
    *,
    latency: str = "ttft",
    q: float = 0.99,
    step: float | None = None,
    filters: Filters | None = None,
    prices: dict[str, float] | None = None,
) -> Explanation:
    """Find the break in the ``q`` quantile of ``latency`` over ``[start, end)`` and the evidence."""
    ex = quantile_series(client, start, end, latency=latency, q=q, step=step, filters=filters)
    start, end = as_utc(start), as_utc(end)
    series, step_s, coarse, column = ex.series, ex.step, ex.request_step, LATENCIES[latency].column
    source = ex.log_source
    if len(series) < 8:
        ex.sentence = f"not enough data between {start:%H:%M} and {end:%H:%M} to find a break ({len(series)} steps)."
        return ex
    values = np.log(np.maximum(series["value"].to_numpy(float), 1e-4))
    idx = change_points(values)
    bounds = [0, *idx, len(values)]
    levels = [float(values[a:b].mean()) for a, b in itertools.pairwise(bounds)]
    for i, k in enumerate(idx):
        ex.breaks.append({"ts": series["ts"].iloc[k], "before": math.exp(levels[i]), "after": math.exp(levels[i + 1])})
    found = episode(levels, bounds)
    if found is None:
        ex.sentence = f"{ex.metric} shows no lasting rise between {start:%H:%M} and {end:%H:%M} UTC."
        return ex
    base, first, last = found  # segments [first, last) are the regression, ``base`` the level before
    ex.break_at = series["ts"].iloc[bounds[first]].to_pydatetime()
    if source is not None:  # sharpen it on the requests themselves, in arrival order
        where, params = _requests_where(start, end, source, filters)
        middle = pd.Timestamp(ex.break_at) + pd.Timedelta(seconds=coarse / 2)
        sharp = _split_in_rows(client, f"{where} AND {column} > 0", params, f"log({column})",
                               middle - pd.Timedelta(seconds=2 * coarse), middle + pd.Timedelta(seconds=2 * coarse))
        if sharp is not None:
            ex.break_at = sharp.to_pydatetime()
    ex.before = math.exp(levels[base])
    ex.after = float(np.exp(values[bounds[first]:bounds[last]].mean()))
    baseline_start = series["ts"].iloc[bounds[base]].to_pydatetime() if base > 0 else start
    after_end = series["ts"].iloc[bounds[last]].to_pydatetime() if last < len(levels) else end
    break_ts = pd.Timestamp(ex.break_at)

    # the fleet's capacity signals over the whole window (the page draws them), judged from the baseline on
    ex.capacity = _capacity(client, start, end, step_s, filters)
    index = ex.capacity.index
    judged = ex.capacity[(index >= pd.Timestamp(baseline_start).floor(f"{step_s}s")) & (index < pd.Timestamp(after_end))]
    rows = _capacity_evidence(judged, break_ts, pd.Timestamp(after_end), step_s)
    if source is not None:
        where, params = _requests_where(baseline_start, after_end, source, filters)
        base_where, base_params = _requests_where(baseline_start, ex.break_at, source, filters)
        row = client.query(
            f"SELECT quantileExactWeighted(0.5)(prompt_tokens, toUInt64(greatest(1, round(weight)))), "
            f"quantileExactWeightedIf({q!r})({column}, toUInt64(greatest(1, round(weight))), {column} > 0) "
            f"FROM requests WHERE {base_where}", parameters=base_params).result_rows[0]
        median_tokens, slow = float(row[0]), row[1]
        long_tokens = LONG_FACTOR * median_tokens
        mix = _mix(client, baseline_start, after_end, coarse, source, filters, long_tokens)
        near = _rows_near(client, where, params, pd.Timestamp(baseline_start), break_ts + pd.Timedelta(seconds=3 * coarse))

        def request_evidence(baseline_end) -> list[dict]:  # noqa: ANN001
            ex.dimensions = _dimensions(client, where, params, (baseline_end, break_ts), column, slow, long_tokens)
            return (_mix_evidence(mix, ex.dimensions, break_ts, step_s, long_tokens, near)
                    + _rate_evidence(mix, break_ts, pd.Timestamp(after_end), coarse))

        ex.evidence = _rank(rows + request_evidence(break_ts))
        baseline_end = pd.Timestamp(break_ts)
        onset = _onset(ex)
        if onset < ex.break_at - timedelta(seconds=coarse):  # the traffic changed well before the latency did:
            baseline_end = pd.Timestamp(onset)  # the baseline ends there
            ex.evidence = _rank(rows + request_evidence(baseline_end))
        # by prompt length, against the final baseline (the sentence reads it, the onset does not)
        ex.strata = _strata(client, where, params, (baseline_end, break_ts), column, q, (median_tokens, long_tokens))
    else:
        long_tokens = math.nan
        ex.evidence = _rank(rows)
    ex.periods = (baseline_start, ex.break_at, after_end)
    if prices is not None:
        ex.cost = cost_around(client, ex.periods, prices, filters=filters)
    ex.onset = _onset(ex)
    strata = ex.strata if len(ex.strata) else pd.DataFrame(columns=["band"])
    ex.sentence = _sentence(ex, latency, q, strata, long_tokens)
    return ex




def cost_around(
    client, periods: tuple[datetime, datetime, datetime] | None, prices: dict[str, float], *,  # noqa: ANN001
    filters: Filters | None = None,
) -> pd.DataFrame:
    """Cost per model in the baseline and in the regression (``Explanation.periods``; ``period``
    before / after): spend, tokens, cost per 1M tokens, idle share; empty without periods (no
    break found)."""
    columns = ["model", "spend", "prompt_tokens", "completion_tokens", "cost_per_million_tokens", "idle_share"]
    if periods is None:
        return pd.DataFrame(columns=[*columns, "period"])
    baseline_start, break_at, after_end = periods
    frames = [cost_per_token(client, a, b, prices, filters=filters)[columns].assign(period=period)
              for period, (a, b) in (("before", (baseline_start, break_at)), ("after", (break_at, after_end)))]
    return pd.concat(frames, ignore_index=True)
