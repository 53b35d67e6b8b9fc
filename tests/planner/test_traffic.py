"""Recorded request-log rows as replay arrivals: a sampled row stands for as many requests as its
weight, a scale multiplies the traffic, requests that shared a prefix share it again, and the
model router's choice is asked for again."""

from __future__ import annotations

import pandas as pd
import pytest

from planner.traffic import arrivals

START = pd.Timestamp("2026-01-01T00:00:00Z")


def log(n: int = 200, weight: float = 1.0, **columns: object) -> pd.DataFrame:
    rows = {
        "ts": [START + pd.Timedelta(seconds=i) for i in range(n)],
        "model": "tiny-small",
        "route": "tiny-small/least_loaded",
        "tenant": "acme",
        "session": "",
        "prefix_hash": [f"h{i % 4}" for i in range(n)],
        "prompt_tokens": 300,
        "completion_tokens": 20,
        "max_tokens": 64,
        "cached_tokens": 0,
        "weight": weight,
    }
    rows.update(columns)
    return pd.DataFrame(rows)


def test_a_sampled_row_replays_as_the_requests_it_stood_for() -> None:
    assert len(arrivals(log(weight=1.0), START)) == 200
    expanded = len(arrivals(log(weight=4.0), START))
    assert 760 <= expanded <= 840  # one logged request in 4: four times the traffic
    doubled = len(arrivals(log(), START, scale=2.0))
    assert doubled == 400


def test_arrivals_keep_time_order_and_what_each_request_asked_for() -> None:
    out = arrivals(log(weight=2.5), START)
    assert [a.at for a in out] == sorted(a.at for a in out)
    assert out[0].at >= 0 and out[-1].at < 201
    assert {len(a.prompt) for a in out} == {300}
    assert {a.max_tokens for a in out} == {20}  # the output it produced
    assert {a.asked_tokens for a in out} == {64}  # what the client asked for
    assert {a.tenant for a in out} == {"acme"}


def test_requests_that_shared_a_prefix_share_it_again_and_others_do_not() -> None:
    out = arrivals(log(n=8, cached_tokens=100), START)
    same = [a for a in out if a.prefix_hash == "h0"]
    other = [a for a in out if a.prefix_hash == "h1"]
    assert same[0].prompt[:100] == same[1].prompt[:100]  # the cached length the log reported
    assert same[0].prompt[100:] != same[1].prompt[100:]
    assert same[0].prompt[:100] != other[0].prompt[:100]


def test_the_model_routers_choice_is_asked_for_again_only_with_a_router() -> None:
    routed = log(n=10, route="model-router:large/least_loaded", model="tiny-large")
    assert {a.model for a in arrivals(routed, START)} == {"auto"}
    assert {a.model for a in arrivals(routed, START, auto_model=None)} == {"tiny-large"}


def test_a_scale_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="above 0"):
        arrivals(log(), START, scale=0)
