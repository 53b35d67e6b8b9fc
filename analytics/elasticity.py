"""Elasticity observed: what the autoscaler decided, how long its replicas took to serve, how many
replicas each pool ran over time, whether it flapped, and what its spare capacity costs.

In:  a client and a window ``[start, end)``: the ``scale_events`` table (migration 0013: one row per
     decision of the bundled fleet's autoscaler, ``scale_out`` / ``scale_in`` / ``held_at_max`` /
     ``flap_guard``, and per step of a replica it starts or stops, ``ready`` / ``serving`` /
     ``draining`` / ``removed`` / ``start_failed``, tied to its decision by ``decision_id``), the
     engines' samples (or their rollups) and GPU prices (``{gpu_type: USD per GPU-hour}``).
Out: - ``scale_events``: the rows, ``ts`` and ``crossed_at`` as UTC datetimes;
     - ``cold_starts``: one row per scale-out decision: ``pool, replica, decision_id, decided_at,
       crossed_at, ready_at, serving_at, failed_at`` and the three durations ``time_to_ready_s``
       (ready - decided), ``time_to_first_token_s`` (serving - decided) and ``scale_out_lag_s``
       (serving - the signal's crossing: what users waited for; NaN while not serving). Steps are
       read as of ``end``: a replica that serves after ``end`` is "not serving yet";
     - ``replicas_over_time``: ``[ts, pool, replicas]`` per step: the seconds the pool's replicas
       were up in the step (``analytics.allocation.uptime``, the cost rule's presence) over the
       step, so half a step up is 0.5; a step in which none was up is 0, a value, not a gap;
     - ``flapping``: per pool ``[pool, reversals, last_at]``: the most direction changes (a
       scale-out after a scale-in or the reverse) within any ``window_s`` in the window, and the
       last one's time;
     - ``headroom``: per step and pool ``[ts, pool, replicas, demand_replicas, headroom_replicas,
       headroom_usd_per_hour]``: demand = the sum of the pool's replicas' KV cache usage over the
       KV target (the replicas it would need at the target), headroom = replicas up - demand (at
       least 0) and what those spare replicas cost per hour (replicas x GPUs x price, priced as
       ``analytics.allocation.priced`` prices, so a missing price raises ``NoPrice``);
     - ``spend_per_hour``: each pool's (or the fleet's) spend per hour over a recent window and
       the baseline window before it (the cost rule's uptime, priced), and the change in percent;
     - ``retired``: the replicas a scale-in removed (a ``removed`` event at or after a time),
       which ``analytics.health`` reads as retired, not down;
     - ``scale_marks``: ``(ts, title, text)`` per decision, for the charts' markers
       ("tiny-large 1 -> 2 (kv_cache_usage 0.86 > 0.8)").
A replica costs nothing before its first scrape and after its last (the cost rule counts presence):
the cold start between the decision and the first scrape is not billed.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from typing_extensions import Unpack

from analytics.allocation import FLEET, priced, uptime
from analytics.errors import BadInput
from analytics.frames import query_df
from analytics.tiers import param_time
from analytics.timeseries import gauges_over_time
from analytics.vllm import KV_CACHE_USAGE
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = [
    "COLD_STARTS",
    "COLUMNS",
    "cold_starts",
    "flapping",
    "headroom",
    "replicas_over_time",
    "retired",
    "scale_events",
    "scale_marks",
    "spend_per_hour",
]

COLUMNS = [
    "ts", "pool", "kind", "decision_id", "replica", "from_replicas", "to_replicas", "signal", "value",
    "threshold", "crossed_at", "source", "detail",
]  # fmt: skip
COLD_STARTS = [
    "pool", "replica", "decision_id", "from_replicas", "to_replicas", "signal", "value", "threshold",
    "decided_at", "crossed_at", "ready_at", "serving_at", "failed_at", "time_to_ready_s",
    "time_to_first_token_s", "scale_out_lag_s",
]  # fmt: skip
DIRECTIONS = {"scale_out": 1, "scale_in": -1}


def scale_events(
    client: Client,
    start: datetime,
    end: datetime,
    pools: list[str] | None = None,
    *,
    kinds: list[str] | tuple[str, ...] | None = None,
) -> pd.DataFrame:
    """The ``scale_events`` rows with ``start <= ts < end`` (of ``pools`` and ``kinds`` when given),
    in time order, ``ts`` and ``crossed_at`` as UTC datetimes (``crossed_at`` NaT where unknown)."""
    where = ["ts >= {s:DateTime64(3)}", "ts < {e:DateTime64(3)}"]
    params: dict[str, object] = {"s": param_time(start), "e": param_time(end)}
    if pools is not None:
        where.append("pool IN {pools:Array(String)}")
        params["pools"] = list(pools)
    if kinds is not None:
        where.append("kind IN {kinds:Array(String)}")
        params["kinds"] = list(kinds)
    sql = f"SELECT {', '.join(COLUMNS)} FROM scale_events WHERE {' AND '.join(where)} ORDER BY ts, pool, kind"
    df = query_df(client, sql, parameters=params)
    for column in ("ts", "crossed_at"):
        df[column] = pd.to_datetime(df[column], utc=True).astype("datetime64[ns, UTC]")
    for column in ("from_replicas", "to_replicas"):
        df[column] = df[column].astype(int)
    for column in ("value", "threshold"):
        df[column] = df[column].astype(float)
    return df.reset_index(drop=True)


def _seconds(later: pd.Series, earlier: pd.Series) -> pd.Series:
    return (later - earlier).dt.total_seconds()


def cold_starts(client: Client, start: datetime, end: datetime) -> pd.DataFrame:
    """One row per scale-out decided in ``[start, end)`` with the steps its replica took by ``end``
    (see the module docstring); ordered by decision time."""
    decided = scale_events(client, start, end, kinds=["scale_out"])
    steps = scale_events(client, start, end, kinds=["ready", "serving", "start_failed"])
    steps = steps[steps["decision_id"].isin(set(decided["decision_id"]))]
    out = decided.rename(columns={"ts": "decided_at"})
    for kind, column in (("ready", "ready_at"), ("serving", "serving_at"), ("start_failed", "failed_at")):
        first = (
            steps[steps["kind"] == kind]
            .groupby("decision_id", as_index=False)
            .agg(**{column: ("ts", "min"), f"{column}_replica": ("replica", "first")})
        )
        out = out.merge(first, on="decision_id", how="left")
        named = out[f"{column}_replica"].fillna("").astype(str)
        out["replica"] = out["replica"].where(out["replica"].astype(str) != "", named)  # named by a later step
        out = out.drop(columns=[f"{column}_replica"])
        out[column] = pd.to_datetime(out[column], utc=True).astype("datetime64[ns, UTC]")
    out["time_to_ready_s"] = _seconds(out["ready_at"], out["decided_at"])
    out["time_to_first_token_s"] = _seconds(out["serving_at"], out["decided_at"])
    # the signal's crossing when recorded, else the decision itself (a minimum-size scale-out)
    out["scale_out_lag_s"] = _seconds(out["serving_at"], out["crossed_at"].fillna(out["decided_at"]))
    return out[COLD_STARTS].sort_values(["decided_at", "pool"], ignore_index=True)


def replicas_over_time(
    client: Client,
    start: datetime,
    end: datetime,
    step_s: float,
    by: str = "model",
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Replicas up per step and pool (``by="model"``) or replica (``by="replica"``: a replica's
    share of the step it was up, 0..1): ``[ts, pool, replicas]`` (+ ``replica``), every step of the
    window for every pool seen in it, 0 where none was up. ``.attrs``: ``step`` (``step_s`` made a
    whole number of the cost rule's grains), ``plan``, ``pools`` (per pool its ``gpu_type`` and
    ``gpu_count`` rows, for pricing)."""
    if by not in ("model", "replica"):
        raise BadInput("by must be 'model' or 'replica'")
    up = uptime(client, start, end, step=int(math.ceil(step_s)), by=by, **scope)
    step, plan = int(up.attrs["step"]), up.attrs["plan"]
    grid = pd.date_range(plan.start, plan.end, freq=f"{step}s", inclusive="left", tz="UTC")
    keys = ["pool", "replica"] if by == "replica" else ["pool"]
    up = up.rename(columns={"model": "pool"})
    summed = up.groupby(["ts", *keys], as_index=False)["up_seconds"].sum()
    full = pd.MultiIndex.from_product([grid, *(sorted(set(up[k])) for k in keys)], names=["ts", *keys])
    out = summed.set_index(["ts", *keys]).reindex(full, fill_value=0.0).reset_index()
    if by == "replica":  # only the pairs seen: a replica belongs to one pool
        out = out.merge(up[keys].drop_duplicates(), on=keys)
    out["replicas"] = out["up_seconds"].astype(float) / step
    out = out[["ts", *keys, "replicas"]].sort_values(["ts", *keys], ignore_index=True)
    out["ts"] = out["ts"].astype("datetime64[ns, UTC]")
    kinds = up.groupby(["pool", "gpu_type", "gpu_count"], as_index=False)["up_seconds"].sum()
    out.attrs.update(step=step, plan=plan, pools=kinds)
    frame: pd.DataFrame = out
    return frame


