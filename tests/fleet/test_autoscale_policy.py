"""The autoscaler's decisions on hand-made signal series: thresholds held for their time, cooldowns,
min/max (and the hold at max, said once), a cold start that blocks a pile-up, scale-in only after
a quiet spell, the flapping guard; and the spec's checks of an ``autoscale`` section."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from common.yamlfile import YamlConfigError
from fleet.autoscale.events import ScaleEvent, from_decision
from fleet.autoscale.policy import Decision, PoolState, ScalePolicy, decide
from fleet.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
POLICY = ScalePolicy(
    min_replicas=1,
    max_replicas=3,
    out={"kv_cache_usage": 0.8, "requests_waiting": 2.0},
    **{"in": {"kv_cache_usage": 0.3}},
    out_for_s=15,
    in_for_s=60,
    out_cooldown_s=30,
    in_cooldown_s=60,
    flap_window_s=600,
    max_reversals=2,
)


def run(
    series: list[tuple[float, dict[str, float]]],
    policy: ScalePolicy = POLICY,
    ready: int = 1,
    cold_start_s: float = 20.0,
) -> tuple[list[tuple[float, Decision]], PoolState]:
    """Feed (time, signals) in order; a scale-out's replica is ready ``cold_start_s`` later, a
    scale-in takes one replica away at once. Returns every decision with its time."""
    state = PoolState(ready=ready)
    starting: list[float] = []
    out = []
    for now, signals in series:
        for at in [t for t in starting if t <= now]:
            starting.remove(at)
            state.became_ready(at)
        decision = decide("tiny-large", policy, state, signals, now)
        if decision is None:
            continue
        out.append((now, decision))
        state.record(decision, now)
        if decision.kind == "scale_out":
            for _ in range(decision.to_replicas - decision.from_replicas):
                state.starting += 1
                starting.append(now + cold_start_s)
        elif decision.kind == "scale_in":
            state.ready -= decision.from_replicas - decision.to_replicas
    return out, state


def every(step: float, start: float, end: float, signals: dict[str, float]) -> list[tuple[float, dict[str, float]]]:
    n = int((end - start) / step)
    return [(start + i * step, dict(signals)) for i in range(n)]


HOT = {"kv_cache_usage": 0.9, "requests_waiting": 0.5}
WARM = {"kv_cache_usage": 0.5, "requests_waiting": 0.0}
COLD = {"kv_cache_usage": 0.1, "requests_waiting": 0.0}


def test_a_signal_must_hold_for_out_for_s_before_a_scale_out() -> None:
    blip = every(5, 0, 10, HOT) + every(5, 10, 100, WARM)  # 10 s over: not long enough
    assert run(blip)[0] == []
    decisions, state = run(every(5, 0, 30, HOT))
    (at, first), *_ = decisions
    assert at == 15 and first.kind == "scale_out" and (first.from_replicas, first.to_replicas) == (1, 2)
    assert first.signal == "kv_cache_usage" and first.value == 0.9 and first.threshold == 0.8
    assert first.crossed_at == 0 and "kv_cache_usage 0.9 > 0.8 for 15s" in first.reason


def test_the_signal_furthest_over_its_threshold_names_the_decision() -> None:
    decisions, _ = run(every(5, 0, 20, {"kv_cache_usage": 0.85, "requests_waiting": 6.0}))
    assert decisions[0][1].signal == "requests_waiting"  # 3x its threshold beats 1.06x


def test_no_pile_up_during_a_cold_start_then_cooldown_then_max() -> None:
    decisions, state = run(every(5, 0, 300, HOT), cold_start_s=40)
    outs = [(t, d) for t, d in decisions if d.kind == "scale_out"]
    # 15 s: 1 -> 2; the new replica starts until 55 s; the next out waits for it (not the 30 s cooldown)
    assert [(t, d.from_replicas, d.to_replicas) for t, d in outs] == [(15, 1, 2), (55, 2, 3)]
    holds = [(t, d) for t, d in decisions if d.kind == "held_at_max"]
    assert len(holds) == 1 and "at max_replicas 3" in holds[0][1].reason  # said once per episode
    assert state.ready == 3


def test_cooldown_between_scale_outs() -> None:
    decisions, _ = run(every(5, 0, 120, HOT), cold_start_s=5)
    outs = [t for t, d in decisions if d.kind == "scale_out"]
    assert outs[0] == 15 and outs[1] - outs[0] >= 30  # ready at 20 s, but the cooldown holds to 45 s


def test_scale_in_after_a_quiet_spell_never_below_min() -> None:
    series = every(5, 0, 30, HOT) + every(5, 30, 600, COLD)
    decisions, state = run(series, cold_start_s=10)
    kinds = [(t, d.kind, d.to_replicas) for t, d in decisions]
    assert kinds[0] == (15, "scale_out", 2)
    ins = [(t, to) for t, kind, to in kinds if kind == "scale_in"]
    # cold from 30 s: 60 s below the in threshold (90 s) and 60 s after the last scale event (75 s)
    assert ins == [(90, 1)] and state.ready == 1  # not below min_replicas
    assert "kv_cache_usage 0.1 < 0.3 for 60s" in decisions[-1][1].reason


def test_a_replica_that_just_became_ready_is_not_scaled_in_at_once() -> None:
    """The load is gone before the cold start ends: the new replica still gets in_cooldown_s to serve."""
    series = every(5, 0, 20, HOT) + every(5, 20, 600, COLD)
    decisions, _ = run(series, cold_start_s=120)  # decided at 15 s, ready at 135 s
    (at, scale_in), *_ = [(t, d) for t, d in decisions if d.kind == "scale_in"]
    assert at >= 135 + POLICY.in_cooldown_s and scale_in.to_replicas == 1


def test_warm_is_neither_out_nor_in() -> None:
    decisions, state = run(every(5, 0, 900, WARM), ready=2)
    assert decisions == [] and state.ready == 2


def test_below_min_or_above_max_is_corrected_first() -> None:
    assert run([(0, COLD)], ready=0)[0][0][1].kind == "scale_out"
    (_, decision), *_ = run([(0, HOT)], ready=5)[0]
    assert decision.kind == "scale_in" and decision.to_replicas == 3


def test_the_flapping_guard_keeps_the_pool_larger() -> None:
    """Load that comes and goes every few minutes: out, in, out ... the second scale-in would be
    the third change of direction within the window: refused, said once per quiet spell."""
    series = []
    for cycle in range(3):  # within one flap window (600 s)
        base = cycle * 200
        series += every(5, base, base + 40, HOT) + every(5, base + 40, base + 200, COLD)
    decisions, _ = run(series, cold_start_s=5)
    kinds = [d.kind for _, d in decisions]
    assert kinds[:3] == ["scale_out", "scale_in", "scale_out"]
    assert kinds == ["scale_out", "scale_in", "scale_out", "flap_guard", "scale_out", "held_at_max", "flap_guard"]
    assert all(not (a == b == "flap_guard") for a, b in zip(kinds, kinds[1:], strict=False))  # once per episode
    guard = next(d for _, d in decisions if d.kind == "flap_guard")
    assert "holding" in guard.reason and guard.from_replicas == guard.to_replicas


def test_a_decision_becomes_an_event_and_its_steps_share_its_id() -> None:
    (_, decision), *_ = run(every(5, 0, 20, HOT))[0]
    event = from_decision(decision, 1_795_000_015.0, replica="large-1", source="sim")
    ready = event.step("ready", 1_795_000_055.0)
    assert ready.decision_id == event.decision_id and ready.replica == "large-1" and ready.kind == "ready"
    row = ready.row()
    assert row["pool"] == "tiny-large" and row["from_replicas"] == 1 and row["to_replicas"] == 2
    assert row["crossed_at"] == 0 and set(row) >= {"ts", "signal", "value", "threshold", "detail", "source"}
    with pytest.raises(ValueError, match="not one of"):
        ScaleEvent(0.0, "tiny-large", "exploded", "x")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas (3) is above max_replicas (2)"),
        ({"in": {"kv_cache_usage": 0.9}}, "in.kv_cache_usage (0.9) must be below out.kv_cache_usage"),
        ({"out": {"gpu_temperature": 80}}, "unknown signal 'gpu_temperature'"),
    ],
)
def test_a_bad_policy_is_refused_with_the_reason(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ScalePolicy(**change)


def spec_with(tmp_path: Path, autoscale: dict, **extra: object) -> Path:
    spec = yaml.safe_load((ROOT / "fleet.yaml").read_text())
    spec["autoscale"] = autoscale
    spec.update(extra)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_spec_checks_the_autoscale_section(tmp_path: Path) -> None:
    good = load_spec(spec_with(tmp_path, {"pools": {"tiny-large": {"max_replicas": 3}}}), ROOT)
    assert good.autoscale is not None and good.autoscale.pools["tiny-large"].max_replicas == 3
    assert good.pool_template("tiny-large").name == "large-0"
    for autoscale, message in [
        ({"pools": {"tiny-huge": {}}}, "names model 'tiny-huge'"),
        ({"pools": {"tiny-small": {"max_replicas": 1}}}, "starts 2 replica(s), outside min_replicas 1"),
        ({"pools": {"tiny-large": {}}, "first_port": 8099}, "include 8100, taken by the gateway"),
    ]:
        with pytest.raises(YamlConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_spec(spec_with(tmp_path, autoscale), ROOT)
    litellm = yaml.safe_load((ROOT / "fleet.yaml").read_text())["gateway"] | {"kind": "litellm"}
    with pytest.raises(YamlConfigError, match="needs fleetscope's own gateway"):
        load_spec(spec_with(tmp_path, {"pools": {"tiny-large": {}}}, gateway=litellm), ROOT)
