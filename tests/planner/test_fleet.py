"""The fleet a plan replays and its variants, without a store: a variant names what it changes,
keeps the recorded replicas' names, sizes its engines from the KV budget, and refuses what cannot
be planned in one line (a ``PlanError``, a ``ValueError`` and a ``PlannerError``)."""

from __future__ import annotations

import pytest

from fleet.sim.engine import EngineConfig
from planner.errors import PlannerError
from planner.fleet import GPU_SPEED, PlanError, Pool, Variant, gateway_routing, gpu_speed
from planner.plan import Changes, variants

RECORDED = Variant(
    "recorded",
    {
        "tiny-small": Pool("tiny-small", 2, "L4", 1, 16_000, EngineConfig(), ("small-0", "small-1")),
        "tiny-large": Pool("tiny-large", 1, "H100", 2, 64_000, EngineConfig(), ("large-0",)),
    },
)


def test_each_variant_is_named_by_what_it_changes() -> None:
    swept = variants(RECORDED, Changes(replicas={"tiny-small": [3, 4]}, policies=["least_loaded", "affinity"]))
    assert [v.name for v in swept] == [
        "tiny-small=3 least_loaded",
        "tiny-small=3 affinity",
        "tiny-small=4 least_loaded",
        "tiny-small=4 affinity",
    ]
    assert [v.pools["tiny-small"].replicas for v in swept] == [3, 3, 4, 4]
    assert all(v.pools["tiny-large"] == RECORDED.pools["tiny-large"] for v in swept)
    scaled = variants(RECORDED, Changes(scales=[2.0], gpu={"tiny-small": "H100"}))
    assert [v.name for v in scaled] == ["tiny-small on H100 traffic x2"]
    assert scaled[0].describe().startswith("tiny-small 2x H100")


def test_a_faster_gpu_speeds_the_pools_engine_by_the_ratio() -> None:
    (moved,) = variants(RECORDED, Changes(gpu={"tiny-small": "H100"}))
    ratio = gpu_speed("H100", GPU_SPEED) / gpu_speed("L4", GPU_SPEED)
    assert ratio > 1
    assert moved.pools["tiny-small"].engine.speed == pytest.approx(EngineConfig().speed * ratio)


def test_a_variants_replicas_keep_the_recorded_names_and_number_the_new_ones() -> None:
    pool = RECORDED.with_pool("tiny-small", replicas=4).pools["tiny-small"]
    assert pool.replica_names() == ["small-0", "small-1", "tiny-small-plan-0", "tiny-small-plan-1"]
    assert RECORDED.with_pool("tiny-small", replicas=1).pools["tiny-small"].replica_names() == ["small-0"]


def test_the_kv_budget_sizes_the_engine_and_caps_the_longest_request() -> None:
    config = Pool("m", 1, "L4", 1, 1_600, EngineConfig(block_size=16, max_model_len=4096)).engine_config()
    assert config.num_blocks == 1_600 // 16 + 1  # and vLLM's null block
    assert config.max_model_len == 1_600


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (Changes(replicas={"tiny-medium": [2]}), "unknown model 'tiny-medium'"),
        (Changes(policies=["fastest"]), "unknown routing policy 'fastest'"),
        (Changes(gpu={"tiny-small": "TPU"}), "unknown GPU type 'TPU'"),
        (Changes(kv_tokens={"tiny-small": 8}), "holds no block"),
        (Changes(long_prompt_tokens=100), "no model router"),
        (Changes(replicas={"tiny-small": [0]}), "at least one replica"),
    ],
)
def test_what_cannot_be_planned_is_a_plan_error(changes: Changes, says: str) -> None:
    with pytest.raises(PlanError, match=says) as raised:
        variants(RECORDED, changes)
    assert isinstance(raised.value, PlannerError) and isinstance(raised.value, ValueError)


def test_without_a_spec_requests_keep_their_model_and_the_default_prefix() -> None:
    router, prefix_tokens = gateway_routing(None)
    assert router is None and prefix_tokens > 0
