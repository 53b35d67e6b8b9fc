"""The simulator's cost per model, fitted to the recorded fleet: how fast each pool decodes and
prefills, so that replaying its own traffic gives its own latencies.

In:  the recorded fleet (``planner.fleet.Variant``, its KV caches as observed), the recorded
     arrivals (``planner.traffic``), and the observed median ITL and TTFT per model.
Out: ``fit`` -> (the variant with each pool's engine fitted, ``Fit``: per model the step-cost and
     prefill factors, observed against simulated medians, iterations); ``medians``.

Two numbers per model: the engine step's fixed cost moves the time per output token (decode
steps), the prefill cost per token moves the TTFT of long prompts. Each replay of the fitting
window (the first ``FIT_WINDOW_S`` of its traffic) moves both towards the observed medians (a
fixed point: each factor times observed / simulated), and per model the iteration that came
closest is kept. The medians are what is fitted; the
tails (p99 TTFT) and the KV cache's usage are then what a backtest checks, as they were not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from planner.fleet import Variant
from planner.replay import replay
from planner.traffic import Arrival

__all__ = ["FIT_WINDOW_S", "Fit", "fit", "medians"]

FIT_WINDOW_S = 600.0  # the first minutes of the window's traffic are replayed to fit
ITERATIONS = 6
STEP = (0.2, 5.0)  # one iteration moves a factor at most this much


@dataclass(frozen=True)
class Fit:
    step_factor: dict[str, float]  # the engine step's fixed cost, times the simulator's default
    prefill_factor: dict[str, float]  # the prefill cost per token, times the default
    observed: dict[str, tuple[float, float]]  # model -> (time per output token p50, long prompts' TTFT p50), s
    simulated: dict[str, tuple[float, float]]
    iterations: int
    error: float  # the mean absolute log ratio of simulated to observed medians

    def describe(self) -> str:
        parts = []
        for model in sorted(self.step_factor):
            obs, sim = self.observed.get(model), self.simulated.get(model)
            if obs and sim:
                parts.append(
                    f"{model}: step cost x{self.step_factor[model]:.3g}, prefill x{self.prefill_factor[model]:.3g} "
                    f"(median time per output token {obs[0] * 1000:.3g} ms observed / {sim[0] * 1000:.3g} ms "
                    "simulated; TTFT of the longest prompts "
                    f"{obs[1]:.3g} / {sim[1]:.3g} s)"
                )
        return "; ".join(parts)


def medians(requests: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per model: the median time per output token after the first ((e2e - TTFT) / (tokens - 1),
    request by request: the same measure on the recorded rows and on a replay's, whatever the
    client saw of the stream) and the median TTFT of the longest quarter of the prompts (what a
    prefill costs per token shows there: a short prompt's TTFT is one step's fixed cost).
    ``requests``: ``[model, prompt_tokens, ttft, e2e, completion_tokens, outcome]``."""
    ok = requests[requests["outcome"].isin(["ok", ""]) & (requests["ttft"] > 0)]  # a row that timed no TTFT
    out = {}
    for model, g in ok.groupby("model"):
        decoding = g[g["completion_tokens"] > 1]
        per_token = ((decoding["e2e"] - decoding["ttft"]) / (decoding["completion_tokens"] - 1)).to_numpy(float)
        longest = g[g["prompt_tokens"] >= g["prompt_tokens"].quantile(0.75)]
        ttft = longest["ttft"].to_numpy(float)
        if len(per_token) and len(ttft):
            out[str(model)] = (float(np.median(per_token)), float(np.median(ttft)))
    return out


def _medians(variant: Variant, arrivals: list[Arrival], seconds: float) -> dict[str, tuple[float, float]]:
    found = medians(replay(variant, arrivals, seconds).requests)
    return {m: found.get(m, (math.nan, math.nan)) for m in variant.pools}


def _clamp(x: float) -> float:
    return min(STEP[1], max(STEP[0], x)) if math.isfinite(x) and x > 0 else 1.0


def fit(
    variant: Variant, arrivals: list[Arrival], observed: dict[str, tuple[float, float]], seconds: float
) -> tuple[Variant, Fit]:
    """``variant`` with each pool's engine step and prefill cost fitted (see the module docstring)."""
    first = arrivals[0].at if arrivals else 0.0  # the window may open before the traffic did
    window = min(seconds, first + FIT_WINDOW_S)
    sample = [a for a in arrivals if a.at < window]
    overhead = {m: 1.0 for m in variant.pools}
    prefill = {m: 1.0 for m in variant.pools}
    base = {m: (p.engine.step_overhead_s, p.engine.prefill_token_s) for m, p in variant.pools.items()}

    def with_factors(steps: dict[str, float], prefills: dict[str, float]) -> Variant:
        return replace(
            variant,
            pools={
                m: replace(
                    p,
                    engine=replace(
                        p.engine, step_overhead_s=base[m][0] * steps[m], prefill_token_s=base[m][1] * prefills[m]
                    ),
                )
                for m, p in variant.pools.items()
            },
        )

    # per model, the iteration that came closest (the pools replay side by side but are fitted each on its own)
    best: dict[str, tuple[float, float, float, tuple[float, float], int]] = {}
    for i in range(ITERATIONS):
        simulated = _medians(with_factors(overhead, prefill), sample, window)
        for m in variant.pools:
            obs = observed.get(m)
            if not obs:
                continue
            errors = [
                abs(math.log(s / o))
                for s, o in zip(simulated[m], obs, strict=True)
                if math.isfinite(s) and math.isfinite(o) and s > 0 and o > 0
            ]
            error = float(np.mean(errors)) if errors else math.inf
            if m not in best or error < best[m][0]:
                best[m] = (error, overhead[m], prefill[m], simulated[m], i + 1)
            # the first move whole, then half of it (in log terms): a pool near its capacity queues steeply
            # as its cost rises, and the whole move overshoots back and forth
            damp = 1.0 if i == 0 else 0.5
            overhead[m] *= _clamp(obs[0] / simulated[m][0]) ** damp
            prefill[m] *= _clamp(obs[1] / simulated[m][1]) ** damp
    overheads = {m: best[m][1] if m in best else 1.0 for m in variant.pools}
    factors = {m: best[m][2] if m in best else 1.0 for m in variant.pools}
    chosen = with_factors(overheads, factors)
    simulated_best = {m: b[3] for m, b in best.items()}
    finite = [b[0] for b in best.values() if math.isfinite(b[0])]
    error = float(np.mean(finite)) if finite else math.inf
    iterations = max((b[4] for b in best.values()), default=0)
    return chosen, Fit(overheads, factors, dict(observed), simulated_best, iterations, error)
