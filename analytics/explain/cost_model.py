"""What ``explain_cost`` returns and the values its steps hand each other; no reads.

In:  nothing.
Out: ``CostExplanation`` (its fields: ``analytics.explain.cost``'s docstring; ``to_dict`` is the
     ``fleetscope explain --metric cost --format json`` document), ``View`` (the view explained:
     the fleet, a pool or a payer), ``Steps`` (the per-step reads of the periods), ``MIN_STEPS``,
     and the cell helpers the cost modules share (``to_float``, ``records``, ``iso``, ``num``,
     ``json_safe``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from analytics.filters import Filters

__all__ = ["MIN_STEPS", "CostExplanation", "Steps", "View", "iso", "json_safe", "num", "records", "to_float"]

MIN_STEPS = 8  # a break needs this many steps with tokens


@dataclass
class CostExplanation:
    view: str  # "the fleet", "tenant acme", "model tiny-small", "adapter support-bot", "route ..."
    source: str  # where the tokens were counted
    step: int
    series: pd.DataFrame
    break_at: datetime | None = None
    before: float = math.nan  # USD per 1M tokens
    after: float = math.nan
    periods: tuple[datetime, datetime, datetime] | None = None
    pools: pd.DataFrame = field(default_factory=pd.DataFrame)
    decomposition: pd.DataFrame = field(default_factory=pd.DataFrame)
    flows: pd.DataFrame = field(default_factory=pd.DataFrame)
    routes: pd.DataFrame = field(default_factory=pd.DataFrame)
    movers: pd.DataFrame = field(default_factory=pd.DataFrame)
    evidence: pd.DataFrame = field(default_factory=pd.DataFrame)
    scaling: pd.DataFrame = field(default_factory=pd.DataFrame)  # the pools' scale-outs and scale-ins
    problems: list[str] = field(default_factory=list)
    sentence: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/analytics.md lists its keys)."""

        frame = frame_records
        periods = period_times(self.periods)
        return {
            "metric": "cost per 1M tokens",
            "view": self.view,
            "source": self.source,
            "step_s": self.step,
            "break_at": iso(self.break_at),
            "before_usd_per_million": num(self.before),
            "after_usd_per_million": num(self.after),
            "change_usd_per_million": num(self.after - self.before),
            "periods": periods,
            "sentence": self.sentence,
            "decomposition": frame(self.decomposition),
            "evidence": frame(self.evidence),
            "pools": frame(self.pools),
            "flows": frame(self.flows),
            "routes": frame(self.routes),
            "movers": frame(self.movers),
            "scaling": frame(self.scaling),
            "problems": list(self.problems),
            "series": frame(self.series),
        }


def to_float(value: Any) -> float:
    """A pandas cell as a float (its declared type is every scalar pandas knows)."""
    return float(value)


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{str(k): v for k, v in row.items()} for row in df.to_dict(orient="records")]


def frame_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A frame's rows as JSON-ready records ([] for none)."""
    return json_safe(df.to_dict(orient="records")) if len(df) else []


def period_times(periods: Any) -> dict[str, Any] | None:
    """The periods compared (baseline start, break, end) as ISO times by name, or None."""
    if periods is None:
        return None
    return {name: iso(t) for name, t in zip(("baseline_start", "break", "end"), periods, strict=True)}


def iso(t: datetime | pd.Timestamp | None) -> str | None:
    return None if t is None or pd.isna(t) else pd.Timestamp(t).tz_convert("UTC").isoformat().replace("+00:00", "Z")


def num(x: Any) -> float | None:
    try:
        value = to_float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) or math.isinf(value) else value


def json_safe(value: Any) -> Any:
    """Plain JSON values: timestamps as ISO strings, NaN and infinities as null."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, pd.Timestamp | datetime):
        return iso(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        return num(value)
    return value


class View(NamedTuple):
    words: str  # "the fleet", "tenant acme", ...
    by: str  # the cost series' ``by``: fleet, model, tenant, route, adapter
    value: str | None  # the one picked
    column: str | None  # the payers' column that picks the view (a payer view), None for the fleet or a pool

    @property
    def payer(self) -> bool:
        return self.column is not None

    def pick(self) -> Filters | None:
        if self.value is None:
            return None
        return Filters(model=self.value) if self.by in ("model", "adapter") else Filters(**{self.by: self.value})


class Steps(NamedTuple):
    """Per step over the periods: each pool's spend, the engines' tokens per pool, and (with a
    request log) each payer's tokens and part of the spend."""

    pools: pd.DataFrame  # [ts, pool, spend, idle_spend, busy_spend, up_seconds]
    engine: pd.DataFrame  # [ts, model, prompt_tokens, cached_tokens, completion_tokens]
    payers: pd.DataFrame  # [ts, pool, model, tenant, route, ..., weighted_tokens, direct, idle]
