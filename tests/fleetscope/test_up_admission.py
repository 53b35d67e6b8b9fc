"""`fleetscope up` plays a scenario with the gateway admission it asks for: the overload scenario's
`queue_time: true` turns the spec's gateway admission by queue time on (a copy of the spec), a
scenario that says nothing leaves the spec as it is, and the copy keeps the models where they are."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleet.spec import load_spec
from fleet.traffic import load_scenario
from fleetscope.up_scaling import with_queue_time

ROOT = Path(__file__).resolve().parents[2]


def test_the_overload_scenario_turns_queue_time_admission_on(tmp_path: Path) -> None:
    spec = ROOT / "fleet.yaml"
    assert load_spec(spec).gateway is not None and not load_spec(spec).gateway.queue_time.enabled  # off by default
    wanted = load_scenario("overload").queue_time
    assert wanted is True
    copy = with_queue_time(spec, tmp_path / "fleet-admission.yaml", wanted)
    assert copy != spec
    played = load_spec(copy)
    assert played.gateway is not None and played.gateway.queue_time.enabled
    assert played.models["tiny-small"].path == (ROOT / "data" / "models" / "tiny-small").resolve()
    raw = yaml.safe_load(copy.read_text())
    assert raw["replicas"] == yaml.safe_load(spec.read_text())["replicas"]  # nothing else changed


def test_a_scenario_that_says_nothing_leaves_the_spec_alone(tmp_path: Path) -> None:
    spec = ROOT / "fleet.yaml"
    assert load_scenario("long-context-rollout").queue_time is None
    assert with_queue_time(spec, tmp_path / "x.yaml", None) == spec
    assert with_queue_time(spec, tmp_path / "x.yaml", False) == spec  # already off: no copy
    assert not (tmp_path / "x.yaml").exists()