def flapping(client: Client, start: datetime, end: datetime, window_s: float = 900) -> pd.DataFrame:
    """Per pool with scale decisions in the window: ``reversals``, the most direction changes (a
    scale-out after a scale-in, or the reverse; the decision before the window counts as the
    previous direction) within any ``window_s`` seconds ending in ``[start, end)``, and
    ``last_at``, the time of the last one (NaT: none)."""
    if window_s <= 0:
        raise BadInput("window_s must be above 0")
    before = start - timedelta(seconds=window_s) - timedelta(days=1)  # the previous direction
    df = scale_events(client, before, end, kinds=list(DIRECTIONS))
    rows = []
    for pool, part in df.groupby("pool", sort=True):
        direction = part["kind"].map(DIRECTIONS)
        flips = part[(direction != direction.shift()) & direction.shift().notna()]
        flips = flips[flips["ts"] >= pd.Timestamp(start)]
        if part["ts"].max() < pd.Timestamp(start) and flips.empty:
            continue  # no decision in the window
        times = flips["ts"].to_numpy()
        width = np.timedelta64(int(window_s * 1e9), "ns")
        most = max((int(((times > t - width) & (times <= t)).sum()) for t in times), default=0)
        rows.append((str(pool), most, flips["ts"].max() if len(flips) else pd.NaT))
    out = pd.DataFrame(rows, columns=["pool", "reversals", "last_at"])
    out["reversals"] = out["reversals"].astype(int)
    out["last_at"] = pd.to_datetime(out["last_at"], utc=True).astype("datetime64[ns, UTC]")
    return out


