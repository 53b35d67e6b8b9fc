"""Explain on scenario runs of the simulated fleet: the long-context rollout is put down to
long-context share and KV-cache saturation, beginning at the switch; the tenant shift to the new
tenant and the model router's decisions, with the small pool's cost per 1M tokens going up;
a steady run has nothing to explain. Plus the change-point search on known series."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from analytics.changepoints import change_points, episode, regression
from analytics.explain import explain, quantile_series
from analytics.explain.latency import _full_steps
from tests.analytics.scenario_data import INTERVAL, PRICES, play


@pytest.fixture(scope="module")
def rollout(chdb_dir):
    return play(chdb_dir, "long-context-rollout", seed=1)


@pytest.fixture(scope="module")
def shift(chdb_dir):
    return play(chdb_dir, "tenant-shift", seed=1)


def test_change_points_find_a_shift_and_nothing_in_noise() -> None:
    rng = np.random.default_rng(3)
    series = np.r_[rng.normal(0, 0.3, 60), rng.normal(2, 0.3, 40)]
    assert change_points(series) == [60]
    assert change_points(rng.normal(0, 0.3, 100)) == []
    two = np.r_[rng.normal(0, 0.2, 30), rng.normal(1.5, 0.2, 30), rng.normal(0, 0.2, 30)]
    assert change_points(two) == [30, 60]


def test_a_level_seen_for_a_step_or_two_is_no_baseline() -> None:
    """Seen on real engines: the first 10 s were quiet (p99 0.15 s), the steady traffic after
    them ran at 1 s, and the rollout at 4.6 s: the regression is the rollout, not everything
    after the quiet start."""
    ln = math.log
    bounds = [0, 1, 7, 20]  # steps: a quiet first one, six steady, thirteen after the switch
    assert episode([ln(0.15), ln(1.0), ln(4.6)], bounds) == (1, 2, 3)
    # a one-step dip just before the rise: the baseline is the steady level before it
    assert episode([ln(1.0), ln(0.6), ln(4.6)], [0, 10, 11, 20]) == (0, 2, 3)
    # nothing long enough before the rise: no baseline, nothing to explain
    assert episode([ln(0.15), ln(4.6)], [0, 2, 20]) is None


def test_a_steady_level_after_a_quiet_start_is_the_baseline_of_the_rise_that_follows() -> None:
    """Seen on real engines in CI: the quiet start lasted four 5 s steps (p99 0.17 s), the steady
    traffic ran at 0.45 s for nine, then the rollout at 15 s: the break is the rollout's."""
    ln = math.log
    assert episode([ln(0.17), ln(0.45), ln(15.0)], [0, 4, 13, 33]) == (1, 2, 3)
    # a rise in two similar steps (a ramp) starts where it began
    assert episode([ln(1.0), ln(2.0), ln(4.0)], [0, 10, 20, 30]) == (0, 1, 3)
    # a big step after a short first one (under three steps) does not move the start: no level held
    assert episode([ln(0.2), ln(0.5), ln(15.0)], [0, 10, 12, 30]) == (0, 1, 3)


def test_a_noisy_baseline_does_not_pull_the_onset_a_minute_before_the_rollout() -> None:
    """Seen on real engines (2026-12-07, two replicas 91 % busy before the switch): p99 TTFT per 5 s
    step of about ten requests, two steps of it a few fast ones (17 and 38 ms), then the rollout at
    step 14. The regression starts there, not at step 3 where the noise first rose over the dip."""
    p99 = [0.727, 0.193, 0.0172, 0.525, 0.380, 1.086, 0.564, 0.425, 0.355, 0.621, 0.469, 0.0377, 0.0393, 0.523]
    p99 += [4.03, 6.22, 15.1, 13.5, 16.4, 14.8, 21.7, 19.9, 14.8, 21.4, 23.1, 25.2, 39.8, 41.5, 40.5, 42.3, 38.2, 39.4]
    bounds, levels, found = regression(np.log(p99))
    base, first, _end = found or (0, 0, 0)  # no regression found: the rollout missed, as a wrong start would be
    assert bounds[first] == 14, (bounds, found)
    assert math.exp(levels[base]) < 0.6  # the level before is the baseline's, not the regression's


