"""Explain a quality break: find the lasting rise of a quality rate (truncations, refusals, empty
answers among the answers the gateway scored) and name what moved with it.

In:  a client, a window ``[start, end)``, the rate (``truncation``, ``refusal``, ``empty``: the share
     of the evaluated answers with ``truncated`` / ``refusal`` / ``empty_answer`` = 1, weighted, as
     ``analytics.quality`` defines it), optionally ``Filters`` (the rows read) and a step.
Out: a ``QualityExplanation``:
     - ``series``: ``[ts, rate, evaluated]`` per step (``analytics.quality.quality_rates``;
       ``evaluated`` weighted); the steps at either end holding under a third of the median
       step's evaluated answers are left out (a window ending inside a step);
     - ``break_at``: the start of the lasting rise, or None; found as ``explain`` finds a latency's
       (``analytics.changepoints``: change points, then the run of segments that stays 1.5x above
       the level before it), on ``log(rate + FLOOR)``: a rate starting from 0 has no log, and the
       floor (5 points) keeps a rise from nothing to one flagged answer in a step from counting;
       the change points' penalty is at least the binomial noise of a step's rate, and the rise
       must stand ``Z_MIN`` standard errors above the baseline counted in answers (a two-proportion
       test on the evaluated rows), else it is sampling noise and "no break found";
     - ``before`` / ``after``: the weighted rate over the baseline (``periods[0]`` to the break)
       and over the rise (the break to ``periods[2]``), read from the store for those periods;
     - ``evidence``: ranked by ``score`` (``signal, before, after, moved_at, score, detail``):
       each tenant / model (an adapter is its own model) / route / route reason value's part of the
       rise (how the rate's change splits over the values: ``(flagged_after_v / evaluated_after) -
       (flagged_before_v / evaluated_before)`` over the change, the parts of one dimension add up
       to 1) minus its share of the evaluated answers after the break (a value holding all
       traffic explains nothing: BubbleUp's lift), ``before`` / ``after`` its own rate; the
       ``max_tokens`` of the group that rose (the top tenant, else the top value): its quantiles
       before vs after and its share of answers at finish_reason 'length' (``before`` / ``after``
       the median), scored as the group's score times how much of the group's rise the answers
       ending at 'length' account for (half where max_tokens did not fall); the model mix of the
       tenant that rose (its requests' share per model before vs after, with the route and reason
       of the requests that moved; ``before`` / ``after`` the share on the model it moved to),
       scored as the tenant's score times the mix's change (total variation) times that model's
       part of the rise. Scores within ``TIE`` go to the cause (max_tokens, the model mix) before
       the place (tenant, model, route, reason);
     - ``sentence``: one line, "consistent with", naming the group and the cause.
``to_dict`` is the ``fleetscope explain --metric truncation|refusal|empty --format json`` document.

The step: a rate over sampled answers is noisy (20 answers: +-10 points at a 30 % rate), so the
step (unless given) is the smallest of 1, 2, 5, 10, 15, 30, 60 s, ... (and at least the window
over 180) that holds ``MIN_PER_STEP`` (20) evaluated answers on average over the time the
answers cover. Scores live in the raw request log only (``analytics.quality``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from analytics.adapters import adapter_pools
from analytics.changepoints import change_points, episode
from analytics.errors import BadInput
from analytics.explain import quality_queries as qq
from analytics.explain.cost_model import frame_records, iso, json_safe, num, period_times, records, to_float
from analytics.explain.cost_queries import reason_kind
from analytics.explain.scoring import moved_at
from analytics.filters import Filters
from analytics.quality import quality_rates
from analytics.timeseries import auto_step
from common.timeutil import as_utc
from storage.clickhouse import Client

__all__ = ["MIN_PER_STEP", "RATES", "QualityExplanation", "explain_quality"]

RATES = {"truncation": "truncation rate", "refusal": "refusal rate", "empty": "empty-answer rate"}
_COLUMNS = {"truncation": "truncation_rate", "refusal": "refusal_rate", "empty": "empty_rate"}
_FLAGGED = {"truncation": "truncated", "refusal": "refused", "empty": "empty"}
MIN_PER_STEP = 20  # evaluated answers per step, on average
MIN_STEPS = 8  # a break needs this many steps with evaluated answers
FLOOR = 0.05  # the rate is compared as log(rate + FLOOR)
RISE = math.log(1.5)
Z_MIN = 3.0  # the rise in standard errors of the two periods' rates (answers counted)
TIE = 0.05
MIN_SCORE = 0.01  # evidence scoring less is left out
# ties go to the cause, then to the dimension nearer a decision
PRIORITY = ["max_tokens", "model mix", "tenant", "model", "route", "route_reason"]
EVIDENCE_COLUMNS = ["signal", "before", "after", "moved_at", "score", "detail"]
Periods = tuple[datetime, datetime, datetime]


@dataclass
class QualityExplanation:
    metric: str  # "truncation rate", ...
    step: int
    series: pd.DataFrame  # [ts, rate, evaluated]
    break_at: datetime | None = None
    before: float = math.nan  # the weighted rate over the baseline
    after: float = math.nan  # over the rise
    periods: Periods | None = None  # baseline start, break, end of the rise
    evidence: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EVIDENCE_COLUMNS))
    dimensions: pd.DataFrame = field(default_factory=pd.DataFrame)  # every value's parts (the evidence's source)
    per_step: float = math.nan  # evaluated answers per step, on average
    limits: dict[str, Any] = field(default_factory=dict)  # the group's max_tokens and 'length' shares
    moved: dict[str, Any] = field(default_factory=dict)  # the tenant's model move: tenant, to, routed
    notes: list[str] = field(default_factory=list)
    # the group's cost per 1M tokens before and after the break (with prices): "cheaper and worse"
    cost: dict[str, Any] = field(default_factory=dict)
    sentence: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/analytics.md, "Explaining a quality break")."""

        frame = frame_records
        periods = period_times(self.periods)
        return {
            "metric": self.metric,
            "source": "request log (gateway)",
            "step_s": self.step,
            "evaluated_per_step": num(self.per_step),
            "break_at": iso(self.break_at),
            "before": num(self.before),
            "after": num(self.after),
            "periods": periods,
            "sentence": self.sentence,
            "cost": json_safe(self.cost),
            "notes": list(self.notes),
            "evidence": frame(self.evidence),
            "limits": json_safe(self.limits),
            "moved": json_safe(self.moved),
            "series": frame(self.series),
        }


