"""Autoscaling policies replayed: the planner's replay resizes a pool tick by tick with the bundled
autoscaler's own decisions, bills each replica from ready to removed, and compares policies.

Hand-built traffic (a ramp one slow replica cannot carry): an earlier out-threshold scales out
sooner, costs more and keeps the p99 TTFT lower; min/max hold; a cold start delays serving and is
not billed. On a recorded autoscaled run (``scale-ramp`` on ``fleet-autoscale.yaml``, the fleet's
virtual-time autoscaler): the recorded policy replays within 25 % of the observed spend per hour
and p99 TTFT, and two other policies compare as they should. Bad policies: one line naming the
bad token."""

from __future__ import annotations

import math
import random

import pytest

from fleet.autoscale.policy import ScalePolicy
from fleet.sim.engine import EngineConfig
from fleetscope.plan_cli import _print_policies
from planner.fleet import PlanError, Pool, Variant
from planner.plan import plan
from planner.policies import Autoscale, comparison, parse, policy_variants, spec_policies
from planner.replay import Outcome, replay
from planner.report import summary
from planner.traffic import Arrival
from storage.catalog import SloTarget
from tests.conftest import ROOT, run_cli
from tests.planner.scaled_recording import record

M = "m"
PRICE = {"L4": 1.0}  # $1 per GPU-hour: spend per hour reads as replica-hours per hour
SECONDS = 240.0


def ramp(seed: int = 1, stop: float = SECONDS) -> list[Arrival]:
    """2 -> 14 requests/s over 150 s, then steady to ``stop``: more than one replica (speed 0.25) carries."""
    rng = random.Random(seed)
    out, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(2.0 + 12.0 * min(1.0, t / 150))
        if t >= stop:
            return out
        i += 1
        prompt = list(range(i * 1000, i * 1000 + rng.randint(200, 600)))
        out.append(Arrival(t, M, "t", prompt, rng.randint(20, 60), f"k{i}", f"k{i}"))


def kv_policy(out: float, **settings: float) -> ScalePolicy:
    return ScalePolicy.model_validate(
        {"min_replicas": 1, "max_replicas": 3, "out": {"kv_cache_usage": out}, "in": {"kv_cache_usage": 0.02},
         "out_for_s": 5, **settings}
    )  # fmt: skip


def run(policy: ScalePolicy, cold_start_s: float = 20.0, traffic: list[Arrival] | None = None) -> Outcome:
    pool = Pool(M, 1, "L4", 1, 32_000, EngineConfig(speed=0.25), autoscale=policy, cold_start_s=cold_start_s)
    variant = Variant("v", {M: pool}, max_in_flight=1_000_000, max_queue=1_000_000)
    return replay(variant, traffic if traffic is not None else ramp(), SECONDS)


def numbers(outcome: Outcome) -> dict[str, float]:
    return dict(summary(outcome, PRICE).set_index("model").loc[M, ["p99_ttft", "spend_per_hour", "max_replicas"]])


def first(outcome: Outcome, kind: str) -> float:
    return float(outcome.scaling.loc[outcome.scaling["kind"] == kind, "t"].min())


def test_an_earlier_out_threshold_scales_out_sooner_costs_more_and_keeps_the_p99_lower() -> None:
    early, late = run(kv_policy(0.3)), run(kv_policy(0.9))
    e, lt = numbers(early), numbers(late)
    print({"early": e, "late": lt, "out": (first(early, "scale_out"), first(late, "scale_out"))})
    assert first(early, "scale_out") < first(late, "scale_out")
    assert e["p99_ttft"] < 0.5 * lt["p99_ttft"]  # the late pool queued while its replica started
    assert e["spend_per_hour"] > lt["spend_per_hour"]  # and paid for its replica sooner
    assert lt["spend_per_hour"] > 1.0  # both scaled: more than the one replica's $1/h
    # every request was served, none lost by a scale-out
    assert set(early.requests["outcome"]) == {"ok"} and len(early.requests) == len(ramp())


