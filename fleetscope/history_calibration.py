"""The engine model history is made of: each model profile's simulated engine, measured per rate level.

In:  a model profile (``PROFILES``: engine configuration, GPUs, share of the fleet, peak rate), a
     request shape (``CHAT``, ``LONG``), the virtual minutes to measure and a seed.
Out: a ``Calibration``: per rate level of ``LEVELS``, the per-minute increase of every counter and
     histogram bucket of the real vLLM exposition (named as the collector names them), the mean
     and spread of every gauge, and the finished requests; ``Calibration.at`` interpolates
     between the levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collector.convert import canonical_name, cumulative
from collector.exposition import parse
from fleet.sim.engine import EngineConfig, SimEngine, SimRequest
from fleet.sim.metrics import Exposition
from fleet.sim.virtual import RequestShape, VirtualReplica, run

__all__ = ["CHAT", "LEVELS", "LONG", "PROFILES", "Calibration", "ModelProfile", "calibrate", "calibrate_profiles"]


@dataclass(frozen=True)
class ModelProfile:
    name: str
    config: EngineConfig
    gpu_type: str
    gpu_count: int
    share: float  # of the replicas
    peak_rate: float  # requests/s per replica at the daily peak (before growth)


PROFILES = (
    ModelProfile(
        "llama-3.1-8b",
        EngineConfig(num_blocks=1024, block_size=16, max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=4096),
        "H100",
        1,
        0.7,
        1.6,
    ),
    ModelProfile(
        "llama-3.1-70b",
        EngineConfig(
            num_blocks=2048,
            block_size=16,
            max_model_len=8192,
            max_num_seqs=64,
            max_num_batched_tokens=4096,
            step_overhead_s=0.008,
            prefill_token_s=0.00012,
            decode_seq_s=0.0005,
        ),
        "H100",
        4,
        0.3,
        0.7,
    ),
)
CHAT = RequestShape(prompt_median=500, prompt_sigma=0.9, output_median=120, output_sigma=0.6)
LONG = RequestShape(prompt_median=3000, prompt_sigma=0.4, output_median=120, output_sigma=0.6, shared_share=0.2)
LEVELS = (0.1, 0.4, 0.8, 1.4, 2.2)  # requests/s per replica the engines are calibrated at


@dataclass
class Calibration:
    """One model and request shape: per rate level, what its engine does in a minute."""

    series: list[tuple[str, dict[str, str]]]  # exposition order: (metric, exposed labels)
    cumulative: np.ndarray  # bool per series
    integer: np.ndarray  # bool per series: counts (not *_sum)
    whole: np.ndarray  # bool per series: gauges that only took whole values (running, waiting, ...)
    rates: np.ndarray  # calibrated request rates (levels)
    increase: np.ndarray  # (levels, series): increase per minute
    gauge: np.ndarray  # (levels, series): mean value
    spread: np.ndarray  # (levels, series): std of the value
    requests: list[dict[str, np.ndarray]] = field(default_factory=list)  # per level: finished requests

    def at(self, rate: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-minute increase, gauge mean and spread at each ``rate`` (linear between levels,
        proportional below the first one)."""
        rate = np.asarray(rate, dtype=float)
        i = np.clip(np.searchsorted(self.rates, rate) - 1, 0, len(self.rates) - 2)
        lo, hi = self.rates[i], self.rates[i + 1]
        w = np.clip((rate - lo) / (hi - lo), 0.0, 1.5)[:, None]
        inc = self.increase[i] * (1 - w) + self.increase[i + 1] * w
        below = (rate < self.rates[0])[:, None]
        inc = np.where(below, self.increase[0] * (rate / self.rates[0])[:, None], inc)
        gauge = self.gauge[i] * (1 - w) + self.gauge[i + 1] * w
        spread = self.spread[i] * (1 - w) + self.spread[i + 1] * w
        return np.maximum(inc, 0.0), gauge, spread


def calibrate(profile: ModelProfile, shape: RequestShape, minutes: float = 3.0, seed: int = 0) -> Calibration:
    """Run the engine at every level of ``LEVELS`` in virtual time and measure it."""
    template = parse(Exposition(SimEngine(profile.config), profile.name, started=0.0).render())
    series = [(canonical_name(name), dict(labels)) for name, labels in template.series]
    cum = np.array([cumulative(name, template.types) for name, _ in template.series])
    integer = cum & ~np.array([name.endswith("_sum") for name, _ in template.series])
    increase, gauge, spread, pools = [], [], [], []
    whole = np.ones(len(series), dtype=bool)
    warmup = 60.0
    for level, rate in enumerate(LEVELS):
        values: list[list[float]] = []
        finished: list[SimRequest] = []
        replica = VirtualReplica("calibration", profile.name, profile.config)
        for scrape in run(
            [replica], 0.0, warmup + minutes * 60 + 5, interval_s=5.0, rate=rate, shape=shape, seed=seed * 100 + level
        ):
            if scrape.ts >= warmup:
                values.append(parse(scrape.text).values)
                finished.extend(scrape.finished)
        v = np.array(values, dtype=float)
        whole &= np.all(v == np.round(v), axis=0)
        span_min = (len(v) - 1) * 5.0 / 60.0
        increase.append(np.where(cum, (v[-1] - v[0]) / span_min, 0.0))
        gauge.append(np.where(cum, 0.0, v.mean(axis=0)))
        spread.append(np.where(cum, 0.0, v.std(axis=0)))
        pools.append(_request_pool(finished))
    return Calibration(
        series,
        cum,
        integer,
        whole & ~cum,
        np.array(LEVELS),
        np.array(increase),
        np.array(gauge),
        np.array(spread),
        pools,
    )


def calibrate_profiles(seed: int = 0) -> dict[tuple[str, str], Calibration]:
    """Every profile of ``PROFILES`` calibrated with both request shapes: (model, "chat"/"long") -> it."""
    cals = {}
    for profile in PROFILES:
        cals[(profile.name, "chat")] = calibrate(profile, CHAT, seed=seed)
        cals[(profile.name, "long")] = calibrate(profile, LONG, seed=seed)
    return cals


def _request_pool(finished: list[SimRequest]) -> dict[str, np.ndarray]:
    """The requests that finished (a first token and an end): latencies and token counts, by column."""
    columns: dict[str, list[float]] = {
        key: [] for key in ("ttft", "e2e", "itl", "queue", "prompt", "completion", "cached", "max_tokens")
    }
    for r in finished:
        first, end = r.first_token_at, r.finished_at
        if first is None or end is None:
            continue
        columns["ttft"].append(first - r.arrival)
        columns["e2e"].append(end - r.arrival)
        columns["itl"].append((end - first) / max(r.generated - 1, 1))
        columns["queue"].append((r.first_scheduled or end) - r.arrival)
        columns["prompt"].append(r.prompt_len)
        columns["completion"].append(r.generated)
        columns["cached"].append(r.cached_tokens)
        columns["max_tokens"].append(r.max_tokens)
    return {key: np.array(values) for key, values in columns.items()}
