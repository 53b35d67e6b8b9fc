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
from typing import NamedTuple

import pandas as pd
from typing_extensions import Unpack

from analytics.timeseries import auto_step, counter_rates_over_time, gauges_over_time
from analytics.vllm import GENERATION_TOKENS, REQUESTS_RUNNING, REQUESTS_WAITING
from analytics.window import Scope, scope_parts
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
    tier, retention, now, filters = scope_parts(scope)
    steps = stalled_steps(client, start, end, step=step, filters=filters, tier=tier, retention=retention, now=now)
    return episodes(steps, min_seconds)


class _Step(NamedTuple):
    ts: pd.Timestamp
    model: str
    requests: float
    stalled: bool


def episodes(steps: pd.DataFrame, min_seconds: float = 0.0) -> pd.DataFrame:
    """``stalls`` from a ``stalled_steps`` frame already read (no query)."""
    step = pd.Timedelta(seconds=int(steps.attrs.get("step", MIN_STEP_S)))
    end: pd.Timestamp | None = None
    if steps.attrs.get("end") is not None:
        end = pd.Timestamp(steps.attrs["end"])
        end = end.tz_localize("UTC") if end.tzinfo is None else end
    rows: list[dict[str, object]] = []
    for replica, group in steps.groupby("replica", sort=True):
        frame = group.sort_values("ts")
        seen = [
            _Step(pd.Timestamp(t), str(m), float(n), bool(x))
            for t, m, n, x in zip(frame["ts"], frame["model"], frame["requests"], frame["stalled"], strict=True)
        ]
        run: list[_Step] = []
        last_ts: pd.Timestamp | None = None
        for row in seen:
            broken = last_ts is not None and row.ts - last_ts > step * (GAP_STEPS + 1)
            if run and (broken or not row.stalled):
                rows.append(_episode(str(replica), run, step, ongoing=False))
                run = []
            if row.stalled:
                run.append(row)
            last_ts = row.ts
        if run:
            reaches_end = end is None or run[-1].ts + step >= end - step * GAP_STEPS
            rows.append(_episode(str(replica), run, step, ongoing=bool(reaches_end)))
    out = pd.DataFrame(rows, columns=COLUMNS)
    out = out[out["seconds"] >= min_seconds].sort_values(
        ["seconds", "replica"], ascending=[False, True], ignore_index=True
    )
    out.attrs.update(steps.attrs)
    return out


def _episode(replica: str, run: list[_Step], step: pd.Timedelta, *, ongoing: bool) -> dict[str, object]:
    since, until = run[0].ts, run[-1].ts + step
    return {
        "replica": replica,
        "model": run[0].model,
        "since": since,
        "until": until,
        "seconds": (until - since).total_seconds(),
        "requests": int(max(r.requests for r in run)),
        "ongoing": ongoing,
    }


def replica_models(client: Client) -> dict[str, str]:
    """Each replica's model as its series last said (series rows carry no window of their own)."""
    rows = client.query(
        "SELECT replica, argMax(model, last_seen) FROM series WHERE metric = {m:String} GROUP BY replica",
        parameters={"m": RUNNING},
    ).result_rows
    return {str(r): str(m) for r, m in rows}