def test_a_last_step_of_a_few_requests_does_not_hide_the_rise() -> None:
    # a demo's p99 TTFT per minute on a slow day (3 steady minutes, the rollout, the rollback), and a
    # window that ends 10 s into a minute: that step holds 2 requests and a p99 of 0.06 s. Left in, the
    # one split the series allows goes to the fall at the end and no rise is found
    p99 = [0.83, 2.52, 0.28, 4.36, 18.46, 2.16, 7.06, 9.99, 16.5, 13.42, 0.9, 0.63, 0.06]
    n = [11, 12, 10, 10, 9, 11, 10, 12, 10, 9, 11, 10, 2]
    series = pd.DataFrame(
        {"ts": pd.date_range("2026-12-02 17:47", periods=13, freq="60s", tz="UTC"), "value": p99, "n": n}
    )
    assert regression(np.log(series["value"].to_numpy())).found is None
    full = _full_steps(series)
    assert len(full) == 12 and full["n"].min() >= 9
    bounds, levels, found = regression(np.log(full["value"].to_numpy()))
    assert found == (0, 1, 2) and bounds[1] == 3  # the rise at the fourth minute, from the steady 0.8 s
    assert math.exp(levels[0]) == pytest.approx(0.83, abs=0.01)
    # a window beginning inside a step loses that step too; full steps are all kept
    assert len(_full_steps(series.assign(n=[1] + n[1:-1] + [10]))) == 12
    assert len(_full_steps(series.assign(n=[10] * 13))) == 13


def test_long_context_rollout_is_put_down_to_long_prompts_filling_the_kv_cache(rollout) -> None:
    ex = explain(rollout.client, rollout.start, rollout.end)
    switch = rollout.phase("rollout")
    assert ex.source == "request log" and ex.step == INTERVAL
    assert ex.after > 3 * ex.before
    # the regression began at the switch, when the long prompts arrived ...
    assert abs((ex.onset - switch).total_seconds()) <= 2 * INTERVAL, (ex.onset, switch)
    # ... and the p99 itself rose for good once the caches had filled and requests queued
    assert -2 * INTERVAL <= (ex.break_at - switch).total_seconds() <= 90, (ex.break_at, switch)
    assert f"it began at {ex.onset:%H:%M:%S}" in ex.sentence or ex.onset == ex.break_at
    assert set(ex.evidence["signal"].head(2)) == {"long-context share", "KV-cache saturation"}, ex.evidence
    long_share = ex.evidence.set_index("signal").loc["long-context share"]
    assert int(long_share["after"].rstrip("%")) >= 25 and int(long_share["before"].rstrip("%")) <= 15
    # short prompts slowed as well: contention, not only a heavier mix
    short = ex.strata.set_index("band").loc["short"]
    assert short["slowdown"] > 1.5
    # the traffic before the cache it filled (scoring.cause_first): the rollout is the cause, the cache how it hurt
    assert "Consistent with long-context share" in ex.sentence and "KV-cache saturation" in ex.sentence
    assert "contention" in ex.sentence
    # the long prompts' own prefixes pushed the shared ones out: the prefix-cache evidence says why they missed
    cache = ex.evidence.set_index("signal").loc["prefix-cache hit rate"]
    assert cache["score"] > 0
    shares = re.findall(r"(\d+)% (?:of the misses were routing misses|evictions|new prefixes)", cache["detail"])
    assert len(shares) == 3 and 98 <= sum(map(int, shares)) <= 102, cache["detail"]
    assert "affinity routing would have hit" in cache["detail"]


