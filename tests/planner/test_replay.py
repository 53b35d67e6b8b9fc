"""The replay on its own, without a store: recorded arrivals through a fleet variant in virtual
time. More replicas serve the same traffic no slower; what the gateway or an engine refuses is
counted as such; the same input replays the same way."""

from __future__ import annotations

import random

import numpy as np

from fleet.sim.engine import EngineConfig
from planner.fleet import Pool, Variant
from planner.replay import replay
from planner.traffic import Arrival

MODEL = "m"


def busy_traffic(n: int = 400, rate: float = 40.0, seed: int = 1) -> list[Arrival]:
    """Poisson arrivals of medium prompts: more than one slow replica keeps up with."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        prompt = list(range(i * 1000, i * 1000 + rng.randint(200, 600)))
        out.append(Arrival(t, MODEL, "t", prompt, rng.randint(20, 60), f"k{i}", f"k{i}"))
    return out


def fleet(
    replicas: int,
    *,
    kv_tokens: int = 32_000,
    max_in_flight: int = 64,
    max_queue: int = 128,
    queue_timeout_s: float = 30,
) -> Variant:
    pool = Pool(MODEL, replicas, "L4", 1, kv_tokens, EngineConfig(speed=0.5))
    return Variant(
        "v", {MODEL: pool}, max_in_flight=max_in_flight, max_queue=max_queue, queue_timeout_s=queue_timeout_s
    )


def p99_ttft(variant: Variant, traffic: list[Arrival]) -> float:
    ok = replay(variant, traffic, traffic[-1].at).requests.query("outcome == 'ok'")
    return float(np.quantile(ok["ttft"], 0.99))


def test_more_replicas_give_a_lower_or_equal_p99_ttft() -> None:
    traffic = busy_traffic()
    one, two, four = (p99_ttft(fleet(n), traffic) for n in (1, 2, 4))
    assert four <= two <= one
    assert four < one  # the single replica queued: the difference is real, not a tie


def test_every_arrival_is_one_row_and_spreads_over_the_replicas() -> None:
    traffic = busy_traffic(n=120)
    outcome = replay(fleet(3), traffic, traffic[-1].at)
    assert len(outcome.requests) == len(traffic)
    assert set(outcome.requests["outcome"]) == {"ok"}
    assert set(outcome.requests["replica"]) == set(outcome.replicas) == {f"{MODEL}-plan-{i}" for i in range(3)}
    assert (outcome.requests["completion_tokens"] > 0).all()
    assert set(outcome.kv["replica"]) == set(outcome.replicas)
    assert outcome.kv["kv"].between(0, 1).all()


def test_a_full_gateway_queue_rejects_and_a_prompt_longer_than_the_model_is_too_long() -> None:
    traffic = busy_traffic(n=200, rate=400.0)
    limited = fleet(1, max_in_flight=2, max_queue=3, queue_timeout_s=0.5)
    outcomes = replay(limited, traffic, traffic[-1].at).requests["outcome"].value_counts()
    assert outcomes.get("rejected", 0) > 0 and outcomes.get("ok", 0) > 0

    long = [Arrival(0.0, MODEL, "t", list(range(10_000)), 10, "k", "k")]
    assert list(replay(fleet(1, kv_tokens=4_096), long, 1.0).requests["outcome"]) == ["too_long"]


def test_the_same_input_replays_the_same_way() -> None:
    traffic = busy_traffic(n=150)
    a, b = (replay(fleet(2), traffic, traffic[-1].at) for _ in range(2))
    assert a.requests.equals(b.requests)
    assert a.kv.equals(b.kv)
