"""Receiver configs and notification bodies: what a webhook, Slack or PagerDuty receiver gets."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from alerts.model import ZERO_TIME, Alert, fingerprint
from alerts.payloads import Notification, bodies
from alerts.receivers import PAGERDUTY_EVENTS_URL, ReceiverConfig

T0 = datetime(2026, 12, 6, 9, 0, 0, 250000, tzinfo=UTC)
DASHBOARD = "http://fleetscope.example:8501"


def alert(replica: str, status: str = "firing", **extra_labels: str) -> Alert:
    labels = {
        "alertname": "KVCacheSaturated",
        "model": "tiny-small",
        "replica": replica,
        "severity": "page",
        **extra_labels,
    }
    return Alert(
        labels=labels,
        annotations={"summary": f"KV cache 97% full on {replica}", "runbook": "docs/runbooks/kv.md"},
        status=status,
        starts_at=T0,
        ends_at=T0 + timedelta(minutes=5) if status == "resolved" else None,
        generator_url=f"{DASHBOARD}/alerts?replica={replica}",
        value=0.97,
    )


def notification(receiver: str, *alerts: Alert, sequence: int = 1, group_key: str | None = None) -> Notification:
    return Notification(
        receiver=receiver,
        group_key=group_key or '{}:{alertname="KVCacheSaturated", model="tiny-small"}',
        group_labels={"alertname": "KVCacheSaturated", "model": "tiny-small"},
        alerts=list(alerts),
        external_url=DASHBOARD,
        sequence=sequence,
    )


WEBHOOK = ReceiverConfig(name="ops-webhook", type="webhook", url="https://hooks.example/alerts")
SLACK = ReceiverConfig(name="slack", type="slack", url="https://hooks.slack.com/services/T/B/X")
PAGERDUTY = ReceiverConfig(name="oncall", type="pagerduty", routing_key="R0UT1NGKEY0123456789abcdefABCDEF")

# --------------------------------------------------------------------------- Alertmanager v4 shape

TOP_LEVEL = {
    "version": str,
    "groupKey": str,
    "truncatedAlerts": int,
    "status": str,
    "receiver": str,
    "groupLabels": dict,
    "commonLabels": dict,
    "commonAnnotations": dict,
    "externalURL": str,
    "alerts": list,
}
PER_ALERT = {
    "status": str,
    "labels": dict,
    "annotations": dict,
    "startsAt": str,
    "endsAt": str,
    "generatorURL": str,
    "fingerprint": str,
}


def check_alertmanager_v4(body: dict) -> None:
    """The webhook body as Alertmanager's v4 template sends it, after a JSON round trip."""
    body = json.loads(json.dumps(body))
    assert set(body) == set(TOP_LEVEL), f"top-level keys {sorted(body)}"
    for key, kind in TOP_LEVEL.items():
        assert type(body[key]) is kind, f"{key} is {type(body[key]).__name__}, not {kind.__name__}"
    assert body["version"] == "4"
    assert body["status"] in ("firing", "resolved")
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in body[key].items()), key
    assert body["alerts"], "an empty notification is not sent"
    for a in body["alerts"]:
        assert set(a) == set(PER_ALERT), f"alert keys {sorted(a)}"
        for key, kind in PER_ALERT.items():
            assert type(a[key]) is kind, f"alert {key} is {type(a[key]).__name__}"
        assert a["status"] in ("firing", "resolved")
        assert datetime.fromisoformat(a["startsAt"]).tzinfo is not None
        assert a["fingerprint"] == fingerprint(a["labels"])
        if a["status"] == "firing":
            assert a["endsAt"] == ZERO_TIME
        else:
            ends = datetime.fromisoformat(a["endsAt"])
            assert ends.year > 1 and ends >= datetime.fromisoformat(a["startsAt"])
    shared = {
        k: v for k, v in body["alerts"][0]["labels"].items() if all(x["labels"].get(k) == v for x in body["alerts"])
    }
    assert body["commonLabels"] == shared
    assert body["status"] == ("firing" if any(a["status"] == "firing" for a in body["alerts"]) else "resolved")


def test_webhook_body_is_an_alertmanager_v4_message() -> None:
    [(key, body)] = bodies(WEBHOOK, notification("ops-webhook", alert("r-1"), alert("r-2", status="resolved")))
    check_alertmanager_v4(body)
    assert body["receiver"] == "ops-webhook" and body["status"] == "firing"
    assert body["groupKey"] == '{}:{alertname="KVCacheSaturated", model="tiny-small"}'
    assert body["externalURL"] == DASHBOARD and body["truncatedAlerts"] == 0
    assert body["commonLabels"] == {"alertname": "KVCacheSaturated", "model": "tiny-small", "severity": "page"}
    assert body["commonAnnotations"] == {"runbook": "docs/runbooks/kv.md"}  # summaries differ
    firing, resolved = body["alerts"]
    assert firing["endsAt"] == "0001-01-01T00:00:00Z"
    assert firing["startsAt"] == "2026-12-06T09:00:00.250Z"
    assert resolved["endsAt"] == "2026-12-06T09:05:00.250Z"
    assert firing["generatorURL"] == f"{DASHBOARD}/alerts?replica=r-1"
    assert len(key) <= 128 and key.isascii()