def test_max_replicas_caps_the_pool_and_the_autoscaler_holds_at_max() -> None:
    capped = run(kv_policy(0.05, max_replicas=2, out_cooldown_s=10))  # it would add a replica at every chance
    assert numbers(capped)["max_replicas"] == 2
    assert set(capped.up["replica"]) == {"m-plan-0", "m-scaled-1"}
    assert (capped.scaling["kind"] == "held_at_max").any()
    free = run(kv_policy(0.05, out_cooldown_s=10))
    assert numbers(free)["max_replicas"] == 3  # the same traffic, uncapped: a third one


def test_min_replicas_are_started_first_and_a_quiet_pool_shrinks_to_them_not_below() -> None:
    quiet = [a for a in ramp(stop=120.0) if a.at < 120]  # the traffic stops at 2 min; the window runs 4
    outcome = run(kv_policy(0.1, min_replicas=2, in_for_s=20, in_cooldown_s=20), traffic=quiet)
    ev = outcome.scaling
    assert ev.iloc[0]["signal"] == "min_replicas" and ev.iloc[0]["t"] == 0  # 1 replica recorded, min 2: out at once
    assert numbers(outcome)["max_replicas"] == 3  # the traffic grew it to three ...
    assert (ev["kind"] == "scale_in").any()  # ... and the quiet pool gave replicas back ...
    up = outcome.up
    for t in range(25, int(SECONDS)):  # ... but never fewer than two after the first cold start
        assert ((up["start"] <= t) & (up["end"] > t)).sum() >= 2, t
    last = up["end"].max()
    assert last == SECONDS
    # scale-ins drained: nothing was cut off
    assert set(outcome.requests["outcome"]) == {"ok"}


def test_a_cold_start_delays_serving_and_is_not_billed() -> None:
    slow, instant = run(kv_policy(0.3, max_replicas=2), 60.0), run(kv_policy(0.3, max_replicas=2), 0.0)
    decided = first(slow, "scale_out")
    assert decided == first(instant, "scale_out")  # the same traffic, the same decision
    joined = float(slow.up.loc[slow.up["replica"] == "m-scaled-1", "start"].iloc[0])
    assert joined == pytest.approx(decided + 60, abs=1.0)
    served = slow.requests[slow.requests["replica"] == "m-scaled-1"]
    assert len(served) and served["at"].min() >= joined - 1.0  # the router sent it nothing while it started
    s, i = numbers(slow), numbers(instant)
    assert s["p99_ttft"] > i["p99_ttft"]  # the minute without the replica queued requests
    # the minute of cold start is not billed: one replica-minute less at $1/GPU-hour
    assert (i["spend_per_hour"] - s["spend_per_hour"]) * SECONDS / 3600 == pytest.approx(60 / 3600, abs=2 / 3600)


def test_a_replica_count_makes_an_autoscaled_pool_a_fixed_one() -> None:
    pool = Pool(M, 1, "L4", 1, 32_000, autoscale=kv_policy(0.3))
    fixed = Variant("v", {M: pool}).with_pool(M, replicas=2)
    assert fixed.pools[M].autoscale is None and fixed.pools[M].replicas == 2
    assert "autoscaled, from 1" in Variant("v", {M: pool}).describe()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("tiny-large", "write POOL=TOKEN"),
        ("tiny-large=max3", "'max3' is not KEY:VALUE"),
        ("tiny-large=max:three", "'max:three': 'three' is not a number"),
        ("tiny-large=max:2.5", "'max:2.5': '2.5' must be a whole number"),
        ("tiny-large=out.kv:0.7", "unknown signal 'kv'"),
        ("tiny-large=speed:2", "unknown setting 'speed'"),
        ("tiny-large=cooldown:-5", "'cooldown:-5': '-5' must be a number of 0 or more"),
    ],
)
def test_a_bad_policy_token_is_named(text: str, named: str) -> None:
    with pytest.raises(PlanError, match=None) as caught:
        parse(text)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_a_policy_that_cannot_be_says_why() -> None:
    base = Variant("v", {M: Pool(M, 1, "L4", 1, 32_000)})
    with pytest.raises(PlanError, match=r"--autoscale m=min:4,max:2: min_replicas \(4\) is above max_replicas \(2\)"):
        policy_variants(base, Autoscale((parse("m=min:4,max:2"),)))
    with pytest.raises(PlanError, match="unknown model 'other'"):
        policy_variants(base, Autoscale((parse("other=max:2"),)))
    # a pool that did not autoscale starts from the defaults; off drops a signal
    (v,) = policy_variants(base, Autoscale((parse("m=max:4,out.requests_waiting:off,out.kv_cache_usage:0.6"),)))
    assert v.name == "m autoscaled max:4,out.requests_waiting:off,out.kv_cache_usage:0.6"
    assert v.pools[M].autoscale == ScalePolicy(max_replicas=4, out={"kv_cache_usage": 0.6})


