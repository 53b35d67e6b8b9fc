"""The ``autoscale`` section of a fleet spec -> ``AutoscaleSpec`` (which pools scale, by which policy).

In:  ``autoscale: {enabled, interval_s, first_port, events_url, pools: {<model>: <ScalePolicy>}}``.
Out: ``AutoscaleSpec``; ``FleetSpec`` checks it against the replicas (each pool's model has a
     replica in the spec to copy, and the spec's count lies within min/max) and the gateway
     (fleetscope's own: it takes replicas that come and go; a third-party gateway's config is fixed).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fleet.autoscale.policy import ScalePolicy

__all__ = ["AutoscaleSpec"]


class AutoscaleSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    interval_s: float = Field(default=5.0, gt=0, description="how often the pools' signals are read")
    first_port: int = Field(default=8120, ge=1024, le=65000, description="new replicas take ports from here up")
    events_url: str | None = Field(
        default="http://127.0.0.1:4318/v1/events", description="where scale events go (the collector's intake)"
    )
    pools: dict[str, ScalePolicy] = Field(min_length=1, description="model -> its pool's policy")

    def ports(self) -> range:
        """The ports new replicas may take: one per replica any pool may add."""
        return range(self.first_port, self.first_port + sum(p.max_replicas for p in self.pools.values()))
