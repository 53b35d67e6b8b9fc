"""The evaluator across processes that share the metadata DB: a standby that takes the lease
continues from the saved states, states of removed rules go, and silences must name something."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alerts.config import AlertsSettings
from alerts.evaluator import Evaluator, aligned
from alerts.model import parse_matchers
from alerts.reading import Context
from alerts.rules import Rule, RuleFile
from alerts.store import add_silence, load_states
from migrations import clickhouse_runner
from storage.leases import release
from tests.conftest import migrated_sessions

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def groups(*names: str) -> list:
    rules = [
        {"name": n, "expr": "SELECT 'small-0' AS replica, 7 AS value", "threshold": 5, "for": "30s"} for n in names
    ]
    return RuleFile.model_validate({"groups": [{"name": "queue", "interval": "15s", "rules": rules}]}).groups


@pytest.fixture
def sessions(metadata_url: str) -> Iterator[Any]:
    yield from migrated_sessions(metadata_url)


def test_a_standby_that_takes_over_continues_the_saved_for_clock(ch, sessions: Any) -> None:
    clickhouse_runner.apply(ch)
    settings = AlertsSettings(builtin_rules=False)
    active = Evaluator(groups("QueueTooLong"), Context(ch, sessions), sessions, settings)
    standby = Evaluator(groups("QueueTooLong"), Context(ch, sessions), sessions, settings)  # loads nothing yet
    assert active.holding() and not standby.holding()
    active.evaluate_group(active.groups[0], T0)
    active.evaluate_group(active.groups[0], T0 + timedelta(seconds=15))
    release(sessions.kw["bind"], "alerts", active.holder)  # the active one stops

    assert standby.holding()  # takes over, and with it the states saved at 0 s and 15 s
    report = standby.evaluate_group(standby.groups[0], T0 + timedelta(seconds=30))
    assert [(t.before, t.after) for _, t in report.transitions] == [("pending", "firing")]
    [inst] = load_states(sessions)["QueueTooLong"].values()
    assert inst.active_at == T0 and inst.fired_at == T0 + timedelta(seconds=30)


def test_states_of_a_removed_rule_go_when_an_evaluator_takes_the_lease(ch, sessions: Any) -> None:
    clickhouse_runner.apply(ch)
    settings = AlertsSettings(builtin_rules=False)
    old = Evaluator(groups("QueueTooLong", "Renamed"), Context(ch, sessions), sessions, settings)
    assert old.holding()
    old.evaluate_group(old.groups[0], T0)
    release(sessions.kw["bind"], "alerts", old.holder)
    new = Evaluator(groups("QueueTooLong"), Context(ch, sessions), sessions, settings)
    assert new.holding()
    assert set(load_states(sessions)) == {"QueueTooLong"}


def test_a_rule_whose_expression_cannot_be_parsed_fails_alone(ch, sessions: Any) -> None:
    """A rule built in code without validation (``model_construct``), its expression broken: that
    rule reports its error under its ``error`` policy (an error alert, pending), and the group's
    other rules are evaluated and their states saved."""
    clickhouse_runner.apply(ch)
    [group] = groups("QueueTooLong")
    broken = Rule.model_construct(name="Broken", expr="kv_cache_usage_max(window=", threshold=0.5, labels={})
    group = group.model_copy(update={"rules": [broken, *group.rules]})
    evaluator = Evaluator([group], Context(ch, sessions), sessions, AlertsSettings(builtin_rules=False))
    report = evaluator.evaluate_group(group, T0)
    assert "Broken" in report.errors and report.errors["Broken"]
    assert sorted((name, t.after) for name, t in report.transitions) == [
        ("Broken", "pending"),
        ("QueueTooLong", "pending"),
    ]
    assert set(load_states(sessions)) == {"Broken", "QueueTooLong"}


def test_groups_due_together_share_one_evaluation_time() -> None:
    now = datetime(2026, 11, 2, 12, 0, 7, 400_000, tzinfo=UTC)
    assert aligned(now, 15) == datetime(2026, 11, 2, 12, 0, 0, tzinfo=UTC)
    assert aligned(now + timedelta(seconds=9), 15) == datetime(2026, 11, 2, 12, 0, 15, tzinfo=UTC)
    assert aligned(now, 60) == aligned(now, 15)


@pytest.mark.parametrize("text", ['alertname!=""', 'alertname=~".+"', 'replica=~".*"', 'severity!="page"'])
def test_a_silence_that_would_mute_everything_is_refused(sessions: Any, text: str) -> None:
    with pytest.raises(ValueError, match="match every alert"):
        add_silence(sessions, parse_matchers(text), T0, T0 + timedelta(hours=1), "ana", "maintenance")
