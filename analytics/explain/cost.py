"""Explain a rise in cost per 1M tokens: find its break, then attribute the change to its causes.

In:  a client, a window ``[start, end)``, GPU prices, ``Filters`` (one tenant, model, LoRA adapter
     or route is the view explained; none: the fleet), ``TokenWeights``, optionally a step and a
     time to explain (``at``: the break is taken there instead of found).
Out: a ``CostExplanation``:
     - ``series``: ``[ts, value, spend, tokens]``, the view's cost per 1M tokens per step
       (``analytics.cost_series``); ``break_at`` (the start of the rise, found as ``explain``
       finds a latency's: change points on the log, the run that stays 1.5x above the level
       before it), ``before`` / ``after`` (USD per 1M tokens over the two periods: the showback's
       figures for those periods, ``analytics.allocation``'s rule) and ``periods`` (the
       baseline's start, the break, the rise's end);
     - ``pools``: per model pool and period: spend, tokens, the view's tokens and its part of the
       spend, the pool's cost per 1M, replicas up, GPU-hours, idle and cached shares;
     - ``decomposition``: the change, after - before, as Shapley parts over the rule's factors
       (``analytics.explain.cost_parts``: the view's own ``traffic``, one row however many pools it
       passed through; each pool's ``volume``, the other tokens it is shared with; each pool's
       ``spend``); the parts add up to the change exactly and depend on no order. Each row has
       ``usd_per_million``, ``share`` of the change and ``detail`` in words;
     - ``flows``: per tenant and pool, tokens and the tenant's share of its tokens in the pool,
       before and after (whose tokens left or arrived); ``routes``: per tenant, route and
       reason (the gateway's ``route_reason``, its numbers left out to group them), requests
       before and after; ``movers``: the tenants whose tokens changed pool, with the route and
       reason that sent them and their median prompt length before and after;
     - ``scaling``: the autoscaler's scale-outs and scale-ins in the periods (``scale_events``),
       per decision: pool, from -> to replicas, the signal with its value and threshold, when it
       crossed, the replica and when it was ready and first served (``cost_queries.scaling``).
       Replicas added are the ``spend`` part's cause: its ``detail`` names each scale-out, and
       the sentence names them for every pool the view pays for, whatever their part's rank
       (the fleet's or a pool's cost per token may show no lasting rise while its bill jumped,
       its tokens growing with its spend: then the break is found in its spend per hour and the
       sentence says so first; where neither rose, the sentence still names the window's scale
       events, and how to compare both sides of one with ``at``);
     - ``evidence``: the decomposition's rows that moved the cost, ranked by their share of the
       change; ``problems``: what could not be computed, in words; ``sentence``: one line,
       "consistent with", in dollars per 1M tokens per part.
``to_dict`` is the ``fleetscope explain --metric cost --format json`` document.

Tokens: the fleet's and a pool's from the engines' counters (as ``cost_per_token`` counts them);
a tenant's, route's or adapter's from the request log (the gateway's when it has rows: it knows
tenants, routes and why the router chose them), with its part of each pool's spend shared bucket
by bucket (``analytics.allocation``). Without a request log the fleet and its pools are explained
from the engines alone, with no tenants or routes.

The steps: ``cost_queries`` (every read), ``cost_scoring`` (the periods, the sides, the flows and
the decomposition: pure pandas), ``cost_parts`` (the Shapley arithmetic), ``cost_words`` (the
sentence and the parts' details), ``cost_model`` (the ``CostExplanation``); this module runs them.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd

from analytics.allocation import TokenWeights
from analytics.cost_series import cost_over_time
from analytics.errors import Unexplainable
from analytics.explain import cost_queries
from analytics.explain.cost_model import MIN_STEPS, CostExplanation, Steps, View
from analytics.explain.cost_parts import decompose, level
from analytics.explain.cost_scoring import decomposition, flows, in_period, movers, periods, pool_rows, side
from analytics.explain.cost_words import Words, scaling_note, sentence
from analytics.filters import Filters
from analytics.gateways import gaps
from analytics.requests import log_source
from common.timeutil import as_utc
from storage.clickhouse import Client

__all__ = ["CostExplanation", "explain_cost"]

Periods = tuple[datetime, datetime, datetime]


def explain_cost(
    client: Client,
    start: datetime,
    end: datetime,
    prices: dict[str, float],
    *,
    filters: Filters | None = None,
    weights: TokenWeights | None = None,
    step: float | None = None,
    at: datetime | None = None,
) -> CostExplanation:
    """Find the break in the view's cost per 1M tokens over ``[start, end)`` (or take it ``at`` a
    time) and attribute the change (module docstring)."""
    start, end = as_utc(start), as_utc(end)
    view = cost_queries.view(client, filters)
    source = log_source(client, start, end, None)
    gateway_gaps = gaps(client, start, end, source)
    if view.payer and (source is None or (view.by == "tenant" and source != "gateway")):
        raise Unexplainable(
            f"no {'request log' if source is None else 'gateway request log'} between {start:%H:%M} and "
            f"{end:%H:%M} UTC: a {view.by}'s cost needs it (the gateway's log, or the engines' spans for routes "
            "and adapters)" + "".join(f". {gap}" for gap in gateway_gaps)
        )
    series = cost_over_time(client, start, end, prices, by=view.by, step=step, weights=weights, filters=view.pick())
    s, tier = int(series.attrs["step"]), series.attrs["plan"].tier.name
    if view.value is not None:
        series = series[series[view.by] == view.value]
    series = series.rename(columns={"cost_per_million_tokens": "value"})[["ts", "value", "spend", "tokens"]]
    ex = CostExplanation(
        view.words,
        f"request log ({source})" if view.payer else "engine counters",
        s,
        series.reset_index(drop=True),
    )
    ex.problems.extend(gateway_gaps)
    found = _periods(ex, view, series, at, (start, end))
    bill = None
    if found is None and not view.payer and "no lasting rise" in ex.sentence:
        # the fleet's (a pool's) bill may have jumped while its tokens grew with it (a pool scaled out
        # for heavier traffic): the break in its spend per hour is the one to explain
        bill = _bill_break(series, s, (start, end))
        if bill is None:
            found_scaling = cost_queries.scaling(client, (start, start, end))
            ex.scaling = found_scaling[found_scaling["pool"] == view.value] if view.value else found_scaling
            ex.sentence += scaling_note(ex.scaling)
            return ex
        found = bill[0]
    if found is None:
        return ex
    ex.break_at, ex.periods = found[1], found
    _attribute(ex, client, view, cost_queries.steps(client, found, prices, weights, s, tier, source), source)
    if bill is not None and ex.break_at is not None:
        ex.sentence = _bill_words(view.words, bill[1], bill[2], ex.break_at) + ex.sentence
    return ex


def _bill_break(series: pd.DataFrame, s: int, window: tuple[datetime, datetime]) -> tuple[Periods, float, float] | None:
    """The lasting rise of the spend per hour (periods, before and after in USD per hour), or None.
    Only whole steps count: one the window cuts holds part of a step's spend (a cost per token
    does not mind: its tokens are cut alike)."""
    ts = pd.to_datetime(series["ts"], utc=True)
    whole = (ts >= pd.Timestamp(window[0])) & (ts + pd.Timedelta(seconds=s) <= pd.Timestamp(window[1]))
    spend = series[whole & series["spend"].notna() & (series["spend"] > 0)].reset_index(drop=True)
    if len(spend) < MIN_STEPS:
        return None
    found, _why = periods(spend.assign(value=spend["spend"]), s, None)
    if found is None:
        return None
    per_hour = 3600.0 / s

    def mean(a: datetime, b: datetime) -> float:
        ts = pd.to_datetime(spend["ts"], utc=True)
        return float(spend["spend"][(ts >= pd.Timestamp(a)) & (ts < pd.Timestamp(b))].mean()) * per_hour

    return found, mean(found[0], found[1]), mean(found[1], found[2])


def _bill_words(view: str, before: float, after: float, at: datetime) -> str:
    pct = f"{(after / before - 1) * 100:+.0f}%" if before > 0 else "from nothing"
    return (
        f"The spend per hour of {view} rose from ${before:,.4g} to ${after:,.4g} at {at:%H:%M:%S} UTC ({pct}) "
        "while its tokens grew too. "
    )


def _periods(
    ex: CostExplanation, view: View, series: pd.DataFrame, at: datetime | None, window: tuple[datetime, datetime]
) -> Periods | None:
    """The periods compared (baseline start, break, end of the rise), or None with the sentence
    saying why there are none."""
    start, end = window
    steps = series.dropna(subset=["value"]).reset_index(drop=True)
    needed = MIN_STEPS if at is None else 2  # a break to find, or one given: a step on each side
    if len(steps) < needed:
        ex.sentence = (
            f"not enough steps with tokens for {view.words} between {start:%H:%M} and {end:%H:%M} UTC to "
            f"{'find a' if at is None else 'compare both sides of the'} break ({len(steps)} of {needed})."
        )
        return None
    found, why = periods(steps, ex.step, at)
    if found is None:
        ex.sentence = (
            f"Cost per 1M tokens of {view.words} shows no lasting rise between {start:%H:%M} and {end:%H:%M} UTC."
            if why == "no lasting rise"
            else f"Cost per 1M tokens of {view.words}: {why}."
        )
    return found


def _attribute(ex: CostExplanation, client: Client, view: View, data: Steps, source: str | None) -> None:
    """The change over ``ex.periods`` in parts, with the flows, movers, pools, evidence and sentence."""
    assert ex.periods is not None
    p = ex.periods
    (side_b, table_b), (side_a, table_a) = side(data, view, p[0], p[1]), side(data, view, p[1], p[2])
    for name, t in (("before", table_b), ("after", table_a)):
        for pool in t[(t["spend"] > 0) & (t["pool_tokens"] <= 0)].index:
            ex.problems.append(f"{pool} served no tokens {name} the break: its spend is the fleet's all the same")
    try:
        parts = decompose(side_b, side_a, shared=view.payer)
    except ValueError as exc:  # NoData (no tokens served), or any refusal of the parts: said, not raised
        ex.problems.append(f"{exc} for {view.words}: its cost per token is undefined there")
        ex.sentence = f"Cost per 1M tokens of {view.words}: {exc}, so the change cannot be attributed."
        return
    ex.before, ex.after = level(side_b) * 1e6, level(side_a) * 1e6
    ex.routes = cost_queries.routes(client, p, source)
    ex.flows = flows(in_period(data.payers, p[0], p[1]), in_period(data.payers, p[1], p[2]))
    ex.movers = movers(ex.flows, ex.routes)
    ex.pools = pool_rows(table_b, table_a)
    hours = [max((b - a).total_seconds(), 1.0) / 3600 for a, b in zip(p, p[1:], strict=False)]
    rates = ex.flows.assign(tokens_before=ex.flows["tokens_before"] / hours[0])
    rates["tokens_after"] = rates["tokens_after"] / hours[1]
    ex.scaling = cost_queries.scaling(client, p)
    words = Words(view, table_b, table_a, (side_b.x, side_a.x), rates, ex.movers, ex.scaling)
    change = ex.after - ex.before
    ex.decomposition = decomposition(parts, change, words)
    moved = ex.decomposition["usd_per_million"].abs() > 1e-9 * max(abs(change), 1e-9)
    ex.evidence = ex.decomposition[moved].sort_values("share", ascending=False, ignore_index=True)
    ex.sentence = sentence(ex, words)
