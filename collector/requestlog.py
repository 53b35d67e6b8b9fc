"""Gateway request log: JSON lines -> request rows (``source = 'gateway'``).

In:  a body of JSON lines, one object per finished request (schema below; unknown keys are
     refused so that typos are noticed).
Out: request rows for the ``requests`` table and, per bad line, its line number and reason.
     Good lines are accepted even when others are bad.

Schema (docs/schema.md): ``ts`` (epoch seconds or ISO 8601), ``trace_id`` (32 hex digits, the
W3C trace id the gateway forwarded, which joins this row to the engine's ``llm_request``
span), ``request_id``, ``replica``, ``model``, ``tenant``, ``route`` (the routing decision),
``status_code``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``,
``cached_tokens``, ``max_tokens``, ``ttft_seconds``, ``e2e_seconds``, ``queue_seconds``,
``session``, ``route_reason``, ``outcome`` (ok, rejected, timeout, client_abort,
upstream_error, no_replica), ``error`` (why it failed, in words), ``itl_seconds`` (client-side mean inter-token
latency),
``prefix_hash``, ``stream``.

Quality fields (issue 43; docs/quality.md), given by the gateway for a sampled answer it scored:
``evaluated`` (bool), ``answer_hash`` (16 hex digits: sha256 of the answer), ``answer_chars``
(int), ``truncated``, ``empty_answer``, ``refusal`` (bool), ``repetition`` (a share 0-1),
``json_valid`` (null: JSON not asked, else bool), and ``answer_text`` only where the gateway keeps
answers (``quality.keep_text``; cut at ``MAX_ANSWER_TEXT`` characters, ``answer_chars`` keeps the
length). A wrong type (``"true"``, ``1`` for a bool) or a value out of range refuses the line; a
line without them is a row not evaluated (``collector.request_columns.QUALITY_DEFAULTS``).

Router audit fields (migration 0015), on a shadow request's line only: ``audit_of`` (the trace id
of the request it shadows), ``audit_direction`` (``small_to_large`` / ``large_to_small``),
``agreement``, ``judge_routed``, ``judge_shadow`` (null or a number 0-1; stored as -1 for null).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

__all__ = ["MAX_ANSWER_TEXT", "GatewayRecord", "parse_request_log"]

MAX_ANSWER_TEXT = 100_000  # characters of a kept answer stored; the rest is cut
UINT32_MAX = 2**32 - 1


class GatewayRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ts: float
    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    request_id: str = ""
    replica: str = ""
    model: str
    tenant: str = ""
    session: str = ""
    route: str = ""
    route_reason: str = ""
    outcome: str = "ok"
    error: str = Field(default="", max_length=2000)
    itl_seconds: float = Field(default=0.0, ge=0)
    prefix_hash: str = ""
    stream: bool = False
    status_code: int = Field(default=200, ge=100, le=599)
    finish_reason: str = ""
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cached_tokens: int = Field(default=0, ge=0)
    max_tokens: int = Field(default=0, ge=0)
    ttft_seconds: float = Field(default=0.0, ge=0)
    e2e_seconds: float = Field(default=0.0, ge=0)
    queue_seconds: float = Field(default=0.0, ge=0)
    # quality (issue 43): strict types, so that "false" or 1 is refused rather than guessed
    evaluated: StrictBool = False
    answer_hash: str = Field(default="", pattern=r"^([0-9a-f]{16})?$")
    answer_chars: int = Field(default=0, ge=0, le=UINT32_MAX, strict=True)
    truncated: StrictBool = False
    empty_answer: StrictBool = False
    refusal: StrictBool = False
    repetition: float = Field(default=0.0, ge=0, le=1, strict=True, allow_inf_nan=False)
    json_valid: StrictBool | None = None
    answer_text: str = Field(default="", strict=True)
    # the router audit (migration 0015): a shadow request's row names the request it shadows
    audit_of: str = Field(default="", pattern=r"^([0-9a-f]{32})?$")
    audit_direction: Literal["", "small_to_large", "large_to_small"] = ""
    agreement: float | None = Field(default=None, ge=0, le=1, strict=True, allow_inf_nan=False)
    judge_routed: float | None = Field(default=None, ge=0, le=1, strict=True, allow_inf_nan=False)
    judge_shadow: float | None = Field(default=None, ge=0, le=1, strict=True, allow_inf_nan=False)

    @field_validator("ts", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                return value
        return value

    @field_validator("trace_id", "answer_hash", "audit_of", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


M = TypeVar("M", bound=BaseModel)


def json_lines(body: bytes | str, model: type[M], errors: list[tuple[int, str]]) -> Iterator[M]:
    """The lines of a JSON-lines body validated as ``model``; a line that is not refuses itself
    into ``errors`` as (line number, reason). Blank lines are skipped."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield model.model_validate(json.loads(line))
        except json.JSONDecodeError as exc:
            errors.append((number, f"not JSON: {exc.msg}"))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "line"
            errors.append((number, f"{where}: {first['msg']}"))


def parse_request_log(body: bytes | str) -> tuple[list[dict[str, Any]], list[tuple[int, str]]]:
    """(rows, [(line number, reason)]) of a JSON-lines body."""
    rows: list[dict[str, Any]] = []
    errors: list[tuple[int, str]] = []
    for record in json_lines(body, GatewayRecord, errors):
        row = record.model_dump()
        completion = row["completion_tokens"]
        decode = max(0.0, row["e2e_seconds"] - row["ttft_seconds"])
        for flag in ("stream", "evaluated", "truncated", "empty_answer", "refusal"):
            row[flag] = 1 if row[flag] else 0
        row["json_valid"] = -1 if row["json_valid"] is None else int(row["json_valid"])
        row["answer_text"] = row["answer_text"][:MAX_ANSWER_TEXT]
        for score in ("agreement", "judge_routed", "judge_shadow"):
            row[score] = -1.0 if row[score] is None else row[score]
        row.update(
            source="gateway",
            gateway="fleetscope",
            prefill_seconds=0.0,
            decode_seconds=decode,
            tpot_seconds=decode / (completion - 1) if completion > 1 else 0.0,
        )
        rows.append(row)
    return rows, errors
