"""The built-in scaling rules (PoolAtMax, ScaleFlapping, ScaleOutSlow), SpendPerHourJump and
ReplicaDown on the hand-written autoscaled fleet of tests/analytics/elasticity_data.py, evaluated
minute by minute (every 15 s for ReplicaDown) as the evaluator runs them. The first 45 minutes are
the calm part: one scale-out served in 110 s of its signal, one scale-in: no scaling rule fires.
And the acceptance line on the simulator: on the played ``router-defeat`` scenario a cost alert
fires within 10 minutes of the tenant's shift."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alerts.config import AlertsSettings, rule_groups
from alerts.evaluator import Evaluator
from alerts.reading import Context
from storage.catalog import set_gpu_price
from tests.analytics.elasticity_data import PRICES, at, autoscaled_fleet
from tests.analytics.scenario_data import play as play_scenario
from tests.conftest import migrated_sessions


@pytest.fixture
def sessions(sqlite_url: str) -> Any:
    found = next(migrated_sessions(sqlite_url))
    for gpu, price in PRICES.items():
        set_gpu_price(found, gpu, price)
    return found


Times = dict[tuple[str, str], datetime]


def play(
    client: Any, sessions: Any, groups: tuple[str, ...], until: float, every_s: float = 60, since: float = 0
) -> tuple[Times, Times, Evaluator]:
    """Evaluate the named groups of the built-in pack from minute ``since`` to ``until``: the
    first firing and resolution time of each (rule, label) and the evaluator."""
    settings = AlertsSettings.model_validate({"external_url": "http://dash.example:8501"})
    picked = [g for g in rule_groups(settings) if g.name in groups]
    evaluator = Evaluator(picked, Context(client, sessions), sessions, settings)
    fired: Times = {}
    resolved: Times = {}
    t = at(since)
    while t <= at(until):
        for g in picked:
            for name, tr in evaluator.evaluate_group(g, t).transitions:
                key = (name, tr.labels.get("model") or tr.labels.get("replica", ""))
                if tr.after == "firing":
                    fired.setdefault(key, t)
                if tr.after == "resolved":
                    resolved.setdefault(key, t)
        t += timedelta(seconds=every_s)
    return fired, resolved, evaluator


def test_the_scaling_rules_fire_on_a_slow_scale_out_a_pool_at_max_and_flapping_and_not_before(
    ch: Any, tmp_path: Path, sessions: Any
) -> None:
    autoscaled_fleet(ch, tmp_path / "spool")
    fired, resolved, evaluator = play(ch, sessions, ("scaling",), until=66)
    pool = "tiny-large"
    assert {name for name, _ in fired} == {"ScaleOutSlow", "PoolAtMax", "ScaleFlapping"}
    assert all(when >= at(50) for when in fired.values())  # the calm first 45 minutes: nothing
    # d2: the signal crossed at 49:30 and large-2 never served: over 180 s at 52:30, seen at 53:00;
    # the scale-in at 62:00 ends the wait (read at 63:00)
    assert fired[("ScaleOutSlow", pool)] == at(53) and resolved[("ScaleOutSlow", pool)] == at(63)
    # held at max at 55:00: 1 from the 56:00 evaluation, for 5m -> 61:00; the scale-in resolves it
    assert fired[("PoolAtMax", pool)] == at(61) and resolved[("PoolAtMax", pool)] == at(63)
    # reversals at 39:00 (in), 50:00 (out), 62:00 (in): three in 30 minutes from 63:00
    assert fired[("ScaleFlapping", pool)] == at(63)
    alert = next(a for a in evaluator.current_alerts() if a.labels["alertname"] == "ScaleFlapping")
    assert alert.annotations["summary"] == "pool tiny-large changed scaling direction 3 times in 30 minutes"


def test_spend_per_hour_jump_tickets_when_the_pool_scales_out_and_only_that_pool(
    ch: Any, tmp_path: Path, sessions: Any
) -> None:
    autoscaled_fleet(ch, tmp_path / "spool")
    fired, _, evaluator = play(ch, sessions, ("cost",), until=26)
    # large-1 up from 20:00 doubles tiny-large's $4.00/h: the last 5 minutes pass +25 % at about
    # 21:15, seen at 22:00, for 1m -> firing at 23:00; the small pool's spend did not move
    assert fired == {("SpendPerHourJump", "tiny-large"): at(23)}
    alert = next(a for a in evaluator.current_alerts() if a.labels["alertname"] == "SpendPerHourJump")
    assert alert.annotations["summary"].startswith("spend per hour of tiny-large is ")
    assert "/h -> $" in alert.annotations["summary"] and "model=tiny-large" in alert.generator_url


@pytest.mark.parametrize("removed", [True, False])
def test_replica_down_pages_for_a_replica_that_fell_not_for_one_a_scale_in_removed(
    ch: Any, tmp_path: Path, sessions: Any, removed: bool
) -> None:
    """large-1's scrapes failed from 40:15 to 42:00 after its engine stopped; with its ``removed``
    event (40:20) it is retired, without it is a replica that went away: down. ghost failed on its
    own: down."""
    autoscaled_fleet(ch, tmp_path / "spool", removed=removed)
    fired, _, _ = play(ch, sessions, ("availability",), until=43, every_s=15, since=39)
    down = {replica for name, replica in fired if name == "ReplicaDown"}
    assert down == ({"ghost"} if removed else {"ghost", "large-1"})


def test_a_cost_alert_tickets_within_ten_minutes_of_the_router_defeat_shift(chdb_dir: Path, sqlite_url: str) -> None:
    """``router-defeat`` played on fleet-autoscale.yaml (virtual time, seed 1): acme's prompts cross
    the router's rule at +12 min, tiny-large fills and the autoscaler adds a replica (4 GPUs). The
    spend per hour of the pool doubles: SpendPerHourJump tickets for tiny-large within 10 minutes
    of the shift (seeds 0-3 measured 3-5 minutes), and no cost rule fires before the shift."""
    run = play_scenario(chdb_dir, "router-defeat", spec="fleet-autoscale.yaml")
    assert run.report.scale_events > 0  # the autoscaler acted (its events were stored)
    sessions = next(migrated_sessions(sqlite_url))  # the seeded GPU price: cpu-demo at $0.10 an hour
    settings = AlertsSettings.model_validate({"external_url": "http://dash.example:8501"})
    groups = [g for g in rule_groups(settings) if g.name == "cost"]
    evaluator = Evaluator(groups, Context(run.client, sessions), sessions, settings)
    shift = run.phase("acme-long-prompts")
    fired: Times = {}
    t = run.start
    while t <= shift + timedelta(minutes=10):
        for g in groups:
            for name, tr in evaluator.evaluate_group(g, t).transitions:
                if tr.after == "firing":
                    fired.setdefault((name, tr.labels.get("model", "")), t)
        t += timedelta(minutes=1)
    assert ("SpendPerHourJump", "tiny-large") in fired, fired
    assert shift < fired[("SpendPerHourJump", "tiny-large")] <= shift + timedelta(minutes=10)
    assert all(when > shift for when in fired.values())  # calm before the shift
    alert = next(a for a in evaluator.current_alerts() if a.labels["alertname"] == "SpendPerHourJump")
    assert "/investigate?" in alert.generator_url and "model=tiny-large" in alert.generator_url


def test_the_scaling_rules_stay_quiet_on_a_store_without_scale_events(ch: Any, tmp_path: Path, sessions: Any) -> None:
    """A store not migrated to 0013 yet: no samples (no Error alerts every cycle), nothing fires."""
    autoscaled_fleet(ch, tmp_path / "spool")
    ch.command("DROP TABLE scale_events")
    fired, _, evaluator = play(ch, sessions, ("scaling",), until=66, since=50)
    assert fired == {} and evaluator.current_alerts() == []