def explain_quality(
    client: Client,
    start: datetime,
    end: datetime,
    rate: str = "truncation",
    filters: Filters | None = None,
    step_s: float | None = None,
    prices: dict[str, float] | None = None,
) -> QualityExplanation:
    """Find the lasting rise of the ``rate`` over ``[start, end)`` and what moved with it (module
    docstring); with GPU ``prices``, the cost per 1M tokens of the tenant that rose, before and after."""
    if rate not in RATES:
        raise BadInput(f"unknown quality rate {rate!r}; one of {', '.join(RATES)}")
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        raise BadInput(f"the window must end after it starts ({start} .. {end})")
    found = qq.span(client, start, end, filters)
    step = _step(found, start, end, step_s)
    raw = quality_rates(client, start, end, by=None, step_s=step, filters=filters)
    series = raw.rename(columns={_COLUMNS[rate]: "rate"})[["ts", "rate", "evaluated"]]
    ex = QualityExplanation(RATES[rate], step, _full_steps(series[series["evaluated"] > 0]))
    window = f"between {start:%H:%M} and {end:%H:%M} UTC"
    if found.rows == 0:
        ex.sentence = (
            f"{_cap(ex.metric)}: no evaluated answers {window}: only the gateway scores answers "
            "(a sample of them), and only in the raw request log; no break found."
        )
        return ex
    ex.per_step = found.rows / max(len(ex.series), 1)
    if len(ex.series) < MIN_STEPS:
        ex.sentence = (
            f"{_cap(ex.metric)}: not enough steps with evaluated answers {window} to find a break "
            f"({len(ex.series)} of {MIN_STEPS}); no break found."
        )
        return ex
    periods, why = _periods(ex, found, (start, end), rate, client, filters)
    if periods is None:
        ex.sentence = f"{_cap(ex.metric)}: no break found {window} ({why})."
        return ex
    ex.periods, ex.break_at = periods, periods[1]
    _evidence(ex, client, rate, filters)
    ex.sentence = _sentence(ex, rate, _labels(client))
    if prices:
        ex.cost = _cost_alongside(ex, client, prices, filters)
        ex.sentence += _cost_words(ex.cost)
    return ex


