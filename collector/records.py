"""Gateway telemetry bodies -> ``Record``s for ``collector.mapping``.

In:  - OTLP trace exports (the spans that are not vLLM's ``llm_request``: a gateway's GenAI spans,
       LiteLLM's ``litellm_request``), already decoded (protobuf message or OTLP/JSON);
     - OTLP log exports (``POST /v1/logs``: Envoy's OpenTelemetry access log), protobuf or JSON;
     - LiteLLM ``generic_api`` callback bodies: a JSON array or NDJSON of StandardLoggingPayload.
Out: ``Record``s: the record's attributes (a log body that is a map adds its keys), the
     resource's as ``resource.<key>``, and the carrier's own fields under reserved keys
     (``span.name``, ``span.start_time``, ``span.end_time`` in epoch seconds, ``span.trace_id``,
     ``span.status``; ``log.time``, ``log.trace_id``, ``log.body``, ``log.severity``;
     ``scope.name``). An attribute whose string value is a JSON object or array, or a Python
     literal of one (LiteLLM writes ``hidden_params`` as JSON and ``metadata.usage_object`` as a
     Python ``repr``), up to ``MAX_EXPANDED`` characters, also gives its keys as
     ``<attribute>.<key>``. A body that cannot be decoded raises ``OtlpError`` (the receiver answers 400
     with the reason); a bad LiteLLM line is returned with its number and reason.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Iterator
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.mapping import Record, flatten
from collector.otlp import REQUEST_SPAN, OtlpError, SpanRecord, _any_value, _json_attrs

__all__ = ["GENAI_MARK", "litellm_records", "log_records", "log_records_json", "span_records", "spans_to_records"]

GENAI_MARK = b"gen_ai."  # a body without it holds no GenAI attribute: no need to read it twice
_STATUS = {0: "unset", 1: "ok", 2: "error"}
MAX_RECORDS = 100_000  # one body's records; more is refused rather than held
MAX_EXPANDED = 16_384  # longer structured strings stay strings


def _structured(text: str) -> Any:
    """The object a JSON or Python-literal string holds, or None."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _expand(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` plus the keys of its structured string values (never overriding a key)."""
    found: dict[str, Any] = {}
    for key, value in attrs.items():
        if isinstance(value, str) and 1 < len(value) <= MAX_EXPANDED and value[0] in "{[" and value[-1] in "}]":
            inner = _structured(value)
            if isinstance(inner, dict | list):
                found[key] = inner
    for key, inner in found.items():
        if isinstance(inner, list):
            attrs[key] = inner  # e.g. finish_reasons '["stop"]' -> ["stop"]
            for i, element in enumerate(inner[:8]):
                for sub, value in flatten(element, f"{key}.{i}.").items():
                    attrs.setdefault(sub, value)
        else:
            for sub, value in flatten(inner, f"{key}.").items():
                attrs.setdefault(sub, value)
    return attrs


def _seconds(ns: int) -> float | None:
    """Epoch seconds of a time in nanoseconds (None: unset, or more than a fixed64 holds)."""
    return ns / 1e9 if 0 < ns < 2**64 else None


def _with_resource(attrs: dict[str, Any], resource: dict[str, Any], scope: str) -> dict[str, Any]:
    _expand(attrs)
    for key, value in resource.items():
        attrs[f"resource.{key}"] = value
    if scope:
        attrs["scope.name"] = scope
    return attrs


