"""What ``explain`` returns, and the thresholds its scoring and its words share.

In:  nothing.
Out: ``Explanation`` (its fields: ``analytics.explain``'s docstring), the thresholds
     (``SATURATED``, ``PRESSURE``, ``MIX_CHANGE``, ``LONG_FACTOR``, ``MIN_PER_STEP``,
     ``HELD_MIN_SHARE``), the
     tie-break order of the signals (``PRIORITY``), the evidence table's columns and the names of
     the signals that answer a regression rather than cause it (``LATE_SCALE_OUT``,
     ``GATEWAY_SHED``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd

__all__ = [
    "CAUSE_RATIO",
    "COVERED_MIN_STEP_S",
    "EVIDENCE_COLUMNS",
    "GATEWAY_SHED",
    "HELD_MIN_SHARE",
    "LATE_SCALE_OUT",
    "LONG_FACTOR",
    "MIN_PER_STEP",
    "MIX_CHANGE",
    "MIX_DIMENSIONS",
    "PRESSURE",
    "PRIORITY",
    "SATURATED",
    "Explanation",
]

SATURATED = 0.9  # KV-cache usage at which a replica counts as saturated
PRESSURE = 0.5  # ... or this much with requests waiting (a long prompt's blocks no longer fit)
COVERED_MIN_STEP_S = 5  # a window stepped over the part its requests cover: steps at least this wide (a scrape)
MIN_PER_STEP = 10  # requests per step the quantile series needs on average (its step widens to get them)
MIX_CHANGE = 0.1  # a share that moved this much (10 points) or more counts in full
# a traffic-mix signal scoring at least this share of the top capacity signal, which moved with it, goes first
# (``scoring.cause_first``)
CAUSE_RATIO = 0.6  # real engines overloaded by a rollout: 0.62 / 0.70 and 0.55 / 0.85, both moving at the switch
LATE_SCALE_OUT = "late scale-out"  # the regression spent waiting for a replica the autoscaler had decided on
GATEWAY_SHED = "gateway shedding"  # the gateway refused requests to hold the admitted ones' latency (its answer)
# a window with no lasting rise is said to be held by the gateway's shedding when it shed at least this share of the
# requests in its shedding episode, and at least MIN_PER_STEP requests (a stray 429 is no story)
HELD_MIN_SHARE = 0.05
LONG_FACTOR = 3.0  # a "long-context" prompt: more than this many times the baseline's median prompt
# tie-break order: who sent the traffic and what the router did before what it looked like and
# what it did to the engines
PRIORITY = (
    "tenant mix",
    "route decisions",
    "long-context share",
    "context length",
    "model mix",
    "request rate",
    "stalled replicas",
    "adapter waiting",
    "draft acceptance",
    "KV-cache saturation",
    LATE_SCALE_OUT,
    "replicas up",
    "prefix-cache hit rate",
    "queueing without KV saturation",
)
MIX_DIMENSIONS = {
    "tenant": "tenant mix",
    "model": "model mix",
    "route": "route decisions",
    "context_bucket": "context length",
}

EVIDENCE_COLUMNS = ["signal", "kind", "before", "after", "score", "moved_at", "lead_s", "detail", "resolution_s"]


@dataclass
class Explanation:
    metric: str
    source: str
    step: int  # the step of the engine signals and of the timing (``lead_s``)
    series: pd.DataFrame
    breaks: list[dict[str, Any]] = field(default_factory=list)
    break_at: datetime | None = None
    onset: datetime | None = None  # when the leading evidence moved (at or before break_at)
    before: float = math.nan
    after: float = math.nan
    evidence: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=EVIDENCE_COLUMNS))
    dimensions: pd.DataFrame = field(default_factory=pd.DataFrame)
    strata: pd.DataFrame = field(default_factory=pd.DataFrame)
    cost: pd.DataFrame = field(default_factory=pd.DataFrame)
    # per step (index ts) over the fleet: kv_avg, kv_peak, waiting, replicas_up, preemptions, prefix_hit_rate
    capacity: pd.DataFrame = field(default_factory=pd.DataFrame)
    periods: tuple[datetime, datetime, datetime] | None = None  # baseline start, break, end of the regression
    sentence: str = ""
    request_step: int = 0  # the step of the quantile series (wider when requests are few)
    log_source: str | None = None  # the request log's rows read ("gateway" or "otlp"); None: engine histograms
    # what the gateways in the window do not give (no tenant, no route reason), in words (analytics.gateways.gaps)
    notes: list[str] = field(default_factory=list)