def test_the_cli_asks_for_policies_and_names_a_bad_token(tmp_path) -> None:
    helped = run_cli("plan", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--autoscale" in helped.stdout and "out.SIGNAL" in helped.stdout
    bad = run_cli("plan", "--autoscale", "tiny-large=max:3,out_fr:15", cwd=tmp_path)
    assert bad.returncode == 2 and "'out_fr:15': unknown setting 'out_fr'" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------- the backtest
LARGE = "tiny-large"
EARLY = "tiny-large=out.requests_waiting:0.2,out_for:5"
LATE = "tiny-large=max:2,out.kv_cache_usage:0.9,out.requests_waiting:3"


@pytest.fixture(scope="module")
def recorded(chdb_dir):
    recording = record(chdb_dir, "scale-ramp", "fleet-autoscale.yaml", seed=1)
    ask = spec_policies(ROOT / "fleet-autoscale.yaml", [parse(EARLY), parse(LATE)])
    targets = [SloTarget(LARGE, "ttft", 6.0, 0.99)]
    planned = plan(recording.client, recording.start, recording.end, prices={"cpu-demo": 0.10}, targets=targets,
                   autoscale=ask)  # fmt: skip
    return recording, ask, planned


def test_the_recorded_pool_replays_from_its_start_size_with_the_specs_policy_and_the_recorded_cold_start(
    recorded,
) -> None:
    recording, ask, planned = recorded
    pool = planned.fleets["recorded (replayed)"].pools[LARGE]
    assert recording.events > 0
    assert pool.replicas == 1 and pool.observed_replicas >= 2  # it scaled out in the window, from one
    assert pool.autoscale == ask.recorded[LARGE] and pool.policy_source == "the fleet spec"
    assert pool.cold_start_s == pytest.approx(ask.recorded[LARGE].cold_start_s, abs=1.0)  # decision -> ready
    assert planned.fleets["recorded (replayed)"].pools["tiny-small"].autoscale is None  # the fixed pool stays fixed


def test_the_recorded_policy_replays_within_25_percent_of_the_observed_spend_and_p99(recorded) -> None:
    _recording, ask, planned = recorded
    compared = comparison(planned, ask).set_index("fleet")
    observed, replayed = compared.loc["recorded (observed)"], compared.loc["recorded (replayed)"]
    print(compared.drop(columns="policy").to_string())
    for column in ("spend_per_hour", "p99_ttft", "fleet_spend_per_hour"):
        error = (replayed[column] - observed[column]) / observed[column]
        assert abs(error) <= 0.25, (column, observed[column], replayed[column])
    assert replayed["max_replicas"] == observed["max_replicas"]
    assert replayed["cold_starts"] == observed["cold_starts"] >= 1
    bt = planned.backtest.set_index("model")
    assert abs(bt.loc[LARGE, "p99_ttft_error"]) <= 0.25


def test_two_policies_compare_on_the_recorded_run(recorded, capsys) -> None:
    _recording, ask, planned = recorded
    compared = comparison(planned, ask).set_index("fleet")
    early, late = (
        compared.loc[f"{LARGE} autoscaled {EARLY.split('=')[1]}"],
        compared.loc[f"{LARGE} autoscaled {LATE.split('=')[1]}"],
    )
    assert early["p99_ttft"] < late["p99_ttft"] and early["spend_per_hour"] > late["spend_per_hour"]
    assert early["slo_attainment"] >= late["slo_attainment"] and not math.isnan(late["slo_attainment"])
    assert late["max_replicas"] <= 2  # its max held
    _print_policies(comparison(planned, ask))
    text = capsys.readouterr().out
    assert "recorded (observed)" in text and "tiny-large autoscaled max:2" in text and "cold" in text
