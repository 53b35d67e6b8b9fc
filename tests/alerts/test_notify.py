"""Alerts -> outbox: grouping and its timers, silences, inhibition, and no second page after a
restart; on the real metadata DB (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from alerts import outbox
from alerts.config import AlertsSettings
from alerts.model import Alert, parse_matchers
from alerts.notify import Notifier
from alerts.store import add_silence, expire_silence
from tests.conftest import migrated_sessions

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def sessions(metadata_url: str) -> Iterator[Any]:
    yield from migrated_sessions(metadata_url)


def settings(**route: Any) -> AlertsSettings:
    return AlertsSettings.model_validate(
        {
            "receivers": [{"name": "ops", "type": "webhook", "url": "http://127.0.0.1:9/hook"}],
            "route": {
                "receiver": "ops",
                "group_by": ["alertname"],
                "group_wait": "30s",
                "group_interval": "5m",
                "repeat_interval": "4h",
                **route,
            },
        }
    )


def alert(name: str, replica: str, status: str = "firing", **labels: str) -> Alert:
    return Alert(
        labels={"alertname": name, "replica": replica, "severity": "page", **labels},
        annotations={"summary": f"{name} on {replica}"},
        status=status,
        starts_at=T0,
        ends_at=at(600) if status == "resolved" else None,
    )


def sent_bodies(sessions: Any) -> list[dict]:
    return [row.body for row in reversed(outbox.log(sessions, limit=1000))]


def fingerprints(body: dict) -> list[tuple[str, str]]:
    return sorted((a["labels"]["replica"], a["status"]) for a in body["alerts"])


def test_alerts_firing_together_arrive_in_one_notification_after_group_wait(sessions: Any) -> None:
    n = Notifier(sessions, settings())
    assert n.dispatch([alert("KVCacheSaturated", "r1")], at(0)) == []
    assert n.dispatch([alert("KVCacheSaturated", "r1"), alert("KVCacheSaturated", "r2")], at(15)) == []
    sent = n.dispatch([alert("KVCacheSaturated", "r1"), alert("KVCacheSaturated", "r2")], at(30))
    assert len(sent) == 1 and sent[0].alerts == 2
    (body,) = sent_bodies(sessions)
    assert body["groupLabels"] == {"alertname": "KVCacheSaturated"}
    assert fingerprints(body) == [("r1", "firing"), ("r2", "firing")]


def test_changes_wait_for_group_interval_unchanged_groups_repeat(sessions: Any) -> None:
    n = Notifier(sessions, settings(group_wait="0s", group_interval="5m", repeat_interval="1h"))
    r1, r2 = alert("KVCacheSaturated", "r1"), alert("KVCacheSaturated", "r2")
    n.dispatch([r1], at(0))
    assert n.dispatch([r1, r2], at(60)) == []  # changed, but group_interval has not passed
    assert len(n.dispatch([r1, r2], at(300))) == 1
    assert n.dispatch([r1, r2], at(1200)) == []  # unchanged: quiet until repeat_interval
    assert len(n.dispatch([r1, r2], at(300 + 3600))) == 1
    bodies = sent_bodies(sessions)
    assert [fingerprints(b) for b in bodies] == [
        [("r1", "firing")],
        [("r1", "firing"), ("r2", "firing")],
        [("r1", "firing"), ("r2", "firing")],
    ]


def test_the_resolve_is_notified_once_and_send_resolved_false_drops_it(sessions: Any) -> None:
    n = Notifier(sessions, settings(group_wait="0s", group_interval="1m"))
    n.dispatch([alert("KVCacheSaturated", "r1")], at(0))
    resolved = [alert("KVCacheSaturated", "r1", "resolved")]
    assert len(n.dispatch(resolved, at(60))) == 1
    assert n.dispatch(resolved, at(120)) == []  # the group closed
    last = sent_bodies(sessions)[-1]
    assert last["status"] == "resolved" and last["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    # it fires again later: a new notification, with a new idempotency key (the old one is not reused)
    assert len(n.dispatch([alert("KVCacheSaturated", "r1")], at(900))) == 1
    keys = [row.key for row in outbox.log(sessions)]
    assert len(keys) == len(set(keys)) == 3


def test_silenced_alerts_are_not_notified_until_the_silence_ends(sessions: Any) -> None:
    n = Notifier(sessions, settings(group_wait="0s", group_by=["alertname", "replica"]))
    silence = add_silence(sessions, parse_matchers('replica="r1"'), at(0), at(3600), "sre", "draining r1")
    sent = n.dispatch([alert("KVCacheSaturated", "r1"), alert("KVCacheSaturated", "r2")], at(0))
    assert [s.group_key for s in sent] == ['route0:{alertname="KVCacheSaturated",replica="r2"}']
    kept, why = n.muted([alert("KVCacheSaturated", "r1")], at(10))
    assert kept == [] and "draining r1" in next(iter(why.values()))
    expire_silence(sessions, silence, at(100))
    sent = n.dispatch([alert("KVCacheSaturated", "r1"), alert("KVCacheSaturated", "r2")], at(120))
    assert [s.group_key for s in sent] == ['route0:{alertname="KVCacheSaturated",replica="r1"}']


def test_a_down_replica_mutes_its_own_latency_alerts_not_the_others(sessions: Any) -> None:
    n = Notifier(sessions, settings(group_wait="0s", group_by=["..."]))  # default inhibit rule: ReplicaDown
    alerts = [alert("ReplicaDown", "r1"), alert("KVCacheSaturated", "r1"), alert("KVCacheSaturated", "r2")]
    sent = n.dispatch(alerts, at(0))
    names = sorted(
        (b["alerts"][0]["labels"]["alertname"], b["alerts"][0]["labels"]["replica"]) for b in sent_bodies(sessions)
    )
    assert len(sent) == 2
    assert names == [("KVCacheSaturated", "r2"), ("ReplicaDown", "r1")]


def test_routes_send_pages_and_tickets_to_different_receivers(sessions: Any) -> None:
    cfg = AlertsSettings.model_validate(
        {
            "receivers": [
                {"name": "pager", "type": "pagerduty", "routing_key": "k" * 32},
                {"name": "chat", "type": "slack", "url": "http://127.0.0.1:9/slack"},
            ],
            "routes": [{"receiver": "pager", "matchers": ['severity="page"'], "group_wait": "0s"}],
            "route": {"receiver": "chat", "group_wait": "0s"},
        }
    )
    n = Notifier(sessions, cfg)
    n.dispatch([alert("KVCacheSaturated", "r1"), alert("CostPerTokenUp", "r1", severity="ticket")], at(0))
    rows = {row.receiver: row.body for row in outbox.log(sessions)}
    assert rows["pager"]["event_action"] == "trigger" and "KVCacheSaturated" in rows["pager"]["payload"]["summary"]
    assert "CostPerTokenUp" in rows["chat"]["text"] and "KVCacheSaturated" not in rows["chat"]["text"]


def test_a_restart_does_not_page_again(sessions: Any) -> None:
    firing = [alert("KVCacheSaturated", "r1")]
    Notifier(sessions, settings(group_wait="0s")).dispatch(firing, at(0))
    again = Notifier(sessions, settings(group_wait="0s"))  # a new process, the same metadata DB
    assert again.dispatch(firing, at(15)) == []
    assert again.dispatch(firing, at(600)) == []
    assert len(outbox.log(sessions)) == 1


def test_bad_routing_config_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="route to receiver 'nobody', which is not defined"):
        AlertsSettings.model_validate(
            {"receivers": [{"name": "ops", "type": "webhook", "url": "http://x:1/"}], "route": {"receiver": "nobody"}}
        )
    with pytest.raises(ValueError, match="cannot read matcher"):
        AlertsSettings.model_validate(
            {
                "receivers": [{"name": "ops", "type": "webhook", "url": "http://x:1/"}],
                "routes": [{"receiver": "ops", "matchers": ["severity page"]}],
            }
        )


def test_an_alert_inhibited_after_its_page_is_told_resolved(sessions: Any) -> None:
    n = Notifier(sessions, settings(group_wait="0s", group_interval="1m", group_by=["alertname", "replica"]))
    kv = alert("KVCacheSaturated", "r1")
    n.dispatch([kv], at(0))  # paged
    n.dispatch([kv, alert("ReplicaDown", "r1")], at(30))  # r1 goes down: the KV alert is inhibited
    sent = n.dispatch([kv, alert("ReplicaDown", "r1")], at(90))
    kv_bodies = [b for b in sent_bodies(sessions) if b["groupLabels"]["alertname"] == "KVCacheSaturated"]
    assert [b["status"] for b in kv_bodies] == ["firing", "resolved"], sent
    assert kv_bodies[-1]["alerts"][0]["labels"]["replica"] == "r1"


def test_a_resolve_dropped_while_the_evaluator_was_down_is_still_sent_after_restart(sessions: Any) -> None:
    Notifier(sessions, settings(group_wait="0s", group_interval="5m")).dispatch(
        [alert("KVCacheSaturated", "r1")], at(0)
    )
    # the evaluator stops; when it is back an hour later the resolved instance was long dropped:
    # no alert is current at all, yet the receiver still has an open incident for r1
    again = Notifier(sessions, settings(group_wait="0s", group_interval="5m"))
    assert len(again.dispatch([], at(3600))) == 1
    last = sent_bodies(sessions)[-1]
    assert last["status"] == "resolved" and last["alerts"][0]["labels"]["replica"] == "r1"
    assert again.dispatch([], at(3700)) == []  # told once


def test_without_send_resolved_a_resolve_does_not_repeat_the_firing_ones(sessions: Any) -> None:
    cfg = AlertsSettings.model_validate(
        {
            "receivers": [{"name": "ops", "type": "webhook", "url": "http://127.0.0.1:9/hook", "send_resolved": False}],
            "route": {"receiver": "ops", "group_wait": "0s", "group_interval": "1m"},
        }
    )
    n = Notifier(sessions, cfg)
    r1, r2 = alert("KVCacheSaturated", "r1"), alert("KVCacheSaturated", "r2")
    n.dispatch([r1, r2], at(0))
    assert n.dispatch([alert("KVCacheSaturated", "r1", "resolved"), r2], at(120)) == []
    assert n.dispatch([r2], at(240)) == []
    assert len(outbox.log(sessions)) == 1
