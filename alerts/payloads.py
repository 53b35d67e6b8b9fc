"""Payloads: one notification of a group of alerts -> the JSON bodies a receiver gets.

In:  a ``ReceiverConfig`` and a ``Notification`` (the alerts of one group, for one receiver,
     numbered by the group's notification counter ``sequence``).
Out: ``bodies`` -> ``[(idempotency key, JSON body), ...]``, one outbox row each:
     webhook    one Alertmanager v4 body (``version "4"``, ``groupKey``, ``alerts[...]`` ...)
     slack      one ``{"text": ...}`` incoming-webhook message
     pagerduty  one Events API v2 event per alert (trigger, or resolve when it resolved)
     With ``send_resolved`` off, resolved alerts are left out, and an empty list comes back
     when nothing is left to say.

Keys are deterministic, so enqueueing the same notification twice (a retry after a crash)
lands one row: a hash of (receiver, group key), the sequence, and for PagerDuty the alert's
fingerprint and status. They are ASCII and at most 128 characters (``alert_outbox.key``).
PagerDuty's ``dedup_key`` is ``fleetscope-<fingerprint>``: the same for an alert's trigger and
its resolve, so PagerDuty opens and closes one incident per alert.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from alerts.model import ZERO_TIME, Alert, iso
from alerts.receivers import ReceiverConfig

__all__ = ["Notification", "bodies", "common", "dedup_key", "pagerduty_severity"]

_PD_SUMMARY_MAX = 1024  # PagerDuty truncates longer summaries
_SEVERITY = {"page": "critical", "critical": "critical", "warning": "warning", "ticket": "warning", "info": "info"}
_SOURCE_LABELS = ("instance", "replica", "model", "job")


@dataclass(frozen=True)
class Notification:
    """What one receiver is told about one group of alerts at one moment."""

    receiver: str
    group_key: str
    group_labels: dict[str, str]
    alerts: list[Alert]
    external_url: str  # fleetscope's dashboard, for links ("" when not set)
    sequence: int  # the group's notification counter (alert_groups.sequence)


def bodies(receiver: ReceiverConfig, n: Notification) -> list[tuple[str, dict[str, Any]]]:
    """The outbox rows for ``n``: ``[(idempotency key, body), ...]`` (empty: nothing to send)."""
    if n.receiver != receiver.name:
        raise ValueError(f"notification for receiver {n.receiver!r} shaped for receiver {receiver.name!r}")
    alerts = [a for a in n.alerts if receiver.send_resolved or a.status == "firing"]
    if not alerts:
        return []
    base = _key(receiver.name, n.group_key, n.sequence)
    if receiver.type == "webhook":
        return [(base, _alertmanager_v4(receiver, n, alerts))]
    if receiver.type == "slack":
        return [(base, {"text": _slack_text(n, alerts)})]
    return [(f"{base}-{a.fingerprint}-{a.status}", _pagerduty_event(receiver, n, a)) for a in alerts]


def common(maps: list[dict[str, str]]) -> dict[str, str]:
    """The pairs present, with the same value, in every map (Alertmanager's commonLabels)."""
    if not maps:
        return {}
    first, rest = maps[0], maps[1:]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in rest)}


def dedup_key(alert: Alert) -> str:
    """PagerDuty's incident key for ``alert``: stable across its trigger and resolve."""
    return f"fleetscope-{alert.fingerprint}"


def pagerduty_severity(labels: dict[str, str]) -> str:
    """The ``severity`` label mapped to PagerDuty's critical/error/warning/info."""
    return _SEVERITY.get(labels.get("severity", "").lower(), "error")


# --------------------------------------------------------------------------- shapes


def _alertmanager_v4(receiver: ReceiverConfig, n: Notification, alerts: list[Alert]) -> dict[str, Any]:
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": 0,
        "status": _status(alerts),
        "receiver": receiver.name,
        "groupLabels": dict(n.group_labels),
        "commonLabels": common([a.labels for a in alerts]),
        "commonAnnotations": common([a.annotations for a in alerts]),
        "externalURL": n.external_url,
        "alerts": [
            {
                "status": a.status,
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": iso(a.starts_at),
                "endsAt": ZERO_TIME if a.status == "firing" else iso(a.ends_at),
                "generatorURL": a.generator_url,
                "fingerprint": a.fingerprint,
            }
            for a in alerts
        ],
    }


def _slack_text(n: Notification, alerts: list[Alert]) -> str:
    status = _status(alerts)
    count = sum(1 for a in alerts if a.status == status)
    labels = common([a.labels for a in alerts])
    name = n.group_labels.get("alertname") or labels.get("alertname") or "alerts"
    scope = ", ".join(f"{k}={v}" for k, v in sorted(n.group_labels.items()) if k != "alertname")
    lines = [_esc(f"[{status.upper()}:{count}] {name}" + (f" — {scope}" if scope else ""))]
    for a in alerts:
        text = a.annotations.get("summary") or _pairs(a.labels) or a.name
        mark = "[RESOLVED] " if a.status == "resolved" and status == "firing" else ""
        value = f" (value {_number(a.value)})" if a.value is not None else ""
        url = a.generator_url or n.external_url
        link = f" <{_url(url)}|Investigate>" if url else ""
        lines.append(f"• {_esc(mark + text + value)}{link}")
    return "\n".join(lines)


def _pagerduty_event(receiver: ReceiverConfig, n: Notification, a: Alert) -> dict[str, Any]:
    assert receiver.routing_key is not None  # ReceiverConfig requires it for pagerduty
    event: dict[str, Any] = {
        "routing_key": receiver.routing_key.get_secret_value(),
        "event_action": "trigger" if a.status == "firing" else "resolve",
        "dedup_key": dedup_key(a),
    }
    if a.status == "resolved":
        return event
    summary = a.annotations.get("summary") or f"{a.name or 'alert'}: {_pairs(a.labels)}"
    source = next((a.labels[k] for k in _SOURCE_LABELS if a.labels.get(k)), "fleetscope")
    event["payload"] = {
        "summary": summary[:_PD_SUMMARY_MAX],
        "source": source,
        "severity": pagerduty_severity(a.labels),
        "timestamp": iso(a.starts_at),
        "custom_details": {
            "labels": dict(a.labels),
            "annotations": dict(a.annotations),
            "value": _json_number(a.value),
        },
    }
    url = a.generator_url or n.external_url
    event["links"] = [{"href": url, "text": "Investigate in fleetscope"}] if url else []
    event["client"] = "fleetscope"
    if n.external_url:
        event["client_url"] = n.external_url
    return event


# --------------------------------------------------------------------------- helpers


def _key(receiver: str, group_key: str, sequence: int) -> str:
    digest = hashlib.sha256(f"{receiver}\x00{group_key}".encode()).hexdigest()[:32]
    return f"{digest}-{sequence}"


def _status(alerts: list[Alert]) -> str:
    return "firing" if any(a.status == "firing" for a in alerts) else "resolved"


def _pairs(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")


def _number(value: float) -> str:
    return f"{value:.4g}"


def _json_number(value: float | None) -> float | str | None:
    """JSON has no NaN or infinities (PostgreSQL's json type refuses them): spell those out."""
    if value is None or math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def _esc(text: str) -> str:
    """Slack's three control characters in message text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _url(url: str) -> str:
    """A URL inside ``<url|text>``: ``|`` and ``>`` would end it early."""
    return url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C")
