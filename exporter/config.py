"""The exporter's configuration: the ``exporter`` section of ``fleetscope.yaml``.

In:  the ``exporter`` section (``fleetscope.settings`` composes it): durations as ``30s``,
     ``10m``, ``1h`` or seconds.
Out: ``ExporterSettings`` (validated, frozen; a bad value is one line naming the key and what
     to write) and ``params(weights)``, the ``Params`` a ``Refresher`` reads with.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator, model_validator

from analytics.cost import TokenWeights
from common.config import Section
from common.durations import Duration
from exporter.read import Params

__all__ = ["ExporterSettings"]

MIN_INTERVAL_S = 1.0  # a refresh reads for 0.1-1 s: more often would keep a core busy
MAX_INTERVAL_S = 3600.0
MIN_WINDOW_S = 60.0  # the cost rule works in whole minutes
MAX_WINDOW_S = 30 * 86400.0


class ExporterSettings(Section):
    """fleetscope's numbers on the collector's ``GET /metrics`` (docs/prometheus.md)."""

    enabled: bool = Field(default=True, description="serve fleetscope's numbers on the collector's /metrics")
    interval_s: Duration = Field(default=30.0, description="how often the numbers are read again (30s, 1m)")
    window_s: Duration = Field(
        default=3600.0,
        description="the window of cost, spend, headroom and prefix-cache figures, ending at each refresh",
    )
    recent_window_s: Duration = Field(default=600.0, description="the window of stalls and draft acceptance")

    @field_validator("interval_s")
    @classmethod
    def _interval(cls, value: float) -> float:
        if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
            raise ValueError(f"must be between 1s and 1h (e.g. 30s), not {value:g} s")
        return value

    @field_validator("window_s", "recent_window_s")
    @classmethod
    def _window(cls, value: float) -> float:
        if not MIN_WINDOW_S <= value <= MAX_WINDOW_S:
            raise ValueError(f"must be between 1m and 30d (e.g. 1h), not {value:g} s")
        return value

    @model_validator(mode="after")
    def _recent_within_window(self) -> ExporterSettings:
        if self.recent_window_s > self.window_s:
            raise ValueError(
                f"recent_window_s ({self.recent_window_s:g} s) must not be longer than window_s ({self.window_s:g} s)"
            )
        return self

    def params(self, weights: TokenWeights | None = None) -> Params:
        return Params(timedelta(seconds=self.window_s), timedelta(seconds=self.recent_window_s), weights)
