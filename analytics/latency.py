"""Tail latency over time: TTFT, inter-token latency, TPOT, e2e and queue time at p50/p90/p95/p99.

In:  a client, a latency name (``LATENCIES``), a window, quantile levels, ``by`` (model or
     replica), a step (``analytics.timeseries.auto_step`` when omitted) and ``Filters``.
Out: one long DataFrame ``[ts, source, by, q, value, count]`` with both views, labelled by source:
     - ``engine histograms``: Prometheus ``histogram_quantile`` over the engines' bucket increases
       per step (every request, bucket-interpolated; per model or replica; no tenant or route);
     - ``request log``: exact weighted quantiles of the sampled request rows per step (raw rows;
       t-digest on rollups), which honour tenant and route filters too. Per replica only on the
       raw tier (the request rollups are kept without replica).
     ``count`` is the step's observations (histograms) or weighted requests (request log).
     ``.attrs``: ``plan`` (per source), ``step``, ``unapplied`` (filters a source ignored),
     ``heatmap``: ``analytics.timeseries.histogram_heatmap_over_time`` of the family, from the
     same query as its quantiles (empty without the engine histograms).
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd
from typing_extensions import Unpack

from analytics.errors import BadInput
from analytics.requests import request_quantiles, request_totals
from analytics.tiers import plan_scope
from analytics.timeseries import histograms, stepped_plan
from analytics.vllm import LATENCIES
from analytics.window import Scope
from storage.clickhouse import Client

__all__ = ["LATENCIES", "LEVELS", "SOURCES", "latency_over_time"]

LEVELS = (0.5, 0.9, 0.95, 0.99)
SOURCES = ("engine histograms", "request log")


def latency_over_time(
    client: Client,
    latency: str,
    start: datetime,
    end: datetime,
    *,
    levels: tuple[float, ...] | list[float] = LEVELS,
    by: str = "model",
    step: float | None = None,
    sources: tuple[str, ...] = SOURCES,
    request_source: str | None = "gateway",
    **scope: Unpack[Scope],
) -> pd.DataFrame:
    """Quantiles of ``latency`` per step and ``by`` from the sources asked for (see module doc)."""
    if latency not in LATENCIES:
        raise BadInput(f"unknown latency {latency!r}; one of {', '.join(LATENCIES)}")
    if by not in ("model", "replica"):
        raise BadInput("by must be 'model' or 'replica'")
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise BadInput(f"unknown source {min(unknown)!r}; one of {', '.join(SOURCES)}")
    family, field = LATENCIES[latency].family, LATENCIES[latency].sketch
    columns = ["ts", "source", by, "q", "value", "count"]
    _p, step_s = stepped_plan(plan_scope(client, start, end, scope), step)
    frames, plans, unapplied = [], {}, {}
    heatmap = pd.DataFrame(columns=["ts", "low", "high", "count"])
    if "engine histograms" in sources:
        found = histograms(client, [family], levels, start, end, by, step=step_s, **scope)[family]
        hist, heatmap = found.steps, found.heatmap
        hist["source"] = "engine histograms"
        frames.append(hist[columns])
        plans["engine histograms"], unapplied["engine histograms"] = hist.attrs["plan"], hist.attrs["unapplied"]
    if "request log" in sources:
        q = request_quantiles(client, [field], levels, start, end, by=[by], source=request_source, step=step_s, **scope)
        n = request_totals(client, start, end, by=[by], source=request_source, step=step_s, **scope)
        long = q.melt(id_vars=["ts", by], var_name="q", value_name="value")
        long["q"] = long["q"].str.rsplit("_q", n=1).str[1].astype(float)
        long = long.merge(n[["ts", by, "requests"]].rename(columns={"requests": "count"}), on=["ts", by], how="left")
        long["source"] = "request log"
        frames.append(long[columns])
        plans["request log"], unapplied["request log"] = q.attrs["plan"], []
    frames = [f for f in frames if len(f)]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    df = df.sort_values(["source", "ts", by, "q"], ignore_index=True)
    df.attrs.update(plan=plans, step=step_s, unapplied=unapplied, heatmap=heatmap)
    return df