def test_a_firing_alert_is_not_ended_even_if_it_once_resolved() -> None:
    refired = Alert(
        labels={"alertname": "Flappy"}, annotations={}, status="firing", starts_at=T0, ends_at=T0 - timedelta(minutes=1)
    )  # stale end time from its last resolve
    [(_, body)] = bodies(WEBHOOK, notification("ops-webhook", refired))
    check_alertmanager_v4(body)
    assert body["alerts"][0]["endsAt"] == ZERO_TIME


def test_all_resolved_group_is_resolved() -> None:
    [(_, body)] = bodies(WEBHOOK, notification("ops-webhook", alert("r-1", "resolved"), alert("r-2", "resolved")))
    check_alertmanager_v4(body)
    assert body["status"] == "resolved"


def test_send_resolved_false_drops_resolved_alerts() -> None:
    quiet = WEBHOOK.model_copy(update={"send_resolved": False})
    [(_, body)] = bodies(quiet, notification("ops-webhook", alert("r-1"), alert("r-2", "resolved")))
    check_alertmanager_v4(body)
    assert [a["labels"]["replica"] for a in body["alerts"]] == ["r-1"]
    assert body["commonLabels"]["replica"] == "r-1"  # computed over what is sent
    assert bodies(quiet, notification("ops-webhook", alert("r-2", "resolved"))) == []

    quiet_pd = PAGERDUTY.model_copy(update={"send_resolved": False})
    events = bodies(quiet_pd, notification("oncall", alert("r-1"), alert("r-2", "resolved")))
    assert [b["event_action"] for _, b in events] == ["trigger"]


def test_keys_are_deterministic_bounded_and_distinct() -> None:
    n = notification("ops-webhook", alert("r-1"), group_key="x" * 5000)
    assert bodies(WEBHOOK, n)[0][0] == bodies(WEBHOOK, n)[0][0]
    key = bodies(WEBHOOK, n)[0][0]
    assert len(key) <= 128
    other_sequence = bodies(WEBHOOK, notification("ops-webhook", alert("r-1"), sequence=2, group_key="x" * 5000))
    assert other_sequence[0][0] != key
    other_receiver = WEBHOOK.model_copy(update={"name": "audit"})
    assert bodies(other_receiver, notification("audit", alert("r-1"), group_key="x" * 5000))[0][0] != key
    with pytest.raises(ValueError, match="receiver 'audit'"):
        bodies(WEBHOOK, notification("audit", alert("r-1")))


# --------------------------------------------------------------------------- PagerDuty


def test_pagerduty_trigger_and_resolve_share_one_dedup_key() -> None:
    triggers = bodies(PAGERDUTY, notification("oncall", alert("r-1"), alert("r-2"), sequence=1))
    resolves = bodies(PAGERDUTY, notification("oncall", alert("r-1", "resolved"), sequence=2))
    assert len(triggers) == 2 and len(resolves) == 1
    (k1, t1), (k2, t2) = triggers
    [(k3, r1)] = resolves
    assert len({k1, k2, k3}) == 3 and all(len(k) <= 128 for k in (k1, k2, k3))
    assert t1["dedup_key"] == r1["dedup_key"] == "fleetscope-" + alert("r-1").fingerprint
    assert t2["dedup_key"] != t1["dedup_key"]

    assert t1["routing_key"] == "R0UT1NGKEY0123456789abcdefABCDEF"
    assert t1["event_action"] == "trigger"
    payload = t1["payload"]
    assert payload["summary"] == "KV cache 97% full on r-1"
    assert payload["source"] == "r-1" and payload["severity"] == "critical"
    assert payload["timestamp"] == "2026-12-06T09:00:00.250Z"
    assert payload["custom_details"]["labels"]["replica"] == "r-1"
    assert payload["custom_details"]["annotations"]["runbook"] == "docs/runbooks/kv.md"
    assert payload["custom_details"]["value"] == 0.97
    assert t1["links"] == [{"href": f"{DASHBOARD}/alerts?replica=r-1", "text": "Investigate in fleetscope"}]
    assert r1 == {
        "routing_key": "R0UT1NGKEY0123456789abcdefABCDEF",
        "event_action": "resolve",
        "dedup_key": t1["dedup_key"],
    }
    json.dumps(triggers + resolves, allow_nan=False)


