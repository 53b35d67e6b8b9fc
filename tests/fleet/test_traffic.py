"""Traffic mix and scenario timelines: sampled lengths follow the configured distributions."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from common.yamlfile import YamlConfigError
from fleet.gateway.routing import Router
from fleet.model import successor_chain
from fleet.sim.engine import ACCEPT_PREDICTABLE, ACCEPT_UNPREDICTABLE, prompt_acceptance
from fleet.spec import load_spec
from fleet.traffic import (
    TOKEN_ID_RANGE,
    LengthDist,
    edit_prompt,
    load_scenario,
    next_gap,
    plan_request,
    rate_at,
    system_prompt,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["steady", "long-context-rollout", "tenant-shift", "replica-crash", "overload"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_scenarios_load(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name and scenario.duration_s > 0


def test_lognormal_lengths_follow_median_and_sigma() -> None:
    dist = LengthDist(median=300, sigma=0.6, min=1, max=100_000)
    rng = random.Random(1)
    samples = [dist.sample(rng) for _ in range(20_000)]
    assert statistics.median(samples) == pytest.approx(300, rel=0.03)
    assert statistics.pstdev([math.log(s) for s in samples]) == pytest.approx(0.6, rel=0.03)


def test_lengths_are_clipped_to_bounds() -> None:
    dist = LengthDist(median=1000, sigma=2.0, min=50, max=1500)
    rng = random.Random(2)
    samples = [dist.sample(rng) for _ in range(5000)]
    assert min(samples) == 50 and max(samples) == 1500


def test_plan_follows_the_mix_shares() -> None:
    scenario = load_scenario("steady")
    mix = scenario.mix
    rng = random.Random(3)
    plans = [plan_request(mix, rng) for _ in range(20_000)]
    share = lambda pred: sum(1 for p in plans if pred(p)) / len(plans)  # noqa: E731
    assert share(lambda p: p.long_context) == pytest.approx(mix.long_context_share, abs=0.01)
    assert share(lambda p: p.stream) == pytest.approx(mix.stream_share, abs=0.015)
    assert share(lambda p: p.model == "tiny-small") == pytest.approx(0.75, abs=0.015)
    assert share(lambda p: p.tenant == "acme") == pytest.approx(0.5, abs=0.015)
    short = [len(p.prompt) for p in plans if not p.long_context and not p.shared_prefix]
    assert statistics.median(short) == pytest.approx(mix.prompt_tokens.median, rel=0.05)
    assert share(lambda p: p.shared_prefix) == pytest.approx(mix.shared_prefix_share, abs=0.015)
    shared = [p for p in plans if p.shared_prefix]
    # shared-prefix requests start with one of the fixed system prompts (what the prefix cache sees)
    prompts = {tuple(system_prompt(i, mix.shared_prefix_tokens)) for i in range(mix.system_prompts)}
    assert shared and all(tuple(p.prompt[: mix.shared_prefix_tokens]) in prompts for p in shared)
    assert all(3 <= t <= 999 for p in plans[:500] for t in p.prompt)


def test_requests_fit_the_models_max_length() -> None:
    mix = load_scenario("tenant-shift").mixes()[-1][2]
    rng = random.Random(4)
    for _ in range(2000):
        plan = plan_request(mix, rng, {"tiny-small": 2048, "tiny-large": 8192})
        limit = 2048 if plan.model == "tiny-small" else 8192
        assert len(plan.prompt) + plan.max_tokens <= limit


def test_long_context_rollout_timeline() -> None:
    scenario = load_scenario("long-context-rollout")
    assert scenario.mix_at(0)[1].long_context_share == 0.05
    assert scenario.mix_at(179.9)[0] == "start"
    phase, mix = scenario.mix_at(180)
    assert (phase, mix.long_context_share) == ("rollout", 0.35)
    assert mix.rate == scenario.mix.rate  # a phase changes only what it sets
    assert scenario.mix_at(600)[1].long_context_share == 0.05


def test_tenant_shift_sends_the_new_tenant_to_the_large_model() -> None:
    scenario = load_scenario("tenant-shift")
    _phase, mix = scenario.mix_at(200)
    rng = random.Random(5)
    plans = [plan_request(mix, rng) for _ in range(4000)]
    bigcorp = [p for p in plans if p.tenant == "bigcorp"]
    assert len(bigcorp) / len(plans) == pytest.approx(0.4, abs=0.03)
    assert {p.model for p in bigcorp} == {"auto"}  # the gateway's model router decides
    router = Router(load_spec(ROOT / "fleet.yaml").gateway, [])
    assert {router.choose_model(p.model, p.tenant, len(p.prompt), p.max_tokens)[:2] for p in bigcorp} == {
        ("tiny-large", "model-router:large")
    }
    assert statistics.median(len(p.prompt) for p in bigcorp) > 2048
    assert not any(p.tenant == "bigcorp" for p in (plan_request(scenario.mix_at(10)[1], rng) for _ in range(500)))


def test_acceptance_collapse_prompts_stop_being_predictable() -> None:
    """On real engines acceptance comes from the prompts: the predictable share of the requests
    (draft_acceptance) gets edit prompts whose greedy continuation on the repeat model is already
    in the prompt, where an n-gram drafter finds it; the rest gets random token ids."""
    scenario = load_scenario("acceptance-collapse")
    rng = random.Random(7)
    for at, share in ((0, 1.0), (300, 0.1)):
        mix = scenario.mix_at(at)[1]
        plans = [plan_request(mix, rng, {"tiny-repeat": 2048}) for _ in range(3000)]
        assert sum(p.predictable for p in plans) / len(plans) == pytest.approx(share, abs=0.02)
        # the simulator reads the same off the prompt: high for the edits, low for the others
        assert {prompt_acceptance(p.prompt) for p in plans if p.predictable} == {ACCEPT_PREDICTABLE}
        others = [prompt_acceptance(p.prompt) for p in plans if not p.predictable]  # a random prompt may,
        assert sum(a == ACCEPT_UNPREDICTABLE for a in others) >= 0.99 * len(others)  # rarely, hold the pair too
        for plan in plans[:300]:
            assert all(TOKEN_ID_RANGE[0] <= t <= TOKEN_ID_RANGE[1] for t in plan.prompt)
            body = plan.prompt[mix.shared_prefix_tokens if plan.shared_prefix else 0 :]
            if plan.predictable:  # the document, then its first 4 tokens: the rewrite goes on
                document = body[:-4]
                assert body[-4:] == document[:4] and document == [body[0]] + successor_chain(body[0], len(body) - 5)
                assert successor_chain(plan.prompt[-1], len(document) - 4) == document[4:]
    assert all(len(edit_prompt(7, n)) == n for n in range(0, 1300))


def test_mixes_without_draft_acceptance_keep_random_prompts() -> None:
    mix = load_scenario("steady").mix
    assert mix.draft_acceptance is None
    plans = [plan_request(mix, random.Random(8)) for _ in range(500)]
    assert not any(p.predictable for p in plans)
    assert {prompt_acceptance(p.prompt) for p in plans} == {ACCEPT_UNPREDICTABLE}


def test_poisson_arrivals_match_the_rate_and_bursts() -> None:
    scenario = load_scenario("long-context-rollout")
    mix = scenario.mix
    rng = random.Random(6)
    gaps = [next_gap(mix, 50.0, rng) for _ in range(20_000)]  # outside a burst
    assert 1 / statistics.mean(gaps) == pytest.approx(mix.rate, rel=0.03)
    assert mix.burst is not None
    # the first burst a minute in (not with the first requests), then every minute, for 8 s
    assert [rate_at(mix, t) / mix.rate for t in (0.0, 5.0, 59.9, 60.0, 67.9, 68.0, 119.0, 121.0)] == pytest.approx(
        [1, 1, 1, 2.5, 2.5, 1, 1, 2.5]
    )


def test_bad_phase_names_the_phase(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    text = (Path(__file__).resolve().parents[2] / "fleet" / "scenarios" / "long-context-rollout.yaml").read_text()
    path.write_text(text.replace("long_context_share: 0.35", "long_context_share: 3.5"))
    with pytest.raises(YamlConfigError, match=r"phase 'rollout'.*long_context_share"):
        load_scenario(str(path))


def test_unknown_scenario_lists_the_shipped_ones() -> None:
    with pytest.raises(
        YamlConfigError,
        match="shipped ones are acceptance-collapse, adapter-thrash, engine-stall, long-context-rollout, max-tokens-release, overload, refusing-adapter, "
        "replica-crash, "
        "router-defeat, router-shift, scale-ramp, steady, tenant-shift",
    ):
        load_scenario("black-friday")
