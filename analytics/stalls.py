"""Stalled engines: requests in the engine, and no token generated.

A wedged worker, a collective that never returns, a scheduler bug: the engine still answers
``/metrics`` (so ``up`` stays 1), it holds requests (``vllm:num_requests_running`` and
``vllm:num_requests_waiting``: a wedged engine admits nothing, so new ones wait) and its
``vllm:generation_tokens_total`` stops growing. Averages over a pool hide it; this names it.

In:  a client, a window ``[start, end)``, optionally a step (default about 120 points, at least
     ``MIN_STEP_S`` and the tier's resolution), ``Filters`` (model, replica).
Out: - ``stalled_steps``: ``[ts, replica, model, requests, stalled]``, one row per step in which
       the replica reported ``vllm:num_requests_running`` and one before it (a replica's first
       step, without a counter value before it, cannot show progress): ``requests`` the fewest it held in the
       step (the lowest running plus the lowest waiting), ``stalled`` when that is at least one
       and ``vllm:generation_tokens_total`` did not grow in the step (a reset-aware increase,
       ``analytics.timeseries``);
     - ``replica_models``: each replica's model pool, as its series last said;
     - ``stalls``: the episodes, ``[replica, model, since, until, seconds, requests, ongoing]``:
       runs of stalled steps of one replica (steps without samples in between, up to
       ``GAP_STEPS``, do not break a run; a step with tokens does), ``seconds`` from the first
       stalled step's start to the last one's end, ``requests`` the requests held (the highest
       of the steps' fewest), ``ongoing`` when the run reaches the replica's last step with
       samples in the window and that step ends at most ``GAP_STEPS`` steps before ``end``.
       ``min_seconds`` keeps the longer ones.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
from typing_extensions import Unpack

from analytics.timeseries import auto_step, counter_rates_over_time, gauges_over_time
from analytics.vllm import GENERATION_TOKENS, REQUESTS_RUNNING, REQUESTS_WAITING
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = ["GAP_STEPS", "GENERATION", "MIN_STEP_S", "episodes", "replica_models", "stalled_steps", "stalls"]

RUNNING, WAITING, GENERATION = REQUESTS_RUNNING, REQUESTS_WAITING, GENERATION_TOKENS
MIN_STEP_S = 15  # a step holds a few scrapes (5-15 s apart): a tokenless step is not one late scrape
GAP_STEPS = 2  # steps without samples (failed scrapes) a stall runs across

COLUMNS = ["replica", "model", "since", "until", "seconds", "requests", "ongoing"]


def stalled_steps(
    client: Client, start: datetime, end: datetime, *, step: float | None = None, **scope: Unpack[Scope]
) -> pd.DataFrame:
    """Per step and replica: the fewest requests held and whether the replica was stalled."""
    kw = scope
    if step is None:
        step = max(MIN_STEP_S, auto_step(start, end))
    # read from a step earlier, then drop each replica's first step: a step without a value before
    # it (a replica that just appeared) cannot show tokens generated, so it says nothing
    lead = start - timedelta(seconds=step)
    gauges = gauges_over_time(client, [RUNNING, WAITING], lead, end, "replica", step=step, **kw)
    s = int(gauges.attrs["step"])
    tokens = counter_rates_over_time(client, [GENERATION], lead, end, "replica", step=s, **kw)
    models = replica_models(client)
    keys = ["ts", "replica"]
    out = gauges.loc[gauges["metric"] == RUNNING, keys + ["min"]].rename(columns={"min": "running"})
    waiting = gauges.loc[gauges["metric"] == WAITING, keys + ["min"]].rename(columns={"min": "waiting"})
    out = out.merge(waiting, on=keys, how="left").merge(tokens[keys + ["increase"]], on=keys, how="left")
    out["requests"] = out["running"] + out["waiting"].fillna(0)
    # a step whose counter has no sample says nothing about tokens: not stalled, not progress
    out["stalled"] = (out["requests"] >= 1) & (out["increase"] == 0)
    out["model"] = [models.get(str(r), "") for r in out["replica"]]
    out = out.sort_values(["replica", "ts"], ignore_index=True)
    first = out.groupby("replica")["ts"].transform("min") == out["ts"]
    begin = pd.Timestamp(start).tz_convert("UTC") if pd.Timestamp(start).tzinfo else pd.Timestamp(start, tz="UTC")
    out = out[~first & (out["ts"] > begin - pd.Timedelta(seconds=s))]
    out = out[["ts", "replica", "model", "requests", "stalled"]].reset_index(drop=True)
    out.attrs.update(step=s, plan=gauges.attrs.get("plan"), end=end)
    return out


def stalls(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    min_seconds: float = 0.0,
    step: float | None = None,
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """The stall episodes in ``[start, end)`` lasting at least ``min_seconds``, longest first."""
    steps = stalled_steps(client, start, end, step=step, **scope)
    return episodes(steps, min_seconds)


def episodes(steps: pd.DataFrame, min_seconds: float = 0.0) -> pd.DataFrame:
    """``stalls`` from a ``stalled_steps`` frame already read (no query). Column arithmetic, not a
    loop over steps: 30 days of 200 replicas are 24,000 steps."""
    step = pd.Timedelta(seconds=int(steps.attrs.get("step", MIN_STEP_S)))
    end: pd.Timestamp | None = None
    if steps.attrs.get("end") is not None:
        end = pd.Timestamp(steps.attrs["end"])
        end = end.tz_localize("UTC") if end.tzinfo is None else end
    if not steps["stalled"].astype(bool).any():
        out = pd.DataFrame(columns=COLUMNS)
        out.attrs.update(steps.attrs)
        return out
    s = steps.sort_values(["replica", "ts"], ignore_index=True)
    by = s.groupby("replica", sort=False)
    stalled = s["stalled"].astype(bool)
    gap = (s["ts"] - by["ts"].shift()) > step * (GAP_STEPS + 1)  # steps without samples in between
    after_stall = by["stalled"].shift(fill_value=False).astype(bool)
    # a run begins at a stalled step whose step before (of the same replica) was not stalled, or far
    begins = stalled & (~after_stall | gap)
    run = begins.cumsum()[stalled]
    last_of_replica = ~s["replica"].duplicated(keep="last")
    runs = (
        s[stalled]
        .assign(run=run, last=last_of_replica[stalled])
        .groupby("run", sort=False)
        .agg(
            replica=("replica", "first"),
            model=("model", "first"),
            since=("ts", "min"),
            last_ts=("ts", "max"),
            requests=("requests", "max"),
            reaches_last=("last", "any"),
        )
    )
    out = pd.DataFrame(
        {
            "replica": runs["replica"].astype(str),
            "model": runs["model"].astype(str),
            "since": runs["since"],
            "until": runs["last_ts"] + step,
        }
    )
    out["seconds"] = (out["until"] - out["since"]).dt.total_seconds()
    out["requests"] = runs["requests"].astype(int)
    # ongoing: the run reaches the replica's last step, and that step ends near the window's end
    near_end = True if end is None else runs["last_ts"] + step >= end - step * GAP_STEPS
    out["ongoing"] = (runs["reaches_last"] & near_end).astype(bool)
    out = out[out["seconds"] >= min_seconds].sort_values(
        ["seconds", "replica"], ascending=[False, True], ignore_index=True
    )[COLUMNS]
    out.attrs.update(steps.attrs)
    return out


def replica_models(client: Client) -> dict[str, str]:
    """Each replica's model as its series last said (series rows carry no window of their own)."""
    rows = client.query(
        "SELECT replica, argMax(model, last_seen) FROM series WHERE metric = {m:String} GROUP BY replica",
        parameters={"m": RUNNING},
    ).result_rows
    return {str(r): str(m) for r, m in rows}
