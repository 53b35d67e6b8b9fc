"""Signal readers of elasticity: a pool held at its maximum, a pool that flaps, a scale-out slower
than users can wait, and a jump of the spend per hour.

In:  a ``Context`` (the ClickHouse client; the metadata sessions for the GPU prices), a signal's
     parsed parameters and the evaluation time.
Out: the ``Sample`` list of each signal, labelled by ``model`` (the pool's model). Every number
     comes from ``analytics.elasticity`` (the ``scale_events`` table and the cost rule's uptime).
     A pool without scale events has no sample (a fleet without an autoscaler has nothing to
     say; nor has a store not migrated to the ``scale_events`` table yet); unpriced replicas give
     the spend signal no samples, not an error.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import wraps

import pandas as pd
from clickhouse_connect.driver.exceptions import DatabaseError

from alerts.reading import Context, Params, Reader, Sample, frame, window

__all__ = ["pool_at_max", "scale_flapping", "scale_out_lag", "spend_per_hour_change"]

DECISIONS = ["scale_out", "scale_in", "held_at_max"]


def _prices(ctx: Context) -> dict[str, float]:
    """USD per GPU-hour by GPU type (metadata DB), read once per cycle (the cost readers' key)."""
    from storage.catalog import gpu_prices

    if ("prices",) not in ctx.cache:
        ctx.cache[("prices",)] = gpu_prices(ctx.sessions) if ctx.sessions is not None else {}
    prices: dict[str, float] = ctx.cache[("prices",)]
    return prices


def _events(fn: Callable[[Context, Params, datetime], list[Sample]]) -> Reader:
    """``fn``, answering no samples on a store without the ``scale_events`` table (not migrated to
    0013 yet: no autoscaler wrote there), rather than an error every cycle."""

    @wraps(fn)
    def read(ctx: Context, p: Params, at: datetime) -> list[Sample]:
        try:
            return fn(ctx, p, at)
        except DatabaseError as exc:
            if "UNKNOWN_TABLE" not in str(exc):
                raise
            return []

    return read


@_events
def pool_at_max(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """Per pool with a decision in the window: 1 while its last decision is ``held_at_max`` (the
    autoscaler wanted more replicas and the pool is at ``max_replicas``; no scale-in since), else 0.
    ``$extra.replicas``: the pool's size then."""
    from analytics.elasticity import scale_events

    start, end = window(at, p)
    df = scale_events(ctx.client, start, end, kinds=DECISIONS)
    out = []
    for pool, part in df.groupby("pool", sort=True):
        last = part.iloc[-1]
        held = last["kind"] == "held_at_max"
        out.append(Sample({"model": str(pool)}, 1.0 if held else 0.0, {"replicas": float(last["to_replicas"])}))
    return out


@_events
def scale_flapping(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """Per pool with scale decisions: the direction changes (out after in, in after out) within
    the window."""
    from analytics.elasticity import flapping

    start, end = window(at, p)
    df = flapping(ctx.client, start, end, window_s=float(p["window"])).rename(columns={"pool": "model"})
    return frame(df, ["model"], "reversals")


@_events
def scale_out_lag(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """Per pool, its latest scale-out in the window: seconds from the signal's crossing to the new
    replica's first token, or to ``at`` while it does not serve yet (the value grows while users
    wait). A scale-out followed by a scale-in before it served is over: no sample.
    ``$extra.time_to_ready``: its decision -> ready, when ready."""
    from analytics.elasticity import cold_starts, scale_events

    start, end = window(at, p)
    starts = cold_starts(ctx.client, start, end)
    ins = scale_events(ctx.client, start, end, kinds=["scale_in"])
    out = []
    for pool, part in starts.groupby("pool", sort=True):
        last = part.iloc[-1]
        lag = float(last["scale_out_lag_s"])
        if pd.isna(last["serving_at"]):
            later_in = ins[(ins["pool"] == pool) & (ins["ts"] > last["decided_at"])]
            if len(later_in):
                continue
            since = last["crossed_at"] if pd.notna(last["crossed_at"]) else last["decided_at"]
            lag = (pd.Timestamp(at) - since).total_seconds()
        extra = {} if pd.isna(last["time_to_ready_s"]) else {"time_to_ready": float(last["time_to_ready_s"])}
        out.append(Sample({"model": str(pool)}, lag, extra))
    return out


def spend_per_hour_change(ctx: Context, p: Params, at: datetime) -> list[Sample]:
    """Percent change of the spend per hour: the last ``window`` against the ``baseline`` before
    it, per model pool or for the fleet (``model="(fleet)"``). ``$extra.before``, ``$extra.after``:
    USD per hour."""
    from analytics.elasticity import spend_per_hour

    try:
        df = spend_per_hour(
            ctx.client, at, _prices(ctx), window_s=float(p["window"]), baseline_s=float(p["baseline"]), by=p["by"]
        )
    except KeyError:  # replicas without a gpu_type label or price: nothing to say, not an error
        return []
    return [
        Sample({"model": str(model)}, float(change), {"before": float(before), "after": float(after)})
        for model, change, before, after in zip(
            df["model"], df["change"], df["baseline_usd_per_hour"], df["recent_usd_per_hour"], strict=True
        )
    ]