def _hourly_rate(kinds: pd.DataFrame, prices: dict[str, float]) -> dict[str, float]:
    """USD per replica-hour per pool (a pool of mixed GPU kinds: weighted by their up time)."""
    per_hour = priced(
        kinds.assign(replica=kinds["pool"], up_seconds=3600.0, busy_seconds=0.0, gpu_count=kinds["gpu_count"]),
        prices,
    )
    per_hour["weight"] = kinds["up_seconds"].astype(float).clip(lower=1e-9)
    per_hour["weighted"] = per_hour["spend"] * per_hour["weight"]
    sums = per_hour.groupby("pool")[["weighted", "weight"]].sum()
    return {str(pool): float(row.weighted / row.weight) for pool, row in sums.iterrows()}


def headroom(
    client: Client,
    start: datetime,
    end: datetime,
    step_s: float,
    kv_target: float = 0.8,
    prices: dict[str, float] | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Spare replicas per step and pool, and their spend per hour (see the module docstring;
    ``prices`` None: ``headroom_usd_per_hour`` is NaN, never 0)."""
    if not 0 < kv_target <= 1:
        raise BadInput(f"kv_target must be in (0, 1], got {kv_target}")
    reps = replicas_over_time(client, start, end, step_s, **scope)
    step = reps.attrs["step"]
    kv = gauges_over_time(client, [KV_CACHE_USAGE], start, end, "model", agg="sum", step=step, **scope)
    kv = kv.rename(columns={"model": "pool", "avg": "kv_sum"})[["ts", "pool", "kv_sum"]]
    kv["ts"] = pd.to_datetime(kv["ts"], utc=True).astype("datetime64[ns, UTC]")
    out = reps.merge(kv, on=["ts", "pool"], how="left")
    # no KV sample in a step: no demand to judge (NaN), unless no replica was up (0)
    nothing_up = pd.Series(np.where(out["replicas"] <= 0, 0.0, np.nan), index=out.index)
    out["demand_replicas"] = (out["kv_sum"].astype(float) / kv_target).fillna(nothing_up)
    out["headroom_replicas"] = (out["replicas"] - out["demand_replicas"]).clip(lower=0)
    if prices is None:
        out["headroom_usd_per_hour"] = math.nan
    else:
        rate = _hourly_rate(reps.attrs["pools"], prices)
        out["headroom_usd_per_hour"] = out["headroom_replicas"] * out["pool"].map(rate).astype(float)
    out = out[["ts", "pool", "replicas", "demand_replicas", "headroom_replicas", "headroom_usd_per_hour"]]
    out.attrs.update(step=step, plan=reps.attrs["plan"], kv_target=kv_target)
    return out


def spend_per_hour(
    client: Client,
    at: datetime,
    prices: dict[str, float],
    *,
    window_s: float = 300,
    baseline_s: float = 3600,
    by: str = "model",
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Spend per hour over ``[at - window_s, at)`` against the ``baseline_s`` before it, per model
    pool (``by="model"``) or for the fleet (``by="fleet"``: one row, model ``(fleet)``):
    ``[model, recent_usd_per_hour, baseline_usd_per_hour, change]`` (change in percent). Each side
    is its spend (``analytics.allocation``'s uptime, priced) over the whole minutes from the first
    to the last in which the pool (the fleet) had a replica up: a young fleet's baseline is what
    there is of it, and a pool that was not there yet has no baseline (no row). Whole minutes only:
    the one ``at`` falls in is still filling."""
    if by not in ("fleet", "model"):
        raise BadInput("by must be 'fleet' or 'model'")
    if window_s < 60 or baseline_s < 60:
        raise BadInput("window_s and baseline_s must be at least a minute")
    columns = ["model", "recent_usd_per_hour", "baseline_usd_per_hour", "change"]
    recent_start = at - timedelta(seconds=window_s)
    start = recent_start - timedelta(seconds=baseline_s)
    up = uptime(client, start, at, step=60, by="model", **scope)
    if up.empty:
        return pd.DataFrame(columns=columns)
    up = priced(up, prices)
    up = up[up["ts"] + pd.Timedelta(seconds=60) <= pd.Timestamp(at)]
    if by == "fleet":
        up = up.assign(model=FLEET)
    per_minute = up.groupby(["model", "ts"], as_index=False)["spend"].sum()
    rows = []
    for key, part in per_minute.groupby("model"):
        recent = part[part["ts"] >= pd.Timestamp(recent_start)]
        base = part[part["ts"] < pd.Timestamp(recent_start)]
        if len(recent) and len(base):
            rows.append((str(key), _per_hour(recent), _per_hour(base)))
    out = pd.DataFrame(rows, columns=columns[:3])
    out["change"] = (out["recent_usd_per_hour"] / out["baseline_usd_per_hour"] - 1) * 100
    return out[out["baseline_usd_per_hour"] > 0].reset_index(drop=True)[columns]


def _per_hour(minutes: pd.DataFrame) -> float:
    """USD per hour over per-minute spend rows: their sum over the minutes from the first to the last."""
    span = (minutes["ts"].max() - minutes["ts"].min()).total_seconds() + 60
    return float(minutes["spend"].sum() / span * 3600)


def retired(client: Client, start: datetime, end: datetime) -> pd.DataFrame:
    """Replicas a scale-in removed: ``[replica, pool, removed_at]``, the last ``removed`` event of
    each replica with one in ``[start - 7 days, end)`` (health reads a week back)."""
    df = scale_events(client, start - timedelta(days=7), end, kinds=["removed"])
    df = df[df["replica"].astype(str) != ""]
    last = df.groupby("replica", as_index=False).agg(pool=("pool", "last"), removed_at=("ts", "max"))
    return last[["replica", "pool", "removed_at"]]


def _title(row: pd.Series) -> str:
    pool, a, b = row["pool"], int(row["from_replicas"]), int(row["to_replicas"])
    why = ""
    if row["signal"]:
        op = "<" if row["kind"] == "scale_in" else ">"
        why = f" ({row['signal']} {row['value']:.3g} {op} {row['threshold']:g})"
    if row["kind"] == "held_at_max":
        return f"{pool} held at max {a}{why}"
    if row["kind"] == "flap_guard":
        return f"{pool} held at {a}: flapping guard"
    return f"{pool} {a} -> {b}{why}"


def scale_marks(client: Client, start: datetime, end: datetime) -> list[tuple[datetime, str, str]]:
    """One marker per decision in the window: its time, a title ("tiny-large 1 -> 2
    (kv_cache_usage 0.86 > 0.8)") and a text (the decision in words; for a scale-out, its replica's
    cold start: "large-1 ready +41 s, first token +43 s")."""
    decisions = scale_events(client, start, end, kinds=["scale_out", "scale_in", "held_at_max", "flap_guard"])
    starts = cold_starts(client, start, end).set_index("decision_id") if len(decisions) else pd.DataFrame()
    marks = []
    for _, row in decisions.iterrows():
        text = str(row["detail"])
        if row["kind"] == "scale_out" and row["decision_id"] in starts.index:
            c = starts.loc[row["decision_id"]]
            steps = (("ready", "time_to_ready_s"), ("first token", "time_to_first_token_s"))
            parts = [f"{label} +{c[col]:.0f} s" for label, col in steps if pd.notna(c[col])]
            if pd.notna(c["failed_at"]):
                parts.append("start failed")
            if parts:
                text = f"{text}; {c['replica'] or 'new replica'} {', '.join(parts)}".lstrip("; ")
        marks.append((row["ts"].to_pydatetime(), _title(row), text))
    return marks
