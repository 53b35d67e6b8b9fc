"""Scale events intake: JSON lines from the live autoscaler -> ``scale_events`` rows.

In:  ``POST /v1/events``, a body of JSON lines, one object per event (the columns of
     migrations/clickhouse/0013_scale_events.sql: ``ts`` (epoch seconds or ISO 8601), ``pool``,
     ``kind`` (scale_out, scale_in, held_at_max, flap_guard, ready, serving, draining, removed,
     start_failed), ``decision_id``, ``replica``, ``from_replicas``, ``to_replicas``, ``signal``,
     ``value``, ``threshold``, ``crossed_at`` (or null), ``source``, ``detail``); unknown keys are
     refused so that typos are noticed.
Out: ``parse_scale_events`` -> (columns for the writer, [(line number, reason)]): good lines are
     kept even when others are bad; ``mount(collector)`` adds the route to the collector's app
     (answer: ``{"accepted", "rejected": [{"line", "error"}]}``, 400 when nothing was good).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from collector.requestlog import json_lines
from collector.service import Collector

__all__ = ["COLUMNS", "KINDS", "ScaleEventLine", "mount", "parse_scale_events"]

KINDS = (
    "scale_out", "scale_in", "held_at_max", "flap_guard", "ready", "serving", "draining", "removed", "start_failed",
)  # fmt: skip
COLUMNS = (
    "ts", "pool", "kind", "decision_id", "replica", "from_replicas", "to_replicas", "signal", "value", "threshold",
    "crossed_at", "source", "detail",
)  # fmt: skip


def _seconds(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return value
    return value


class ScaleEventLine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ts: float = Field(gt=0)
    pool: str = Field(min_length=1, max_length=256)
    kind: str
    decision_id: str = Field(min_length=1, max_length=64)
    replica: str = Field(default="", max_length=256)
    from_replicas: int = Field(default=0, ge=0, le=65535)
    to_replicas: int = Field(default=0, ge=0, le=65535)
    signal: str = Field(default="", max_length=64)
    value: float = 0.0
    threshold: float = 0.0
    crossed_at: float | None = None
    source: str = Field(default="autoscaler", max_length=64)
    detail: str = Field(default="", max_length=4000)

    @field_validator("ts", "crossed_at", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        return _seconds(value)

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value not in KINDS:
            raise ValueError(f"{value!r} is not one of {', '.join(KINDS)}")
        return value

    @field_validator("value", "threshold")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


def parse_scale_events(body: bytes | str) -> tuple[dict[str, list[Any]], list[tuple[int, str]]]:
    """(columns for ``scale_events``, [(line number, reason)]) of a JSON-lines body. ``ts`` stays
    epoch seconds (the writer makes it a time); ``crossed_at`` becomes a UTC datetime or None."""
    columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
    errors: list[tuple[int, str]] = []
    for event in json_lines(body, ScaleEventLine, errors):
        row = event.model_dump()
        crossed = row["crossed_at"]
        row["crossed_at"] = None if crossed is None else datetime.fromtimestamp(crossed, UTC)
        for name in COLUMNS:
            columns[name].append(row[name])
    return columns, errors


def mount(collector: Collector) -> str:
    """``POST /v1/events`` on the collector's app; a line saying so."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except OSError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        columns, errors = parse_scale_events(body)
        accepted = len(columns["ts"])
        if accepted:
            collector.writer.add("scale_events", columns)
        return web.json_response(
            {"accepted": accepted, "rejected": [{"line": n, "error": e} for n, e in errors[:100]]},
            status=400 if errors and not accepted else 200,
        )

    def hooks(app: web.Application) -> None:
        app.router.add_post("/v1/events", handle)

    collector.mounts.append(hooks)
    c = collector.config
    return f"scale events: POST http://{c.host}:{c.http_port}/v1/events"
