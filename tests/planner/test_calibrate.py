"""The simulator fitted to a recorded fleet: given the medians a fleet of known cost produced, the
fit finds that cost again, and its replay gives those medians back."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pandas as pd
import pytest

from fleet.sim.engine import EngineConfig
from planner.calibrate import fit, medians
from planner.fleet import Pool, Variant
from planner.replay import replay
from planner.traffic import Arrival

DEFAULT = EngineConfig(speed=1.0)


def traffic(seconds: float = 300.0, rate: float = 2.0) -> list[Arrival]:
    rng = random.Random(7)
    out, t, i = [], 0.0, 0
    while (t := t + rng.expovariate(rate)) < seconds:
        n = rng.choice([100, 400, 1500, 3000])
        out.append(Arrival(t, "m", "t", list(range(i * 4000, i * 4000 + n)), rng.randint(30, 80), f"k{i}", f"k{i}"))
        i += 1
    return out


def fleet(step_factor: float = 1.0, prefill_factor: float = 1.0) -> Variant:
    engine = replace(
        DEFAULT,
        step_overhead_s=DEFAULT.step_overhead_s * step_factor,
        prefill_token_s=DEFAULT.prefill_token_s * prefill_factor,
    )
    return Variant("recorded", {"m": Pool("m", 2, "L4", 1, 64_000, engine)})


def test_the_fit_finds_the_recorded_fleets_engine_cost_again() -> None:
    arrivals = traffic()
    recorded = replay(fleet(step_factor=3.0, prefill_factor=2.0), arrivals, 300.0)
    observed = medians(recorded.requests)
    assert set(observed) == {"m"}

    fitted, result = fit(fleet(), arrivals, observed, 300.0)
    assert result.step_factor["m"] == pytest.approx(3.0, rel=0.2)
    assert result.prefill_factor["m"] == pytest.approx(2.0, rel=0.3)
    engine = fitted.pools["m"].engine
    assert engine.step_overhead_s == pytest.approx(DEFAULT.step_overhead_s * result.step_factor["m"])
    # what the fitted fleet replays is the recorded medians, within a few percent
    for simulated, seen in zip(result.simulated["m"], observed["m"], strict=True):
        assert simulated == pytest.approx(seen, rel=0.1)
    assert result.error < 0.1 and 1 <= result.iterations <= 6
    assert "m: step cost x" in result.describe()


def test_medians_read_the_time_per_token_and_the_longest_prompts_ttft() -> None:
    rows = pd.DataFrame(
        {
            "model": ["m"] * 4,
            "prompt_tokens": [100, 100, 100, 4000],
            "ttft": [0.1, 0.1, 0.1, 2.0],
            "e2e": [1.1, 1.1, 1.1, 3.0],
            "completion_tokens": [11, 11, 11, 11],
            "outcome": ["ok"] * 4,
        }
    )
    per_token, long_ttft = medians(rows)["m"]
    assert per_token == pytest.approx(0.1)  # (e2e - ttft) / (tokens - 1)
    assert long_ttft == pytest.approx(2.0)  # the longest quarter of the prompts
    assert not math.isnan(per_token)