def test_a_window_much_longer_than_the_data_keeps_its_steps(rollout) -> None:
    # an alert's link asks for 90 minutes before the alert and 30 after; a young fleet (a demo) has minutes of
    # requests in it: the steps hold as many requests as in a window the size of the data, and the break is found
    tight = explain(rollout.client, rollout.start, rollout.end)
    wide = explain(rollout.client, rollout.start - timedelta(minutes=90), rollout.end + timedelta(minutes=30))
    assert wide.request_step == tight.request_step, (wide.request_step, tight.request_step)
    switch = rollout.phase("rollout")
    assert wide.break_at is not None, wide.sentence
    assert -2 * INTERVAL <= (wide.break_at - switch).total_seconds() <= 90, (wide.break_at, switch)
    # a range over 6 hours reads the samples' 1-minute rollup: the steps are whole minutes of it, not 5 s steps
    # that would leave 11 of 12 capacity steps empty (the window's own 180 points would be 5-minute steps)
    day = explain(rollout.client, rollout.start - timedelta(hours=6), rollout.end + timedelta(hours=1))
    assert day.step == 60, day.step


def test_tenant_shift_is_put_down_to_the_new_tenant_and_the_router(shift) -> None:
    ex = explain(shift.client, shift.start, shift.end, prices=PRICES)
    switch = shift.phase("bigcorp-onboarded")
    assert abs((ex.break_at - switch).total_seconds()) <= 2 * INTERVAL, (ex.break_at, switch)
    assert abs((ex.onset - switch).total_seconds()) <= 2 * INTERVAL
    assert list(ex.evidence["signal"].head(2)) == ["tenant mix", "route decisions"], ex.evidence
    top = ex.evidence.set_index("signal")
    assert "tenant bigcorp" in top.loc["tenant mix", "detail"]
    assert "route model-router:large" in top.loc["route decisions", "detail"]
    dims = ex.dimensions.set_index(["dimension", "value"])
    assert dims.loc[("tenant", "bigcorp"), "baseline_share"] == 0
    assert dims.loc[("tenant", "bigcorp"), "slow_share"] > 0.5
    # the small replicas lost the traffic the router moved: the same spend buys fewer tokens
    cost = ex.cost.set_index(["model", "period"])["cost_per_million_tokens"]
    assert cost[("tiny-small", "after")] > 1.3 * cost[("tiny-small", "before")]
    assert "tenant mix (0% ->" in ex.sentence
    # in the whole fleet the same spend now buys far more tokens (bigcorp's long prompts)
    assert cost[("(fleet)", "after")] < cost[("(fleet)", "before")]


def test_a_steady_run_has_no_regression_to_explain(chdb_dir) -> None:
    steady = play(chdb_dir, "steady", seed=2)
    ex = explain(steady.client, steady.start, steady.end)
    assert ex.break_at is None, ex.sentence
    assert ex.evidence.empty and "no lasting rise" in ex.sentence


def test_explain_takes_any_timezone_and_refuses_nonsense(rollout) -> None:
    from datetime import timedelta, timezone

    paris = timezone(timedelta(hours=1))
    ex = explain(rollout.client, rollout.start.astimezone(paris), rollout.end.astimezone(paris))
    assert ex.break_at is not None and ex.break_at.tzinfo is not None
    with pytest.raises(ValueError, match="unknown latency"):
        explain(rollout.client, rollout.start, rollout.end, latency="ttfb")
    with pytest.raises(ValueError, match="q must be within"):
        explain(rollout.client, rollout.start, rollout.end, q=1.5)


def test_too_little_data_says_so_with_an_empty_but_complete_evidence_table(rollout) -> None:
    from datetime import timedelta

    ex = explain(rollout.client, rollout.start - timedelta(hours=3), rollout.start - timedelta(hours=2))
    assert ex.break_at is None and ex.sentence.startswith("not enough data")
    assert ex.evidence.empty and {"signal", "score", "moved_at", "resolution_s"} <= set(ex.evidence.columns)


def test_the_quantile_series_alone_is_what_explain_draws(rollout) -> None:
    """What the Investigate page draws before the explanation is worked out: the same line."""
    head = quantile_series(rollout.client, rollout.start, rollout.end)
    ex = explain(rollout.client, rollout.start, rollout.end)
    assert head.break_at is None and head.evidence.empty  # nothing looked for yet
    assert (head.metric, head.source, head.step, head.request_step) == (ex.metric, ex.source, ex.step, ex.request_step)
    assert len(head.series) > 8 and head.series.equals(ex.series)
    with pytest.raises(ValueError, match="unknown latency"):
        quantile_series(rollout.client, rollout.start, rollout.end, latency="ttfb")