def _cost_alongside(
    ex: QualityExplanation, client: Client, prices: dict[str, float], filters: Filters | None
) -> dict[str, Any]:
    """The cost per 1M tokens of the tenant that rose (the lead tenant of the evidence) over the
    baseline and over the rise (``analytics.cost.cost_by_tenant``): {} without one or its costs."""
    from analytics.cost import cost_by_tenant

    tenants = ex.dimensions[ex.dimensions["dimension"] == "tenant"] if len(ex.dimensions) else ex.dimensions
    if ex.periods is None or tenants.empty:
        return {}
    tenant = str(tenants.sort_values("part", ascending=False)["value"].iloc[0])
    out: dict[str, Any] = {"tenant": tenant}
    for name, (a, b) in (("before", ex.periods[:2]), ("after", ex.periods[1:])):
        try:
            df = cost_by_tenant(client, a, b, prices, filters=filters)
        except (KeyError, ValueError):  # a GPU type without a price, nothing to share: no figure
            return {}
        row = df[df["tenant"] == tenant]
        out[name] = float(row["cost_per_million_tokens"].iloc[0]) if len(row) else math.nan
    return out if not (math.isnan(out["before"]) or math.isnan(out["after"])) else {}


def _cost_words(cost: dict[str, Any]) -> str:
    """ "; meanwhile tenant X's cost per 1M tokens fell 30 % ($a -> $b)", or nothing."""
    if not cost or cost["before"] <= 0:
        return ""
    change = cost["after"] / cost["before"] - 1
    way = "fell" if change < 0 else "rose"
    return (
        f" Meanwhile tenant {cost['tenant']}'s cost per 1M tokens {way} {abs(change):.0%} "
        f"(${cost['before']:.2f} -> ${cost['after']:.2f})" + (": cheaper, and worse." if change < -0.05 else ".")
    )


def _step(found: qq.Span, start: datetime, end: datetime, step_s: float | None) -> int:
    """The step: given, or the smallest nice width holding ``MIN_PER_STEP`` evaluated answers on
    average over the time they cover (at least the window over 180)."""
    if step_s is not None:
        if step_s < 1:
            raise BadInput(f"step_s must be at least 1 second, got {step_s}")
        return int(step_s)
    step = auto_step(start, end, points=180)
    if found.rows and found.first is not None and found.last is not None:
        covered = max((found.last - found.first).total_seconds(), 1.0)
        wanted = covered * MIN_PER_STEP / found.rows
        step = max(step, auto_step(start, start + timedelta(seconds=max(wanted, 1.0)), points=1))
    return step


def _full_steps(series: pd.DataFrame) -> pd.DataFrame:
    """``series`` without the steps at either end that hold under a third of the median step's
    evaluated answers (a window beginning or ending inside a step)."""
    series = series.reset_index(drop=True)
    if len(series) < 3:
        return series
    enough = series["evaluated"].to_numpy(float) >= float(series["evaluated"].median()) / 3
    if not enough.any():
        return series
    first, last = int(enough.argmax()), len(enough) - int(enough[::-1].argmax())
    return series.iloc[first:last].reset_index(drop=True)


