"""Receivers: where notifications go, validated before anything is sent.

In:  one mapping per receiver (from the alerting config), e.g.
     ``{"name": "oncall", "type": "pagerduty", "routing_key": "..."}``.
Out: a frozen ``ReceiverConfig``; ``alerts.payloads`` shapes bodies for its ``type`` and
     ``alerts.delivery`` posts them to its ``url`` with its headers, signature and timeout.
     A bad mapping raises pydantic's ``ValidationError`` naming the key and the problem.

Types: ``webhook`` (Alertmanager v4 JSON to any URL), ``slack`` (an incoming-webhook URL,
``{"text": ...}``), ``pagerduty`` (Events API v2; ``url`` defaults to PagerDuty's endpoint
and ``routing_key`` is the integration key) and ``alertmanager`` (a real Alertmanager's v2 API:
``url`` or ``urls`` are its base URLs, every alert is pushed there as Prometheus pushes it and
re-sent every ``resend_interval``; ``alerts.alertmanager``). ``max_age_h`` bounds how long an
undeliverable notification is retried before it is marked failed.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from common.durations import Duration

__all__ = [
    "DEFAULT_RESEND_S",
    "MAX_RESEND_S",
    "MIN_RESEND_S",
    "PAGERDUTY_EVENTS_URL",
    "RESERVED_HEADERS",
    "ReceiverConfig",
]

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
# Set by the deliverer on every request; a receiver's custom headers may not replace them.
RESERVED_HEADERS = frozenset(
    {"content-type", "content-length", "host", "idempotency-key", "x-fleetscope-signature-256"}
)
DEFAULT_RESEND_S = 60.0  # Prometheus' --rules.alert.resend-delay
MIN_RESEND_S = 1.0  # more often only loads Alertmanager: its state changes at its own group_interval
MAX_RESEND_S = 3600.0  # an alert lives 4 resend intervals in Alertmanager after fleetscope stops
_MAX_NAME = 128  # alert_outbox.receiver
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)


class ReceiverConfig(BaseModel):
    """One notification target."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="unique receiver name; routes refer to it")
    type: Literal["alertmanager", "webhook", "slack", "pagerduty"]
    url: str = Field(
        default="",
        validate_default=True,
        description=f"http(s) URL to POST to (pagerduty: defaults to {PAGERDUTY_EVENTS_URL}; "
        "alertmanager: its base URL, e.g. http://alertmanager:9093)",
    )
    urls: list[str] = Field(
        default_factory=list, description="alertmanager: the base URLs of every Alertmanager of an HA cluster"
    )
    resend_interval_s: Duration = Field(
        default=DEFAULT_RESEND_S,
        validation_alias=AliasChoices("resend_interval", "resend_interval_s"),
        description="alertmanager: how often a firing alert is sent again (Prometheus: 1m)",
    )
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers, e.g. Authorization")
    hmac_secret: SecretStr | None = Field(
        default=None, description="signs each body: X-Fleetscope-Signature-256: sha256=<hex>"
    )
    routing_key: SecretStr | None = Field(default=None, description="PagerDuty Events v2 integration key")
    send_resolved: bool = Field(default=True, description="also notify when alerts resolve")
    timeout_s: float = Field(default=10.0, gt=0, description="per request")
    max_age_h: float = Field(default=24.0, gt=0, description="give up on a notification not delivered after this long")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        if value != value.strip():
            raise ValueError(f"must not start or end with spaces, got {value!r}")
        if len(value) > _MAX_NAME:
            raise ValueError(f"must be at most {_MAX_NAME} characters, got {len(value)}")
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str, info: ValidationInfo) -> str:
        kind = info.data.get("type")
        if not value:
            if kind == "pagerduty":
                return PAGERDUTY_EVENTS_URL
            if kind == "alertmanager":
                return value  # urls may name them: checked with the whole receiver
            for_kind = f" for a {kind} receiver" if kind else ""
            raise ValueError(f"is required{for_kind} (an http:// or https:// URL)")
        return _http_url(value, alertmanager=kind == "alertmanager")

    @field_validator("urls")
    @classmethod
    def _check_urls(cls, value: list[str], info: ValidationInfo) -> list[str]:
        return [_http_url(url, alertmanager=info.data.get("type") == "alertmanager") for url in value]

    @field_validator("resend_interval_s")
    @classmethod
    def _check_resend(cls, value: float) -> float:
        if not MIN_RESEND_S <= value <= MAX_RESEND_S:
            raise ValueError(
                f"must be between {MIN_RESEND_S:g}s and {MAX_RESEND_S / 60:g}m (Prometheus re-sends every 1m), "
                f"got {value:g}s"
            )
        return value

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _TOKEN.match(name):
                raise ValueError(f"{name!r} is not a valid HTTP header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"{name!r} is set by fleetscope on every request and cannot be overridden")
            if "\r" in text or "\n" in text:
                raise ValueError(f"the value of {name!r} must not contain line breaks")
        return value

    def targets(self) -> list[str]:
        """Where this receiver's notifications go: its ``url`` and ``urls``, each once."""
        return list(dict.fromkeys(_given(self)))

    @model_validator(mode="after")
    def _check_alertmanager(self) -> ReceiverConfig:
        where = f"receiver {self.name!r}"
        if self.type != "alertmanager":
            if self.urls:
                raise ValueError(f"{where}: urls is only for alertmanager receivers, not {self.type} (use url)")
            if "resend_interval_s" in self.model_fields_set:
                raise ValueError(
                    f"{where}: resend_interval is only for alertmanager receivers; {self.type} receivers are "
                    "repeated by their route's repeat_interval"
                )
            return self
        if not self.targets():
            raise ValueError(f"{where}: an alertmanager receiver needs url (or urls), e.g. http://alertmanager:9093")
        given = _given(self)
        twice = sorted({u for u in given if given.count(u) > 1})
        if twice:
            raise ValueError(f"{where}: Alertmanager URL {twice[0]} is given twice (url and urls list each once)")
        if not self.send_resolved:
            raise ValueError(
                f"{where}: send_resolved is Alertmanager's to decide (its receivers' send_resolved); "
                "fleetscope always tells Alertmanager when an alert resolves"
            )
        return self

    @model_validator(mode="after")
    def _check_routing_key(self) -> ReceiverConfig:
        key = self.routing_key.get_secret_value().strip() if self.routing_key else ""
        if self.type == "pagerduty" and not key:
            raise ValueError(
                f"receiver {self.name!r}: routing_key is required for a pagerduty receiver "
                "(the integration key of an Events API v2 integration)"
            )
        if self.type != "pagerduty" and self.routing_key is not None:
            raise ValueError(
                f"receiver {self.name!r}: routing_key is only for pagerduty receivers, "
                f"not {self.type} (use headers for a token)"
            )
        return self


def _given(receiver: ReceiverConfig) -> list[str]:
    return [u.rstrip("/") for u in [receiver.url, *receiver.urls] if u]


def _http_url(value: str, *, alertmanager: bool) -> str:
    parts = urlsplit(value)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
    if not parts.hostname:
        raise ValueError(f"has no host: {value!r}")
    if alertmanager:
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                f"must not hold credentials ({parts.hostname}): give them in headers, "
                'e.g. {Authorization: "Basic <base64 of user:password>"}, so they stay out of the outbox'
            )
        if parts.query or parts.fragment:
            raise ValueError(f"must be Alertmanager's base URL, without ?query or #fragment, got {value!r}")
        if parts.path.rstrip("/").endswith("/api/v2/alerts"):
            raise ValueError(f"must be Alertmanager's base URL (fleetscope adds /api/v2/alerts), got {value!r}")
    return value