def span_records(message: ExportTraceServiceRequest) -> list[Record]:
    """The spans of a decoded export that are not ``llm_request`` (those are the engines')."""
    out: list[Record] = []
    for rs in message.resource_spans:
        resource = {kv.key: _any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                if span.name == REQUEST_SPAN:
                    continue
                attrs = {kv.key: _any_value(kv.value) for kv in span.attributes}
                attrs.update(
                    {
                        "span.name": span.name,
                        "span.start_time": _seconds(span.start_time_unix_nano),
                        "span.end_time": _seconds(span.end_time_unix_nano),
                        "span.trace_id": span.trace_id,
                        "span.status": _STATUS.get(span.status.code, "unset"),
                    }
                )
                out.append(Record("span", _with_resource(attrs, resource, ss.scope.name)))
    return out


def spans_to_records(spans: Iterable[SpanRecord]) -> Iterator[Record]:
    """Records of already-decoded spans (OTLP/JSON, gRPC) that are not ``llm_request``."""
    for span in spans:
        if span.name == REQUEST_SPAN:
            continue
        attrs = dict(span.attributes)
        attrs.update(
            {
                "span.name": span.name,
                "span.start_time": _seconds(span.start_ns),
                "span.end_time": _seconds(span.end_ns),
                "span.trace_id": span.trace_id,
                "span.status": _STATUS.get(span.status_code, "unset"),
            }
        )
        yield Record("span", _with_resource(attrs, dict(span.resource), ""))


def _log_attrs(attrs: dict[str, Any], body: Any, time_s: float | None, trace_id: Any, severity: str) -> dict[str, Any]:
    if isinstance(body, dict):  # a structured body: its keys as attributes (the record's own win)
        for key, value in flatten(body).items():
            attrs.setdefault(key, value)
    elif body is not None:
        attrs["log.body"] = body
    attrs.update({"log.time": time_s, "log.trace_id": trace_id, "log.severity": severity})
    return attrs


def log_records(body: bytes) -> list[Record]:
    """An OTLP protobuf ``ExportLogsServiceRequest`` -> one record per log record."""
    message = ExportLogsServiceRequest()
    try:
        message.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpError(f"not an OTLP protobuf ExportLogsServiceRequest: {exc}") from None
    out: list[Record] = []
    for rl in message.resource_logs:
        resource = {kv.key: _any_value(kv.value) for kv in rl.resource.attributes}
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                if len(out) >= MAX_RECORDS:
                    raise OtlpError(f"more than {MAX_RECORDS} log records in one body")
                attrs = {kv.key: _any_value(kv.value) for kv in lr.attributes}
                when = lr.time_unix_nano or lr.observed_time_unix_nano
                body_value = _any_value(lr.body) if lr.HasField("body") else None
                _log_attrs(attrs, body_value, when / 1e9 if when else None, lr.trace_id, lr.severity_text)
                out.append(Record("log", _with_resource(attrs, resource, sl.scope.name)))
    return out


def log_records_json(body: bytes) -> list[Record]:
    """OTLP/JSON logs (hex ids; 64-bit integers may be strings)."""
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise OtlpError("an OTLP/JSON logs body is an object with resourceLogs")
        out: list[Record] = []
        for rl in data.get("resourceLogs", []) or []:
            resource = _json_attrs((rl.get("resource") or {}).get("attributes"))
            for sl in rl.get("scopeLogs", []) or []:
                scope = str((sl.get("scope") or {}).get("name", ""))
                for lr in sl.get("logRecords", []) or []:
                    if len(out) >= MAX_RECORDS:
                        raise OtlpError(f"more than {MAX_RECORDS} log records in one body")
                    attrs = _json_attrs(lr.get("attributes"))
                    when = int(lr.get("timeUnixNano", 0) or lr.get("observedTimeUnixNano", 0) or 0)
                    when = when if 0 < when < 2**64 else 0  # a fixed64 holds no more
                    raw_body = lr.get("body")
                    body_value = _json_attrs([{"key": "v", "value": raw_body}])["v"] if raw_body else None
                    trace = str(lr.get("traceId", "") or "").lower()
                    _log_attrs(attrs, body_value, when / 1e9 if when else None, trace, str(lr.get("severityText", "")))
                    out.append(Record("log", _with_resource(attrs, resource, scope)))
        return out
    except OtlpError:
        raise
    except RecursionError:
        raise OtlpError("OTLP/JSON body nested too deeply") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        raise OtlpError(f"not an OTLP/JSON ExportLogsServiceRequest: {type(exc).__name__}: {exc}") from None


def litellm_records(body: bytes) -> tuple[list[Record], list[tuple[int, str]]]:
    """LiteLLM's ``generic_api`` body (a JSON array, one JSON object, or NDJSON) -> (records,
    [(item number, reason)]) — a bad item does not stop the good ones."""
    text = body.decode("utf-8", errors="replace").strip()
    items: list[tuple[int, Any]] = []
    errors: list[tuple[int, str]] = []
    if text.startswith("["):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            return [], [(1, f"not JSON: {exc}")]
        items = list(enumerate(data, 1))
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append((number, json.loads(line)))
            except (ValueError, RecursionError) as exc:
                errors.append((number, f"not JSON: {exc}"))
    records: list[Record] = []
    for number, item in items[:MAX_RECORDS]:
        if not isinstance(item, dict):
            errors.append((number, f"expected a StandardLoggingPayload object, got {type(item).__name__}"))
            continue
        records.append(Record("litellm", flatten(item)))
    if len(items) > MAX_RECORDS:
        errors.append((MAX_RECORDS + 1, f"more than {MAX_RECORDS} records in one body: the rest were refused"))
    return records, errors
