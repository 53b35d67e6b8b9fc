"""What a replay (or the recorded fleet) did, as the numbers a plan compares: latency quantiles,
SLO attainment and goodput, prefix-cache hit rate, KV-cache saturation, rejections, spend and
cost per 1M tokens.

In:  a ``planner.replay.Outcome``, GPU prices (USD per GPU-hour), SLO targets
     (``storage.catalog.SloTarget``: per model, ttft / itl / e2e / queue thresholds in seconds).
Out: ``summary``: one row per model and a ``(fleet)`` row: ``requests``, ``p50_ttft``,
     ``p99_ttft``, ``p50_itl``, ``p99_itl`` (seconds; ITL over every token gap),
     ``slo_attainment`` (share of the requests, rejected ones included, that met every target of
     their model; NaN without targets), ``goodput`` (such requests per second), ``hit_rate``
     (cached / prompt tokens), ``kv_mean`` and ``kv_saturated`` (the share of the replicas'
     samples at ``SATURATED`` or more: 90 %, where ``explain`` counts a replica
     saturated), ``rejected`` (the gateway's 429s, engines' 400s and
     requests no replica served), ``spend`` (USD over the window: each replica's up time x GPUs
     x price, as the store's cost analytics bills it: a fixed pool's replicas the whole window,
     an autoscaled pool's from ready — a cold start is not billed, since a starting replica is
     not scraped — to removed), ``cost_per_million_tokens``, ``spend_per_hour``,
     ``max_replicas`` (the most replicas up at once) and ``cold_starts`` (replicas an autoscaler
     made ready in the window).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from analytics.explain.model import SATURATED
from planner.fleet import PlanError
from planner.replay import Outcome
from storage.catalog import SloTarget

__all__ = ["FLEET", "SATURATED", "summary"]

FLEET = "(fleet)"
FIELDS = {"ttft": "ttft", "itl": "itl", "e2e": "e2e", "queue": "queue"}


def _q(values: np.ndarray, q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.quantile(values, q)) if len(values) else math.nan


def _meets(requests: pd.DataFrame, targets: list[SloTarget]) -> pd.Series:
    good = requests["outcome"].eq("ok")
    for t in targets:
        column = FIELDS.get(t.metric)
        if column is None:
            continue
        mine = requests["model"].eq(t.model)
        values = requests[column]
        # a one-token answer has no gap between tokens: nothing to judge its ITL by
        untimed = values.isna() & requests["outcome"].eq("ok") if column == "itl" else False
        good &= ~mine | untimed | (values.fillna(math.inf) <= t.threshold_seconds)
    return good


def summary(outcome: Outcome, prices: Mapping[str, float], targets: Iterable[SloTarget] = ()) -> pd.DataFrame:
    """One row per model and one for the fleet (see the module docstring)."""
    targets = [t for t in targets if t.metric in FIELDS]  # a replay has no TPOT of its own to judge
    req = outcome.requests
    hours = outcome.seconds / 3600
    spend_by_model, up = _spend(outcome, prices)
    good = _meets(req, targets) if len(req) else pd.Series(dtype=bool)
    rows = []
    for model in [*outcome.variant.pools, FLEET]:
        mine = req if model == FLEET else req[req["model"] == model]
        ok = mine[mine["outcome"] == "ok"]
        kv = outcome.kv if model == FLEET else outcome.kv[outcome.kv["model"] == model]
        gaps = (
            np.concatenate(list(outcome.gaps.values()))
            if model == FLEET and outcome.gaps
            else outcome.gaps.get(model, np.array([]))
        )
        spend = sum(spend_by_model.values()) if model == FLEET else spend_by_model.get(model, 0.0)
        tokens = float((ok["prompt_tokens"] + ok["completion_tokens"]).sum())
        prompt = float(ok["prompt_tokens"].sum())
        mine_targets = targets if model == FLEET else [t for t in targets if t.model == model]
        met = good.loc[mine.index] if len(mine) else pd.Series(dtype=bool)
        rows.append(
            {
                "model": model,
                "requests": len(mine),
                "p50_ttft": _q(ok["ttft"].to_numpy(float), 0.5),
                "p99_ttft": _q(ok["ttft"].to_numpy(float), 0.99),
                "p50_itl": _q(np.asarray(gaps, float), 0.5),
                "p99_itl": _q(np.asarray(gaps, float), 0.99),
                "slo_attainment": float(met.mean()) if mine_targets and len(mine) else math.nan,
                "goodput": float(met.sum()) / outcome.seconds if mine_targets and outcome.seconds > 0 else math.nan,
                "hit_rate": float(ok["cached_tokens"].sum()) / prompt if prompt > 0 else math.nan,
                "kv_mean": float(kv["kv"].mean()) if len(kv) else math.nan,
                "kv_saturated": float((kv["kv"] >= SATURATED).mean()) if len(kv) else math.nan,
                "rejected": int((mine["outcome"] != "ok").sum()),
                "spend": spend,
                "spend_per_hour": spend / hours if hours > 0 else math.nan,
                "cost_per_million_tokens": spend / tokens * 1e6 if tokens > 0 else math.nan,
                "max_replicas": _most_at_once(up if model == FLEET else up[up["model"] == model]),
                "cold_starts": _cold_starts(outcome, None if model == FLEET else model),
            }
        )
    return pd.DataFrame(rows)


def _spend(outcome: Outcome, prices: Mapping[str, float]) -> tuple[dict[str, float], pd.DataFrame]:
    """Per model the spend over the window (replica up-seconds x GPUs x price), and the up-intervals it counted."""
    up = outcome.up
    if up is None:  # an outcome without up-intervals: every pool's replicas up throughout
        up = pd.DataFrame(
            [
                (f"{p.model}/{i}", p.model, 0.0, outcome.seconds)
                for p in outcome.variant.pools.values()
                for i in range(p.replicas)
            ],
            columns=["replica", "model", "start", "end"],
        )
    spend: dict[str, float] = {}
    for pool in outcome.variant.pools.values():
        if pool.gpu_type not in prices:
            raise PlanError(
                f"no GPU price for {pool.gpu_type!r} (pool {pool.model}): add one with `fleetscope prices set "
                f"{pool.gpu_type} USD_PER_GPU_HOUR`"
            )
        mine = up[up["model"] == pool.model]
        seconds = (mine["end"].clip(0, outcome.seconds) - mine["start"].clip(0, outcome.seconds)).clip(lower=0).sum()
        spend[pool.model] = float(seconds) / 3600 * pool.gpu_count * prices[pool.gpu_type]
    return spend, up


def _most_at_once(up: pd.DataFrame) -> int:
    """The most intervals open at once (an interval ending as another starts is not counted twice)."""
    steps = sorted([(float(t), 1) for t in up["start"]] + [(float(t), -1) for t in up["end"]])
    most = now = 0
    for _t, delta in steps:  # ends (-1) sort before starts at the same instant
        now += delta
        most = max(most, now)
    return most


def _cold_starts(outcome: Outcome, model: str | None) -> int:
    events = outcome.scaling
    if events is None or events.empty:
        return 0
    mine = events[(events["kind"] == "ready") & (events["t"] <= outcome.seconds)]
    return int(len(mine) if model is None else (mine["pool"] == model).sum())
