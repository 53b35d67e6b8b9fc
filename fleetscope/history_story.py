"""The fleet's story that history tells: which replicas, how much traffic when, and from whom.

In:  the fleet size, a seed, epoch seconds and the history's end.
Out: the replicas (``Replica``: name, model profile, labels as the collector sees them, share of
     its model's traffic), the load curve (diurnal, weekly, slow growth), the long-context share
     (one tenant's rollout, day -6) and the tenant mix (a tenant's shift, day -3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetscope.history_calibration import PROFILES, ModelProfile

__all__ = ["ROUTES", "TENANTS", "Replica", "fleet", "load", "long_share", "tenant_mix"]

TENANTS = {"acme": 0.38, "globex": 0.24, "initech": 0.16, "umbrella": 0.12, "hooli": 0.10}
ROUTES = {"llama-3.1-8b": "model-router:default", "llama-3.1-70b": "model-router:large"}


@dataclass(frozen=True)
class Replica:
    index: int
    name: str
    profile: ModelProfile
    factor: float  # this replica's share of its model's traffic, relative to the mean

    @property
    def labels(self) -> dict[str, str]:
        return {
            "job": "vllm",
            "instance": f"10.{self.index // 250}.{self.index % 250}.1:8000",
            "replica": self.name,
            "model": self.profile.name,
            "gpu_type": self.profile.gpu_type,
            "gpu_count": str(self.profile.gpu_count),
        }


def fleet(replicas: int, seed: int = 0) -> list[Replica]:
    rng = np.random.default_rng(seed)
    out = []
    counts = [round(replicas * p.share) for p in PROFILES]
    counts[0] = replicas - sum(counts[1:])
    index = 0
    for profile, count in zip(PROFILES, counts, strict=True):
        for n in range(count):
            out.append(
                Replica(index, f"{profile.name.split('-')[-1]}-{n:03d}", profile, float(rng.uniform(0.85, 1.15)))
            )
            index += 1
    return out


def load(t: np.ndarray, end: float, clock: float = 0.0) -> np.ndarray:
    """Traffic relative to the peak at epoch seconds ``t``: daily cycle (peak 15:00 UTC),
    quieter weekends, 1 % growth per day towards ``end``. ``clock``: seconds added to the
    story's clock for its daily and weekly cycle (``history.seed``'s ``story_end``)."""
    story = t + clock
    hour = (story % 86400) / 3600.0
    daily = 0.55 + 0.45 * np.cos((hour - 15.0) / 24.0 * 2 * math.pi)
    weekday = ((story // 86400) + 4) % 7  # 1970-01-01 was a Thursday
    weekly = np.where(weekday >= 5, 0.7, 1.0)
    growth = 1.0 + 0.01 * (t - end) / 86400.0
    relative: np.ndarray = daily * weekly * growth
    return relative


def long_share(t: np.ndarray, end: float) -> np.ndarray:
    """Share of traffic with long-context prompts: hooli's rollout, six days before ``end``."""
    rollout = end - 6 * 86400 + 9 * 3600
    return np.where(t >= rollout, 0.22, 0.02)


def tenant_mix(t: float, end: float) -> dict[str, float]:
    mix = dict(TENANTS)
    if t >= end - 3 * 86400:  # globex moves its batch jobs onto the fleet
        mix["globex"] += 0.15
    total = sum(mix.values())
    return {k: v / total for k, v in mix.items()}
