"""The alert instance every part of ``alerts`` passes around, its fingerprint, and label matchers.

In:  label sets, states and times from the evaluator.
Out: ``Alert`` (one labelled instance of a rule, as a notification shows it), ``fingerprint``
     (stable across processes: a hash of the sorted labels, like Alertmanager's) and
     ``Matcher`` (``name=value``, ``!=``, ``=~``, ``!~``; regexes are fully anchored as in
     Prometheus), used by silences, inhibition rules and rule-test expectations.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from common.timeutil import as_utc

__all__ = ["ZERO_TIME", "Alert", "Matcher", "fingerprint", "parse_matchers", "resolved_from", "stored"]

# Alertmanager's "not ended" endsAt (Go's zero time); firing alerts carry it.
ZERO_TIME = "0001-01-01T00:00:00Z"


def fingerprint(labels: dict[str, str]) -> str:
    """16 hex digits identifying a label set (order does not matter)."""
    text = "\xff".join(f"{k}\xfe{labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def iso(value: datetime | None) -> str:
    """RFC 3339 in UTC with milliseconds, or the zero time for ``None``."""
    if value is None:
        return ZERO_TIME
    return as_utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Alert:
    """One instance of a rule at one moment, as receivers see it."""

    labels: dict[str, str]
    annotations: dict[str, str]
    status: str  # "firing" | "resolved"
    starts_at: datetime
    ends_at: datetime | None = None  # set when resolved
    generator_url: str = ""
    value: float | None = None
    fingerprint: str = field(default="")

    def __post_init__(self) -> None:
        if self.status not in ("firing", "resolved"):
            raise ValueError(f"alert status must be firing or resolved, not {self.status!r}")
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", fingerprint(self.labels))

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")


def stored(a: Alert) -> dict[str, Any]:
    """What a receiver was told of a firing alert, as ``alert_groups.sent`` keeps it (JSON)."""
    return {
        "labels": a.labels,
        "annotations": a.annotations,
        "starts_at": a.starts_at.isoformat(),
        "generator_url": a.generator_url,
        "fingerprint": a.fingerprint,
    }


def resolved_from(item: dict[str, Any], at: datetime) -> Alert:
    """A firing alert a receiver was told about (``stored``) that is no longer there: resolved at ``at``."""
    return Alert(
        labels=item["labels"],
        annotations=item["annotations"],
        status="resolved",
        starts_at=datetime.fromisoformat(item["starts_at"]),
        ends_at=at,
        generator_url=item.get("generator_url", ""),
        fingerprint=item["fingerprint"],
    )


_OPS = ("=~", "!~", "!=", "=")
_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^,"\s]*))\s*$')


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"matcher operator must be one of {', '.join(_OPS)}, not {self.op!r}")
        if self.op in ("=~", "!~"):
            try:
                re.compile(self.value)
            except re.error as exc:
                raise ValueError(
                    f"matcher {self.name}{self.op}{self.value!r}: bad regular expression ({exc})"
                ) from None

    def matches(self, labels: dict[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = re.fullmatch(self.value, actual) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f'{self.name}{self.op}"{self.value}"'


def parse_matchers(text: str | list[str]) -> list[Matcher]:
    """``'alertname="X", replica=~"r-.*"'`` (or a list of such strings) -> matchers."""
    parts = text if isinstance(text, list) else _split(text.strip().strip("{}"))
    out = []
    for part in parts:
        if not part.strip():
            continue
        m = _MATCHER.match(part)
        if not m:
            raise ValueError(f'cannot read matcher {part.strip()!r}: write name="value" (or != =~ !~)')
        value = m.group(3) if m.group(3) is not None else m.group(4)
        out.append(Matcher(m.group(1), m.group(2), re.sub(r"\\(.)", r"\1", value)))
    return out


def _split(text: str) -> list[str]:
    """Split on commas outside double quotes."""
    parts, current, quoted, escaped = [], [], False, False
    for ch in text:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            current.append(ch)
            escaped = True
        elif ch == '"':
            quoted = not quoted
            current.append(ch)
        elif ch == "," and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts
