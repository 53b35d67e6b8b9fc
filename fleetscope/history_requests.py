"""History's request log: the calibrated engines' finished requests, sampled, along the fleet's story.

In:  a ClickHouse client (migrated), the calibrations (their finished requests per rate level),
     the replicas, the history's start and end, the sampling rate and a random generator.
Out: rows in ``requests`` as the gateway's request log would have left them, sampled at ``rate``
     and weighted 1/``rate``, for every hour of the history (each model's requests drawn from its
     calibrated level, the long-context ones from hooli, the tenants by the story's mix); their
     count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd

from fleetscope.history_calibration import LEVELS, Calibration
from fleetscope.history_story import ROUTES, Replica, load, long_share, tenant_mix
from storage.clickhouse import Client

__all__ = ["write_requests"]


def _hours(start: float, end: float) -> Iterator[float]:
    t = start
    while t < end:
        yield t
        t += 3600.0


def write_requests(
    client: Client,
    cals: dict[tuple[str, str], Calibration],
    replicas: list[Replica],
    start: float,
    end: float,
    rate: float,
    rng: np.random.Generator,
    progress: Callable[[str, float], None],
    clock: float = 0.0,
) -> int:
    """Sampled gateway request-log rows (weight 1/rate) for every hour of the history (``clock``:
    seconds added to the story's clock for its daily and weekly cycle)."""
    by_model: dict[str, list[Replica]] = {}
    for r in replicas:
        by_model.setdefault(r.profile.name, []).append(r)
    frames, total, hours = [], 0, list(_hours(start, end))
    weight = np.float32(1.0 / rate)
    for i, hour in enumerate(hours):
        span = min(3600.0, end - hour)  # the last hour ends now, not in the future
        mix = tenant_mix(hour, end)
        share = float(long_share(np.array([hour]), end)[0])
        for model, group in by_model.items():
            profile = group[0].profile
            fleet_rate = (
                sum(r.factor for r in group) * profile.peak_rate * float(load(np.array([hour + 1800]), end, clock)[0])
            )
            n = int(rng.poisson(fleet_rate * span * rate))
            if n == 0:
                continue
            per_replica = fleet_rate / len(group)
            level = int(np.clip(np.searchsorted(LEVELS, per_replica), 0, len(LEVELS) - 1))
            is_long = rng.random(n) < share
            columns: dict[str, np.ndarray] = {}
            for key in ("ttft", "e2e", "itl", "queue", "prompt", "completion", "cached", "max_tokens"):
                chat_pool = cals[(model, "chat")].requests[level][key]
                long_pool = cals[(model, "long")].requests[level][key]
                columns[key] = np.where(
                    is_long,
                    long_pool[rng.integers(0, len(long_pool), n)],
                    chat_pool[rng.integers(0, len(chat_pool), n)],
                )
            tenants = rng.choice(list(mix), size=n, p=list(mix.values()))
            tenants = np.where(is_long, "hooli", tenants)
            ts = hour + np.sort(rng.random(n)) * span
            frames.append(
                pd.DataFrame(
                    {
                        "ts": pd.to_datetime(ts, unit="s", utc=True),
                        "source": "gateway",
                        "request_id": [f"seed-{int(hour)}-{model}-{j}" for j in range(n)],
                        "trace_id": "",
                        "replica": np.array([r.name for r in group])[rng.integers(0, len(group), n)],
                        "model": model,
                        "tenant": tenants,
                        "route": ROUTES[model],
                        "status_code": np.uint16(200),
                        "outcome": "ok",
                        "finish_reason": np.where(columns["completion"] >= columns["max_tokens"], "length", "stop"),
                        "prompt_tokens": columns["prompt"].astype(np.uint32),
                        "completion_tokens": columns["completion"].astype(np.uint32),
                        "cached_tokens": columns["cached"].astype(np.uint32),
                        "max_tokens": columns["max_tokens"].astype(np.uint32),
                        "ttft_seconds": columns["ttft"].astype(np.float32),
                        "e2e_seconds": columns["e2e"].astype(np.float32),
                        "queue_seconds": columns["queue"].astype(np.float32),
                        "itl_seconds": columns["itl"].astype(np.float32),
                        "tpot_seconds": columns["itl"].astype(np.float32),
                        "weight": weight,
                        "stream": np.uint8(1),
                    }
                )
            )
            total += n
        if sum(len(f) for f in frames) > 500_000 or i == len(hours) - 1:
            if frames:
                client.insert_df("requests", pd.concat(frames, ignore_index=True))
                frames = []
            progress(f"request log: day {int((hour - start) // 86400) + 1}", 0.8 + 0.2 * (i + 1) / len(hours))
    return total
