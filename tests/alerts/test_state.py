"""The alert state machine: for, keep_firing_for, resolve, NoData/Error/OK/KeepLast, and a
restart in the middle (states saved to and loaded from the real metadata DB, SQLite and
PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alerts.state import REASON, Active, Instance, Outcome, Timing, step
from alerts.store import load_states, save_states
from tests.conftest import migrated_sessions

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
BASE = {"alertname": "KVCacheSaturated", "severity": "page"}
R1 = {**BASE, "replica": "r1"}
R2 = {**BASE, "replica": "r2"}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def holds(*labels: dict[str, str], value: float = 0.95) -> Outcome:
    return Outcome([Active(dict(lab), {"summary": f"{lab['replica']} full"}, value) for lab in labels])


NOTHING = Outcome([], any_data=True)  # data came back; no sample met the condition


class Rule:
    """Drives ``step`` every 15 s like the evaluator, remembering states and transitions."""

    def __init__(self, timing: Timing, **policy: str) -> None:
        self.timing, self.policy = timing, policy
        self.states: dict[str, Instance] = {}
        self.moves: list[tuple[float, str, str, str]] = []

    def eval(self, t: float, outcome: Outcome) -> None:
        self.states, moves = step(self.timing, self.states, outcome, at(t), base_labels=BASE, **self.policy)
        self.moves += [(t, m.labels.get("replica", m.labels.get(REASON, "")), m.before, m.after) for m in moves]

    def state(self, replica: str) -> str:
        for inst in self.states.values():
            if inst.labels.get("replica") == replica or inst.labels.get(REASON) == replica:
                return inst.state
        return "inactive"


def test_pending_until_for_has_passed_then_firing_then_resolved() -> None:
    rule = Rule(Timing(for_s=60))
    for t in range(0, 60, 15):
        rule.eval(t, holds(R1))
        assert rule.state("r1") == "pending"
    rule.eval(60, holds(R1))
    assert rule.state("r1") == "firing"
    rule.eval(75, NOTHING)
    assert rule.state("r1") == "resolved"
    assert [m[2:] for m in rule.moves] == [("inactive", "pending"), ("pending", "firing"), ("firing", "resolved")]
    assert [m[0] for m in rule.moves] == [0, 60, 75]


def test_a_pending_alert_that_stops_holding_never_fires() -> None:
    rule = Rule(Timing(for_s=60))
    rule.eval(0, holds(R1))
    rule.eval(30, NOTHING)
    rule.eval(45, holds(R1))  # starts over: active_at is 45
    rule.eval(90, holds(R1))
    assert rule.state("r1") == "pending"
    rule.eval(105, holds(R1))
    assert rule.state("r1") == "firing"
    assert ("pending", "inactive") in [m[2:] for m in rule.moves]


def test_for_zero_fires_at_once_and_each_instance_is_its_own() -> None:
    rule = Rule(Timing(for_s=0))
    rule.eval(0, holds(R1))
    rule.eval(15, holds(R1, R2))
    assert rule.state("r1") == "firing" and rule.state("r2") == "firing"
    rule.eval(30, holds(R2))
    assert rule.state("r1") == "resolved" and rule.state("r2") == "firing"


def test_keep_firing_for_bridges_a_short_dip() -> None:
    rule = Rule(Timing(for_s=0, keep_firing_for_s=60))
    rule.eval(0, holds(R1))
    rule.eval(15, NOTHING)
    rule.eval(45, NOTHING)
    assert rule.state("r1") == "firing"
    rule.eval(60, holds(R1))  # back before keep_firing_for ran out: never resolved
    rule.eval(105, NOTHING)
    assert rule.state("r1") == "firing"
    rule.eval(120, NOTHING)  # 60 s after it last held
    assert rule.state("r1") == "resolved"
    assert [m[2:] for m in rule.moves].count(("firing", "resolved")) == 1


def test_resolved_instances_are_kept_a_while_then_dropped_and_can_fire_again() -> None:
    rule = Rule(Timing(for_s=0, resolved_keep_s=300))
    rule.eval(0, holds(R1))
    rule.eval(15, NOTHING)
    rule.eval(300, NOTHING)
    assert rule.state("r1") == "resolved"
    rule.eval(330, NOTHING)
    assert rule.state("r1") == "inactive" and not rule.states
    rule.eval(345, holds(R1))
    assert rule.state("r1") == "firing"


def test_no_data_raises_a_nodata_alert_after_for_and_leaves_real_instances_alone() -> None:
    rule = Rule(Timing(for_s=30), no_data="NoData")
    rule.eval(0, holds(R1))
    rule.eval(30, holds(R1))
    assert rule.state("r1") == "firing"
    for t in (45, 60, 75, 90):  # a NoData alert waits at least a minute, even with a shorter `for`
        rule.eval(t, Outcome([], any_data=False))
        assert rule.state("NoData") == "pending"
    rule.eval(105, Outcome([], any_data=False))
    assert rule.state("NoData") == "firing"
    assert rule.state("r1") == "firing"  # nothing was said about r1: not resolved behind the user's back
    rule.eval(120, NOTHING)  # data again: the NoData alert resolves, and so does r1
    assert rule.state("NoData") == "resolved" and rule.state("r1") == "resolved"


@pytest.mark.parametrize("policy, expect", [("OK", "resolved"), ("KeepLast", "firing")])
def test_no_data_ok_resolves_keep_last_keeps(policy: str, expect: str) -> None:
    rule = Rule(Timing(for_s=0), no_data=policy)
    rule.eval(0, holds(R1))
    rule.eval(15, Outcome([], any_data=False))
    rule.eval(30, Outcome([], any_data=False))
    assert rule.state("r1") == expect
    assert rule.state("NoData") == "inactive"


def test_error_fires_an_error_alert_with_the_message_and_keep_last_ignores_it() -> None:
    rule = Rule(Timing(for_s=0), error="Error")
    rule.eval(0, holds(R1))
    rule.eval(15, Outcome([], error="SQL failed: Code: 60. Unknown table"))
    assert rule.state("Error") == "pending"  # one failed query does not page
    rule.eval(75, Outcome([], error="SQL failed: Code: 60. Unknown table"))
    err = next(i for i in rule.states.values() if i.labels.get(REASON) == "Error")
    assert err.state == "firing" and "Unknown table" in err.annotations["error"]
    assert rule.state("r1") == "firing"

    keep = Rule(Timing(for_s=60), error="KeepLast")
    keep.eval(0, holds(R1))
    keep.eval(30, Outcome([], error="timeout"))
    assert keep.state("r1") == "pending" and keep.state("Error") == "inactive"

    ok = Rule(Timing(for_s=0), error="OK")
    ok.eval(0, holds(R1))
    ok.eval(15, Outcome([], error="timeout"))
    assert ok.state("r1") == "resolved" and ok.state("Error") == "inactive"


@pytest.fixture
def sessions(metadata_url: str) -> Iterator[Any]:
    yield from migrated_sessions(metadata_url)


def test_a_restart_mid_pending_keeps_the_for_clock_and_mid_firing_keeps_firing(sessions: Any) -> None:
    timing = Timing(for_s=60)
    first = Rule(timing)
    first.eval(0, holds(R1))
    first.eval(30, holds(R1))  # pending for 30 s of 60
    first.eval(30, holds(R1))
    save_states(sessions, {"KVCacheSaturated": first.states})

    # the process restarts: a new state machine starts from what was saved
    second = Rule(timing)
    second.states = load_states(sessions)["KVCacheSaturated"]
    assert second.state("r1") == "pending"
    assert next(iter(second.states.values())).active_at == at(0)
    second.eval(60, holds(R1))
    assert second.state("r1") == "firing"  # 60 s after it began, not 60 s after the restart
    save_states(sessions, {"KVCacheSaturated": second.states})

    third = Rule(timing)
    third.states = load_states(sessions)["KVCacheSaturated"]
    third.eval(75, holds(R1))
    assert third.moves == []  # firing stays firing: no second inactive->pending->firing
    third.eval(90, NOTHING)
    assert third.moves == [(90, "r1", "firing", "resolved")]  # and its resolve is not lost
    save_states(sessions, {"KVCacheSaturated": third.states})
    assert load_states(sessions)["KVCacheSaturated"][next(iter(third.states))].state == "resolved"