def _penalty(values: np.ndarray, rate: float, per_step: float) -> float:
    """The change points' penalty: 3 x the noise variance x ln n, the noise being the larger of the
    series' own (robust, from successive differences) and a step's binomial noise on the log scale."""
    diffs = np.diff(values)
    mad = float(np.median(np.abs(diffs - np.median(diffs)))) if len(diffs) else 0.0
    robust = (1.4826 * mad / math.sqrt(2)) ** 2
    p = min(max(rate, 0.0), 1.0)
    binomial = p * (1 - p) / max(per_step, 1.0) / (p + FLOOR) ** 2
    return 3.0 * max(robust, binomial, 1e-6) * math.log(max(len(values), 2))


def _periods(
    ex: QualityExplanation,
    found: qq.Span,
    window: tuple[datetime, datetime],
    rate: str,
    client: Client,
    filters: Filters | None,
) -> tuple[Periods | None, str]:
    """(baseline start, break, end of the rise) with ``ex.before`` / ``ex.after`` set, or None and why."""
    s = ex.series
    values = np.log(s["rate"].to_numpy(float) + FLOOR)
    overall = float((s["rate"] * s["evaluated"]).sum() / s["evaluated"].sum())
    bounds = [0, *change_points(values, penalty=_penalty(values, overall, ex.per_step)), len(values)]
    levels = [float(values[a:b].mean()) for a, b in itertools.pairwise(bounds)]
    run = episode(levels, bounds, rise=RISE)
    level = f"it stays near {overall:.1%} of the evaluated answers; {ex.step} s steps of ~{ex.per_step:.0f} answers"
    if run is None:
        return None, level
    base, first, stop = run
    ts = s["ts"]
    periods = (
        pd.Timestamp(ts.iloc[bounds[base]]).to_pydatetime() if base > 0 else window[0],
        pd.Timestamp(ts.iloc[bounds[first]]).to_pydatetime(),
        pd.Timestamp(ts.iloc[bounds[stop]]).to_pydatetime() if stop < len(levels) else window[1],
    )
    got = qq.rates(client, periods, qq.FLAGS[rate], filters)
    ex.before, ex.after = got["before"]["rate"], got["after"]["rate"]
    z = _z(got["before"], got["after"], found.weighted / found.rows)
    if not z >= Z_MIN:
        ex.notes.append(
            f"a rise from {ex.before:.1%} to {ex.after:.1%} at {periods[1]:%H:%M:%S} UTC is within the sampling "
            f"noise of the evaluated answers (z = {z:.1f} < {Z_MIN:g})"
        )
        ex.before = ex.after = math.nan
        return None, f"{level}; the one rise seen is within the sampling noise (z = {z:.1f})"
    return periods, ""


def _z(before: dict[str, float], after: dict[str, float], mean_weight: float) -> float:
    """The rise in standard errors (two proportions; the answers counted, weights taken out)."""
    nb, na = before["evaluated"] / mean_weight, after["evaluated"] / mean_weight
    if nb <= 0 or na <= 0 or math.isnan(before["rate"]) or math.isnan(after["rate"]):
        return 0.0
    p = (before["rate"] * nb + after["rate"] * na) / (nb + na)
    se = math.sqrt(max(p * (1 - p), 1e-12) * (1 / nb + 1 / na))
    return (after["rate"] - before["rate"]) / max(se, 1e-9)


def _evidence(ex: QualityExplanation, client: Client, rate: str, filters: Filters | None) -> None:
    """``ex.dimensions`` and ``ex.evidence``: the values' parts, the group's max_tokens and the model mix."""
    assert ex.periods is not None and ex.break_at is not None
    steps = qq.contributions(client, ex.periods, ex.step, qq.FLAGS[rate], filters)
    break_ts = pd.Timestamp(ex.break_at)
    ex.dimensions = _parts(steps, break_ts)
    rows: list[dict[str, Any] | None] = list(_dimension_rows(ex.dimensions, steps, break_ts, ex.step, _FLAGGED[rate]))
    dims = records(ex.dimensions[ex.dimensions["score"] > 0])
    tenants = [d for d in dims if d["dimension"] == "tenant"]
    if dims:
        top = (tenants or dims)[0]
        group = (str(top["dimension"]), str(top["value"]))
        rows.append(_limits_row(client, ex, group, to_float(top["score"]), filters))
    if tenants:
        rows.append(_mix_row(client, ex, str(tenants[0]["value"]), to_float(tenants[0]["score"]), filters))
    ex.evidence = _rank([r for r in rows if r is not None])