@pytest.mark.parametrize(
    ("severity", "expected"),
    [
        ("page", "critical"),
        ("critical", "critical"),
        ("warning", "warning"),
        ("ticket", "warning"),
        ("info", "info"),
        ("", "error"),
        ("disaster", "error"),
    ],
)
def test_pagerduty_severity_comes_from_the_severity_label(severity: str, expected: str) -> None:
    a = alert("r-1", severity=severity)
    [(_, event)] = bodies(PAGERDUTY, notification("oncall", a))
    assert event["payload"]["severity"] == expected


def test_pagerduty_body_is_valid_json_for_infinite_values() -> None:
    a = Alert(labels={"alertname": "Burn"}, annotations={}, status="firing", starts_at=T0, value=float("inf"))
    [(_, event)] = bodies(PAGERDUTY, notification("oncall", a))
    json.dumps(event, allow_nan=False)
    assert event["payload"]["custom_details"]["value"] == "+Inf"
    assert event["payload"]["summary"].startswith("Burn")
    assert event["links"][0]["href"] == DASHBOARD  # no generator URL: the dashboard


# --------------------------------------------------------------------------- Slack


def test_slack_text_names_the_alert_the_count_and_links_to_the_dashboard() -> None:
    [(_, body)] = bodies(SLACK, notification("slack", alert("r-1"), alert("r-2")))
    assert set(body) == {"text"}
    first, *bullets = body["text"].splitlines()
    assert first == "[FIRING:2] KVCacheSaturated — model=tiny-small"
    assert len(bullets) == 2
    assert "KV cache 97% full on r-1" in bullets[0] and "0.97" in bullets[0]
    assert f"<{DASHBOARD}/alerts?replica=r-1|Investigate>" in bullets[0]


def test_slack_resolved_and_escaping() -> None:
    a = Alert(
        labels={"alertname": "P99<2s", "replica": "r-1"},
        annotations={},
        status="resolved",
        starts_at=T0,
        ends_at=T0 + timedelta(minutes=1),
    )
    n = Notification(
        receiver="slack",
        group_key="g",
        group_labels={"alertname": "P99<2s"},
        alerts=[a],
        external_url=DASHBOARD,
        sequence=3,
    )
    [(_, body)] = bodies(SLACK, n)
    first, bullet = body["text"].splitlines()
    assert first == "[RESOLVED:1] P99&lt;2s"
    assert "replica=r-1" in bullet and f"<{DASHBOARD}|Investigate>" in bullet


# --------------------------------------------------------------------------- ReceiverConfig


def test_pagerduty_defaults_its_url_and_needs_a_routing_key() -> None:
    assert PAGERDUTY.url == PAGERDUTY_EVENTS_URL
    assert "R0UT1NG" not in repr(PAGERDUTY)  # a secret
    with pytest.raises(ValidationError, match="routing_key is required for a pagerduty receiver"):
        ReceiverConfig(name="oncall", type="pagerduty")
    with pytest.raises(ValidationError, match="routing_key is only for pagerduty receivers"):
        ReceiverConfig(name="ops", type="webhook", url="https://x.example", routing_key="abc")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "ftp://hooks.example/x"}, "url\n.*must be an http:// or https:// URL"),
        ({"url": "hooks.example/x"}, "must be an http:// or https:// URL"),
        ({"url": "https:///x"}, "has no host"),
        ({"url": ""}, "url\n.*is required for a webhook receiver"),
        ({"name": " "}, "name\n.*must not be empty"),
        ({"headers": {"Idempotency-Key": "x"}}, "cannot be overridden"),
        ({"headers": {"X-Bad Name": "x"}}, "not a valid HTTP header name"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"colour": "red"}, "colour\n.*Extra inputs are not permitted"),
        ({"type": "email"}, "type\n.*'webhook', 'slack' or 'pagerduty'"),
    ],
)
def test_receiver_config_errors_name_the_key(fields: dict, message: str) -> None:
    data = {"name": "ops", "type": "webhook", "url": "https://hooks.example/x", **fields}
    with pytest.raises(ValidationError, match=message):
        ReceiverConfig(**data)


def test_receiver_config_keeps_custom_headers_and_secrets() -> None:
    r = ReceiverConfig(
        name="ops",
        type="webhook",
        url="http://127.0.0.1:9/x",
        headers={"Authorization": "Bearer t"},
        hmac_secret="s3cret",
        send_resolved=False,
    )
    assert r.headers == {"Authorization": "Bearer t"}
    assert r.hmac_secret is not None and r.hmac_secret.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(r) and r.max_age_h == 24 and r.timeout_s == 10
