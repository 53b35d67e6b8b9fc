"""Explanations: why a latency quantile rose, why the cost per 1M tokens rose, and why a quality
rate (truncations, refusals, empty answers) rose.

In:  a client, a window, what to explain (see each module).
Out: the entry points, re-exported here:
     - ``explain`` / ``quantile_series`` / ``cost_around`` -> ``Explanation``
       (``analytics.explain.latency``: its steps are ``queries``, ``scoring``, ``words``, ``model``);
     - ``explain_cost`` -> ``CostExplanation`` (``analytics.explain.cost``: its steps are
       ``cost_queries``, ``cost_scoring``, ``cost_parts``, ``cost_words``, ``cost_model``);
     - ``explain_quality`` -> ``QualityExplanation`` (``analytics.explain.quality``: its reads are
       ``quality_queries``).
"""

from __future__ import annotations

from analytics.explain.cost import explain_cost
from analytics.explain.cost_model import CostExplanation
from analytics.explain.latency import cost_around, explain, quantile_series
from analytics.explain.model import Explanation
from analytics.explain.quality import QualityExplanation, explain_quality

__all__ = [
    "CostExplanation",
    "Explanation",
    "QualityExplanation",
    "cost_around",
    "explain",
    "explain_cost",
    "explain_quality",
    "quantile_series",
]