def _parts(steps: pd.DataFrame, break_ts: pd.Timestamp) -> pd.DataFrame:
    """Per dimension and value: flagged and evaluated before and after, the rate's change it
    accounts for (``part``, of the change), its share of the evaluated answers after, and the score."""
    columns = ["dimension", "value", "fb", "eb", "fa", "ea", "part", "share_after", "score"]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    period = np.where(steps["ts"] < break_ts, "b", "a")
    sums = steps.assign(period=period).pivot_table(
        index=["dimension", "value"], columns="period", values=["flagged", "evaluated"], aggfunc="sum", fill_value=0.0
    )
    sums.columns = [f"{'f' if pair[0] == 'flagged' else 'e'}{pair[1]}" for pair in sums.columns]
    for name in ("fb", "eb", "fa", "ea"):
        if name not in sums:
            sums[name] = 0.0
    df = sums.reset_index()
    # every dimension partitions the same answers: its totals are the rate's
    first = df[df["dimension"] == df["dimension"].iloc[0]]
    eb, ea = max(float(first["eb"].sum()), 1e-12), max(float(first["ea"].sum()), 1e-12)
    change = float(first["fa"].sum()) / ea - float(first["fb"].sum()) / eb
    df["part"] = (df["fa"] / ea - df["fb"] / eb) / (change if change > 0 else math.nan)
    df["share_after"] = df["ea"] / ea
    df["score"] = (df["part"] - df["share_after"]).fillna(0.0)
    return df.sort_values("score", ascending=False, ignore_index=True)[columns]


def _dimension_rows(
    parts: pd.DataFrame, steps: pd.DataFrame, break_ts: pd.Timestamp, step: int, flagged: str
) -> list[dict[str, Any]]:
    """The top values of each dimension that hold more of the rise than of the answers."""
    totals = steps[steps["dimension"] == "tenant"].groupby("ts")["evaluated"].sum()
    rows = []
    for dim in qq.DIMENSIONS:
        for r in records(parts[(parts["dimension"] == dim) & (parts["score"] > 0)].head(3)):
            mine = steps[(steps["dimension"] == dim) & (steps["value"] == r["value"])].set_index("ts")["flagged"]
            moved = moved_at((mine.reindex(totals.index).fillna(0.0) / totals).sort_index(), break_ts, step)
            before, after = _ratio(r["fb"], r["eb"], math.nan), _ratio(r["fa"], r["ea"], math.nan)
            detail = (
                f"{r['part']:.0%} of the rise comes from its answers, {r['share_after']:.0%} of the evaluated answers "
                f"after the break; its answers {flagged}: {_pct(before)} before, {_pct(after)} after"
            )
            rows.append(
                _row(f"{dim} {_value(dim, str(r['value']))}", before, after, moved, to_float(r["score"]), detail)
            )
    return rows


