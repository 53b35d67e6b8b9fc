"""Explain a regression: find the break in a latency quantile, line up what moved with it, and
say what the evidence is consistent with.

The steps: ``queries`` (every read of the store), ``scoring`` (the evidence from what was
read: pure pandas, testable without ClickHouse), ``words`` (the sentence), ``model`` (the
``Explanation`` and the thresholds); this module runs them in order.

In:  a client, a window ``[start, end)``, the latency and quantile to explain (default p99
     TTFT), optionally a step (default about 180 points; the quantile series widens it until a
     step holds ``MIN_PER_STEP`` requests on average over the time the requests cover; a
     window its requests cover less than half of is stepped over the part they cover, at least
     ``COVERED_MIN_STEP_S`` and whole buckets of the samples' tier), ``Filters`` and GPU prices.
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
       rate, replicas up, late scale-out, request rate) and the gateway's shedding: ``before`` / ``after`` (in words),
       ``moved_at`` (its own change point near the break; a late scale-out's: when its signal
       crossed), ``lead_s`` (seconds it moved before the break; negative: after) and
       ``detail``; ties (scores within 0.02) go to the signal nearer a decision (``PRIORITY``:
       tenant, route, prompt length, model, then capacity), and a traffic-mix signal timed on
       the requests that scores near the top capacity signal and moved no later goes before it
       (``scoring.cause_first``); ``onset``: when the regression
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
no longer fit; queueing: requests waiting below that), or its relative change; a late scale-out
the share of the regression spent waiting for a replica the autoscaler had decided on (from its
decision to its first token; it never sets the onset: it answers the regression); the gateway's
shedding (request log from the gateway) the rise in the share of requests it shed, listed after the
causes and named in the sentence ("the gateway shed 18% of requests (queue-time budget) while
tiny-small was saturated"): the admitted requests' latency is what is left after it. Where the
latency shows no lasting rise and the gateway shed at least ``HELD_MIN_SHARE`` of the requests of
its shedding episode, the sentence says the shedding held it and its row is the evidence. A signal that
moved more than two steps after the break scores half: it followed the regression rather than
led it. Request-level evidence reads the raw request
log (kept ``requests_days``), so explain windows within it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from analytics.changepoints import regression
from analytics.cost import cost_per_token
from analytics.errors import BadInput
from analytics.explain import queries, scoring, words
from analytics.explain.model import COVERED_MIN_STEP_S, LONG_FACTOR, MIN_PER_STEP, Explanation
from analytics.filters import Filters
from analytics.gateways import gaps
from analytics.prefix import misses_words, prefix_misses
from analytics.requests import log_source
from analytics.tiers import plan
from analytics.timeseries import auto_step
from analytics.vllm import LATENCIES
from common.timeutil import as_utc
from storage.clickhouse import Client

__all__ = ["Explanation", "cost_around", "explain", "quantile_series"]


def quantile_series(
    client: Client,
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
        raise BadInput(f"unknown latency {latency!r}; one of {', '.join(LATENCIES)}")
    if not 0 < q < 1:
        raise BadInput(f"q must be within (0, 1), got {q}")
    start, end = as_utc(start), as_utc(end)
    step_s = int(step) if step else auto_step(start, end, points=180)
    source = log_source(client, start, end, filters)
    column = LATENCIES[latency].column
    coarse = step_s
    if source is not None:  # enough requests per step for a quantile to mean something
        where, params = queries.requests_where(start, end, source, filters)
        rows_n, first, last = queries.count_span(client, f"{where} AND {column} > 0", params)
        if rows_n and first is not None and last is not None:
            covered = max((last - first).total_seconds(), 1.0)
            if not step and covered < (end - start).total_seconds() / 2:
                # a young fleet (a demo's 6 minutes in the 2 hours an alert's link asks for): stepped over the
                # time its requests cover, not the window's (60 s steps found "no lasting rise" in a rollout that
                # 5 s steps explain)
                # whole buckets of the tier the window's samples come from (a 24 h range reads the 1-minute
                # rollup: 5 s steps there would leave 11 of 12 capacity steps empty)
                step_s = auto_step(first, last, plan(start, end), points=180, minimum=COVERED_MIN_STEP_S)
                coarse = step_s
            wanted = max(covered, step_s) * MIN_PER_STEP / rows_n
            coarse = max(step_s, auto_step(start, start + timedelta(seconds=max(wanted, 1)), points=1))
            coarse = -(-coarse // step_s) * step_s
    series = queries.metric_series(client, latency, q, start, end, coarse, source, filters)
    return Explanation(
        f"p{q * 100:g} {latency}",
        "request log" if source else "engine histograms",
        step_s,
        series,
        request_step=coarse,
        log_source=source,
    )


def _full_steps(series: pd.DataFrame) -> pd.DataFrame:
    """``series`` without the steps at either end that hold under a third of a step's median
    requests: a window that begins or ends inside a step, or runs past the traffic's end, has a
    last step of a few requests whose quantile is no level (a demo's last 10 s of a 60 s step:
    p99 0.06 s after minutes at 2-18 s, and the one split the series allows went to that fall)."""
    if "n" not in series or len(series) < 3:
        return series
    enough = series["n"].to_numpy() >= float(series["n"].median()) / 3
    first, last = int(enough.argmax()), len(enough) - int(enough[::-1].argmax())
    return series.iloc[first:last].reset_index(drop=True) if enough.any() else series


def explain(
    client: Client,
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
    series, step_s, coarse, column = _full_steps(ex.series), ex.step, ex.request_step, LATENCIES[latency].column
    source = ex.log_source
    ex.notes = gaps(client, start, end, source)
    if len(series) < 8:
        ex.sentence = f"not enough data between {start:%H:%M} and {end:%H:%M} to find a break ({len(series)} steps)."
        return ex
    values = np.log(np.maximum(series["value"].to_numpy(float), 1e-4))
    bounds, levels, found = regression(values)
    for i, k in enumerate(bounds[1:-1]):
        ex.breaks.append({"ts": series["ts"].iloc[k], "before": math.exp(levels[i]), "after": math.exp(levels[i + 1])})
    if found is None:
        ex.sentence = f"{ex.metric} shows no lasting rise between {start:%H:%M} and {end:%H:%M} UTC."
        if source == "gateway":
            _held_by_shedding(client, ex, start, end, coarse, filters)
        return ex
    base, first, last = found  # segments [first, last) are the regression, ``base`` the level before
    ex.break_at = series["ts"].iloc[bounds[first]].to_pydatetime()
    if source is not None:  # sharpen it on the requests themselves, in arrival order
        ex.break_at = _sharpen(client, ex.break_at, (start, end), source, filters, column, coarse)
    ex.before = math.exp(levels[base])
    ex.after = float(np.exp(values[bounds[first] : bounds[last]].mean()))
    baseline_start = series["ts"].iloc[bounds[base]].to_pydatetime() if base > 0 else start
    after_end = series["ts"].iloc[bounds[last]].to_pydatetime() if last < len(levels) else end
    break_ts = pd.Timestamp(ex.break_at)

    # the fleet's capacity signals over the whole window (the page draws them), judged from the baseline on
    ex.capacity = queries.capacity(client, start, end, step_s, filters)
    index = ex.capacity.index
    judged = ex.capacity[
        (index >= pd.Timestamp(baseline_start).floor(f"{step_s}s")) & (index < pd.Timestamp(after_end))
    ]
    rows = scoring.capacity_evidence(judged, break_ts, pd.Timestamp(after_end), step_s)
    # the regression spent waiting for a replica the autoscaler decided on (none without scale events)
    outs = queries.scale_outs(client, start, end, filters)
    rows += scoring.scaling_evidence(outs, break_ts, pd.Timestamp(after_end), step_s)
    if source == "gateway":  # the gateway's shedding: its answer to the regression (only a gateway sheds)
        shed = queries.shedding(client, baseline_start, after_end, coarse, filters)
        rows += scoring.shedding_evidence(shed, break_ts, pd.Timestamp(after_end), coarse)
    if source is not None:
        long_tokens = _request_evidence(client, ex, rows, (baseline_start, after_end), source, filters, (column, q))
    else:
        long_tokens = math.nan
        ex.evidence = scoring.rank(rows)
    ex.periods = (baseline_start, ex.break_at, after_end)
    if prices is not None:
        ex.cost = cost_around(client, ex.periods, prices, filters=filters)
    ex.onset = scoring.onset(ex)
    strata = ex.strata if len(ex.strata) else pd.DataFrame(columns=["band"])
    ex.sentence = words.sentence(ex, latency, q, strata, long_tokens)
    return ex


def _held_by_shedding(
    client: Client, ex: Explanation, start: datetime, end: datetime, step: int, filters: Filters | None
) -> None:
    """No lasting rise, yet the gateway shed: admission by queue time refuses what would wait past
    the budget, so the admitted requests' latency held because of it. ``ex.evidence`` gets the
    shedding's row, judged on its own episode (``scoring.shedding_episode``), and the sentence says
    so; nothing changes where the gateway shed little or nothing."""
    shed = queries.shedding(client, start, end, step, filters)
    episode = scoring.shedding_episode(shed, step)
    if episode is None:
        return
    rows = scoring.shedding_evidence(shed, *episode, step)
    if not rows:
        return
    ex.evidence = scoring.rank(rows)
    ex.sentence = (
        f"{ex.sentence.removesuffix('.')}: {rows[0]['detail']} from {episode[0]:%H:%M:%S} to "
        f"{episode[1]:%H:%M:%S}, so the requests it admitted kept their latency."
    )


def _sharpen(
    client: Client,
    break_at: datetime,
    window: tuple[datetime, datetime],
    source: str,
    filters: Filters | None,
    column: str,
    coarse: int,
) -> datetime:
    """The break found on the quantile's steps, sharpened on the requests themselves: the best
    split of the log latency in arrival order within two steps of it (unchanged without one)."""
    where, params = queries.requests_where(window[0], window[1], source, filters)
    middle = pd.Timestamp(break_at) + pd.Timedelta(seconds=coarse / 2)
    sharp = queries.split_in_rows(
        client,
        f"{where} AND {column} > 0",
        params,
        f"log({column})",
        middle - pd.Timedelta(seconds=2 * coarse),
        middle + pd.Timedelta(seconds=2 * coarse),
    )
    return sharp.to_pydatetime() if sharp is not None else break_at


def _request_evidence(
    client: Client,
    ex: Explanation,
    rows: list[dict[str, Any]],
    span: tuple[datetime, datetime],
    source: str,
    filters: Filters | None,
    measure: tuple[str, float],
) -> float:
    """``ex.evidence`` from the capacity ``rows`` and the request log's (the mix, the BubbleUp
    dimensions, the request rate), the baseline ending at the onset where the traffic changed well
    before the latency did; ``ex.dimensions`` and ``ex.strata`` with it. Returns the long-prompt
    threshold (tokens)."""
    assert ex.break_at is not None
    (baseline_start, after_end), (column, q) = span, measure
    step_s, coarse, break_ts = ex.step, ex.request_step, pd.Timestamp(ex.break_at)
    where, params = queries.requests_where(baseline_start, after_end, source, filters)
    base_where, base_params = queries.requests_where(baseline_start, ex.break_at, source, filters)
    median_tokens, slow = queries.baseline_levels(client, base_where, base_params, column, q)
    long_tokens = LONG_FACTOR * median_tokens
    mix = queries.mix(client, baseline_start, after_end, coarse, source, filters, long_tokens)
    near = queries.rows_near(
        client, where, params, pd.Timestamp(baseline_start), break_ts + pd.Timedelta(seconds=3 * coarse)
    )

    def request_evidence(baseline_end: pd.Timestamp) -> list[dict[str, Any]]:
        ex.dimensions = queries.dimensions(client, where, params, (baseline_end, break_ts), column, slow, long_tokens)
        return scoring.mix_evidence(mix, ex.dimensions, break_ts, step_s, long_tokens, near) + scoring.rate_evidence(
            mix, break_ts, pd.Timestamp(after_end), coarse
        )

    ex.evidence = scoring.rank(rows + request_evidence(break_ts))
    baseline_end = pd.Timestamp(break_ts)
    onset = scoring.onset(ex)
    if onset < ex.break_at - timedelta(seconds=coarse):  # the traffic changed well before the latency did:
        baseline_end = pd.Timestamp(onset)  # the baseline ends there
        ex.evidence = scoring.rank(rows + request_evidence(baseline_end))
    # by prompt length, against the final baseline (the sentence reads it, the onset does not)
    ex.strata = queries.strata(client, where, params, (baseline_end, break_ts), column, q, (median_tokens, long_tokens))
    _why_prefixes_missed(client, ex, pd.Timestamp(after_end).to_pydatetime(), filters)
    return long_tokens


def _why_prefixes_missed(client: Client, ex: Explanation, end: datetime, filters: Filters | None) -> None:
    """Where the prefix-cache hit rate fell, its evidence says why the prefixes missed after the
    break (``analytics.prefix``: routing misses, evictions, new prefixes), from the request log."""
    ev = ex.evidence
    fell = (ev["signal"] == "prefix-cache hit rate") & (ev["score"] > 0)
    if not fell.any() or ex.break_at is None:
        return
    found = prefix_misses(client, ex.break_at, end, filters=filters)
    words = misses_words(found.attrs.get("misses") or {}, found.attrs.get("affinity_hit_rate"))
    if words:
        ev.loc[fell, "detail"] = ev.loc[fell, "detail"].astype(str) + f"; after the break {words}"


def cost_around(
    client: Client,
    periods: tuple[datetime, datetime, datetime] | None,
    prices: dict[str, float],
    *,
    filters: Filters | None = None,
) -> pd.DataFrame:
    """Cost per model in the baseline and in the regression (``Explanation.periods``; ``period``
    before / after): spend, tokens, cost per 1M tokens, idle share; empty without periods (no
    break found)."""
    columns = ["model", "spend", "prompt_tokens", "completion_tokens", "cost_per_million_tokens", "idle_share"]
    if periods is None:
        return pd.DataFrame(columns=[*columns, "period"])
    baseline_start, break_at, after_end = periods
    frames = [
        cost_per_token(client, a, b, prices, filters=filters)[columns].assign(period=period)
        for period, (a, b) in (("before", (baseline_start, break_at)), ("after", (break_at, after_end)))
    ]
    return pd.concat(frames, ignore_index=True)
