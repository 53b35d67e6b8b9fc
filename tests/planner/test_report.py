"""A replay's outcome as the numbers a plan compares: a row per model and one for the fleet,
the spend the prices give, SLO attainment, and one clear line where a GPU has no price."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from planner.errors import PlannerError
from planner.fleet import PlanError, Pool, Variant
from planner.replay import Outcome
from planner.report import FLEET, summary
from storage.catalog import SloTarget

PRICES = {"L4": 0.8, "H100": 4.0}


def outcome() -> Outcome:
    requests = pd.DataFrame(
        {
            "at": [0.0, 1.0, 2.0, 3.0],
            "model": ["small", "small", "large", "large"],
            "replica": ["s0", "s1", "l0", ""],
            "tenant": "acme",
            "prompt_tokens": [100, 100, 200, 200],
            "completion_tokens": [10, 10, 20, 0],
            "cached_tokens": [50, 0, 100, 0],
            "ttft": [0.1, 0.3, 1.0, np.nan],
            "itl": [0.01, 0.01, 0.02, np.nan],
            "e2e": [0.2, 0.4, 1.5, np.nan],
            "queue": [0.0, 0.0, 0.1, np.nan],
            "outcome": ["ok", "ok", "ok", "rejected"],
        }
    )
    kv = pd.DataFrame(
        {
            "t": [0.0, 0.0, 1.0],
            "replica": ["s0", "l0", "l0"],
            "model": ["small", "large", "large"],
            "kv": [0.2, 0.5, 0.95],
        }
    )
    pools = {"small": Pool("small", 2, "L4", 1, 10_000), "large": Pool("large", 1, "H100", 2, 20_000)}
    gaps = {"small": np.array([0.01, 0.01]), "large": np.array([0.02])}
    return Outcome(requests, gaps, kv, 3600.0, Variant("v", pools))


def test_a_row_per_model_and_one_for_the_fleet_with_the_spend_the_prices_give() -> None:
    s = summary(outcome(), PRICES).set_index("model")
    assert list(s.index) == ["small", "large", FLEET]
    assert s.loc["small", "spend_per_hour"] == pytest.approx(2 * 1 * 0.8)
    assert s.loc["large", "spend_per_hour"] == pytest.approx(1 * 2 * 4.0)
    assert s.loc[FLEET, "spend_per_hour"] == pytest.approx(1.6 + 8.0)
    assert s.loc[FLEET, "requests"] == 4 and s.loc[FLEET, "rejected"] == 1
    assert s.loc["small", "hit_rate"] == pytest.approx(50 / 200)
    assert s.loc["large", "kv_saturated"] == pytest.approx(0.5)  # one of its two samples at 90 % or more
    assert math.isnan(s.loc[FLEET, "slo_attainment"])  # no targets: nothing to attain


def test_slo_attainment_counts_rejected_requests_as_missed() -> None:
    targets = [
        SloTarget(model="small", metric="ttft", threshold_seconds=0.2),
        SloTarget(model="large", metric="ttft", threshold_seconds=2.0),
    ]
    s = summary(outcome(), PRICES, targets).set_index("model")
    assert s.loc["small", "slo_attainment"] == pytest.approx(0.5)  # 0.1 s met, 0.3 s missed
    assert s.loc["large", "slo_attainment"] == pytest.approx(0.5)  # met once, rejected once
    assert s.loc[FLEET, "goodput"] == pytest.approx(2 / 3600)


def test_a_gpu_without_a_price_is_one_line_naming_it() -> None:
    with pytest.raises(PlanError, match=r"no GPU price for 'H100' \(pool large\)") as raised:
        summary(outcome(), {"L4": 0.8})
    assert isinstance(raised.value, PlannerError) and isinstance(raised.value, ValueError)