def _limits_row(
    client: Client, ex: QualityExplanation, group: tuple[str, str], score: float, filters: Filters | None
) -> dict[str, Any] | None:
    """The group's max_tokens and share of answers at finish_reason 'length', before vs after."""
    assert ex.periods is not None
    periods, steps = qq.limits(client, ex.periods, ex.step, group, filters)
    got = {str(r["period"]): r for r in periods.to_dict("records")}
    if "before" not in got or "after" not in got:
        return None
    qb, qa = list(got["before"]["max_tokens_q"]), list(got["after"]["max_tokens_q"])
    lb, la = float(got["before"]["length_share"]), float(got["after"]["length_share"])
    mine = records(ex.dimensions[(ex.dimensions["dimension"] == group[0]) & (ex.dimensions["value"] == group[1])])[0]
    rise = _ratio(mine["fa"], mine["ea"], 0.0) - _ratio(mine["fb"], mine["eb"], 0.0)
    fell = qa[1] < qb[1]
    account = min(max((la - lb) / rise, 0.0), 1.0) if rise > 0 else 0.0
    assert ex.break_at is not None
    moved = moved_at(
        steps.set_index("ts")["length_share"].astype(float).sort_index(), pd.Timestamp(ex.break_at), ex.step
    )
    name = f"{group[0]} {_value(*group)}"
    ex.limits = {
        "group": name,
        "max_tokens_before": qb,
        "max_tokens_after": qa,
        "length_before": lb,
        "length_after": la,
    }
    q = "/".join(f"p{int(x * 100)}" for x in qq.QUANTILES)
    detail = (
        f"{name}: max_tokens {q} {_tokens(qb)} before, {_tokens(qa)} after; its answers at finish_reason 'length' "
        f"{lb:.0%} before, {la:.0%} after"
    )
    return _row(
        f"max_tokens ({name})", float(qb[1]), float(qa[1]), moved, score * account * (1 if fell else 0.5), detail
    )


def _mix_row(
    client: Client, ex: QualityExplanation, tenant: str, score: float, filters: Filters | None
) -> dict[str, Any] | None:
    """The tenant's requests per model before vs after: the model it moved to, and the route that took them."""
    assert ex.periods is not None and ex.break_at is not None
    mix = qq.model_mix(client, ex.periods, tenant, filters)
    per_model = mix.groupby("model")[["before", "after"]].sum()
    if per_model["before"].sum() <= 0 or per_model["after"].sum() <= 0:
        return None
    shares = per_model / per_model.sum()
    gain = shares["after"] - shares["before"]
    to = str(gain.idxmax())
    tvd = float(gain.abs().sum() / 2)
    found = records(ex.dimensions[(ex.dimensions["dimension"] == "model") & (ex.dimensions["value"] == to)])
    part = to_float(found[0]["part"]) if found else 0.0
    steps = qq.mix_steps(client, ex.periods, ex.step, tenant, filters)
    share = steps[steps["model"] == to].set_index("ts")["requests"]
    total = steps.groupby("ts")["requests"].sum()
    moved = moved_at((share.reindex(total.index).fillna(0.0) / total).sort_index(), pd.Timestamp(ex.break_at), ex.step)
    mix = mix.assign(reason=mix["route_reason"].map(reason_kind))
    went = records(mix[mix["model"] == to].sort_values("after", ascending=False))[0]
    was = records(mix.sort_values("before", ascending=False))[0]
    routed = ""
    if (went["route"], went["reason"]) != (was["route"], was["reason"]):
        routed = f"; routed by {went['route'] or '(no route)'}: {went['route_reason'] or '(no reason)'}"
    before_mix = ", ".join(f"{m} {v:.0%}" for m, v in shares["before"].sort_values(ascending=False).head(3).items())
    after_mix = ", ".join(f"{m} {v:.0%}" for m, v in shares["after"].sort_values(ascending=False).head(3).items())
    detail = f"tenant {tenant}'s requests: {before_mix} before; {after_mix} after (to {to}){routed}"
    row = _row(
        f"model mix (tenant {tenant})",
        to_float(shares.loc[to, "before"]),
        to_float(shares.loc[to, "after"]),
        moved,
        score * tvd * min(max(part, 0.0), 1.0),
        detail,
    )
    ex.moved = {"tenant": tenant, "to": to, "routed": routed, "score": row["score"]}
    return row


def _ratio(numerator: Any, denominator: Any, otherwise: float) -> float:
    return to_float(numerator) / to_float(denominator) if to_float(denominator) > 0 else otherwise


def _row(
    signal: str, before: float, after: float, moved: pd.Timestamp | None, score: float, detail: str
) -> dict[str, Any]:
    return {
        "signal": signal,
        "before": before,
        "after": after,
        "moved_at": moved,
        "score": round(score, 4),
        "detail": detail,
    }


def _kind(signal: str) -> str:
    if signal.startswith(("max_tokens", "model mix")):
        return signal.split(" (")[0]
    return signal.split(" ")[0]


