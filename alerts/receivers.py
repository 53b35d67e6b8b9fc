"""Receivers: where notifications go, validated before anything is sent.

In:  one mapping per receiver (from the alerting config), e.g.
     ``{"name": "oncall", "type": "pagerduty", "routing_key": "..."}``.
Out: a frozen ``ReceiverConfig``; ``alerts.payloads`` shapes bodies for its ``type`` and
     ``alerts.delivery`` posts them to its ``url`` with its headers, signature and timeout.
     A bad mapping raises pydantic's ``ValidationError`` naming the key and the problem.

Types: ``webhook`` (Alertmanager v4 JSON to any URL), ``slack`` (an incoming-webhook URL,
``{"text": ...}``) and ``pagerduty`` (Events API v2; ``url`` defaults to PagerDuty's endpoint
and ``routing_key`` is the integration key). ``max_age_h`` bounds how long an undeliverable
notification is retried before it is marked failed.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

__all__ = ["PAGERDUTY_EVENTS_URL", "RESERVED_HEADERS", "ReceiverConfig"]

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
# Set by the deliverer on every request; a receiver's custom headers may not replace them.
RESERVED_HEADERS = frozenset(
    {"content-type", "content-length", "host", "idempotency-key", "x-fleetscope-signature-256"}
)
_MAX_NAME = 128  # alert_outbox.receiver
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)


class ReceiverConfig(BaseModel):
    """One notification target."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="unique receiver name; routes refer to it")
    type: Literal["webhook", "slack", "pagerduty"]
    url: str = Field(
        default="",
        validate_default=True,
        description=f"http(s) URL to POST to (pagerduty: defaults to {PAGERDUTY_EVENTS_URL})",
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
            for_kind = f" for a {kind} receiver" if kind else ""
            raise ValueError(f"is required{for_kind} (an http:// or https:// URL)")
        parts = urlsplit(value)
        if parts.scheme.lower() not in ("http", "https"):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        if not parts.hostname:
            raise ValueError(f"has no host: {value!r}")
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