def _rank(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows by score; scores within ``TIE`` go to the cause, then to the dimension nearer a decision."""
    if not rows:
        return pd.DataFrame(columns=EVIDENCE_COLUMNS)
    df = pd.DataFrame(rows)
    df = df[df["score"] >= MIN_SCORE]
    if df.empty:
        return pd.DataFrame(columns=EVIDENCE_COLUMNS)
    top = float(df["score"].max())
    order = df["signal"].map(lambda s: PRIORITY.index(_kind(s)) if _kind(s) in PRIORITY else len(PRIORITY))
    # scores within TIE of each other are one band; inside a band the cause comes first
    band = ((top - df["score"]) / TIE).astype(int)
    df = df.assign(_band=band, _order=order).sort_values(["_band", "_order", "score"], ascending=[True, True, False])
    return df[EVIDENCE_COLUMNS].reset_index(drop=True)


def _labels(client: Client) -> dict[str, str]:
    """Model name -> "adapter NAME" for the LoRA adapters the engines reported, else "model NAME"."""
    return {name: f"adapter {name}" for name in adapter_pools(client)}


def _value(dim: str, value: str) -> str:
    return (reason_kind(value) if dim == "route_reason" else value) or "(none)"


def _pct(x: float) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.0%}"


def _tokens(q: list[float]) -> str:
    return "/".join("–" if math.isnan(float(x)) else f"{float(x):.0f}" for x in q)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence(ex: QualityExplanation, rate: str, labels: dict[str, str]) -> str:
    """One line: the rise, the group it comes from and what moved with it, "consistent with"."""
    assert ex.break_at is not None
    head = (
        f"{_cap(ex.metric)} rose from {ex.before:.1%} to {ex.after:.1%} of the evaluated answers at "
        f"{ex.break_at:%H:%M:%S} UTC ({ex.step} s steps of ~{ex.per_step:.0f} evaluated answers)"
    )
    ev = ex.evidence
    dims = ev[~ev["signal"].str.startswith(("max_tokens", "model mix"))] if len(ev) else ev
    if dims.empty:
        return f"{head}; no tenant, model or route holds more of it than of the answers: the rise is fleet-wide."
    lead = dims.iloc[0]
    dim = _kind(str(lead["signal"]))
    value = str(lead["signal"])[len(dim) + 1 :]
    name = f"{labels.get(value, f'model {value}')}" if dim == "model" else f"{dim} {value}"
    part = ex.dimensions[
        (ex.dimensions["dimension"] == dim) & (ex.dimensions["value"].map(lambda v: _value(dim, v)) == value)
    ]
    share = ""
    if len(part):
        x = float(part["part"].iloc[0])
        share = f" ({x:.0%} of the rise{': the others fell a little' if x > 1.005 else ''})"
    words = [f"consistent with {name}{share}"]
    lim = ex.limits
    if lim and lim["max_tokens_after"][1] < lim["max_tokens_before"][1] and lim["length_after"] > lim["length_before"]:
        whose = "its" if lim["group"] == f"{dim} {value}" else f"{lim['group']}'s"
        was, now = lim["max_tokens_before"][1], lim["max_tokens_after"][1]
        words.append(
            f"{whose} max_tokens fell from {was:.0f} to {now:.0f} (median) "
            f"while its answers ran into the limit (finish_reason 'length': {lim['length_before']:.0%} before, "
            f"{lim['length_after']:.0%} after)"
        )
    mix = ev[ev["signal"].str.startswith("model mix")]
    if len(mix) and ex.moved and ex.moved["score"] > TIE:
        to, r = str(ex.moved["to"]), mix.iloc[0]
        whose = "its" if f"tenant {ex.moved['tenant']}" == f"{dim} {value}" else f"tenant {ex.moved['tenant']}'s"
        words.append(
            f"{whose} requests moved to {labels.get(to, f'model {to}')} ({r['before']:.0%} -> {r['after']:.0%} of them"
            f"{ex.moved['routed']})"
        )
    return f"{head}; {', '.join(words)}."
