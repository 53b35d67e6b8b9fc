"""OTLP traces -> request rows: vLLM ``llm_request`` spans become ``requests`` table rows.

In:  an OTLP ``ExportTraceServiceRequest``, as protobuf bytes (HTTP ``application/x-protobuf``
     or gRPC) or as OTLP/JSON (hex trace ids, string-encoded 64-bit integers).
Out: ``SpanRecord``s (all spans) and, for ``llm_request`` spans, request rows with timings,
     tokens, request id, trace id (the quality columns at their defaults: not evaluated), and the
     replica/model from the resource attributes the launcher sets (``fleetscope.replica`` /
     ``fleetscope.model``, else ``service.instance.id`` / ``service.name``). Other spans (e.g.
     vLLM start-up spans) are counted and ignored. A body that cannot be decoded raises ``OtlpError``.

``request_columns`` is the collector's path for protobuf bodies: it goes from the decoded
message straight to the ``requests`` columns, reading only the attributes a row needs, and
gives the same rows as ``request_row`` over ``decode_protobuf`` (tests/collector/test_otlp.py)
at about a third of the cost per span.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.errors import CollectorError
from collector.request_columns import fill_columns, fill_row

__all__ = [
    "OtlpError",
    "SpanRecord",
    "decode_json",
    "decode_protobuf",
    "request_columns",
    "request_row",
    "REQUEST_SPAN",
]

REQUEST_SPAN = "llm_request"
STATUS_ERROR = 2


class OtlpError(CollectorError, ValueError):
    """An OTLP body that cannot be decoded."""


@dataclass(frozen=True)
class SpanRecord:
    name: str
    trace_id: str  # 32 hex digits
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def decode_protobuf(body: bytes) -> list[SpanRecord]:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpError(f"not an OTLP protobuf ExportTraceServiceRequest: {exc}") from None
    return spans_from_message(request)


def _number(value: Any) -> float:
    # an AnyValue: ints and doubles count, anything else (strings, bools) is 0, as in _num
    return float(value.double_value or value.int_value) if value is not None else 0.0


def _uint32(number: float) -> int:
    """A token count as the column holds it: truncated, and 0 for what a UInt32 cannot hold (NaN,
    infinite, negative, past 2^32), as the store's own decoding does (0010_otlp_exports.sql)."""
    if not math.isfinite(number) or number < 0 or number >= 2**32:
        return 0
    return int(number)


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.string_value or (str(value.int_value) if value.int_value else "")


def request_columns(body: bytes) -> tuple[dict[str, list[Any]], int]:
    """A protobuf body -> (``requests`` columns of its ``llm_request`` spans, other spans)."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpError(f"not an OTLP protobuf ExportTraceServiceRequest: {exc}") from None
    ts, request_id, trace_id, replicas, models, status, outcome = [], [], [], [], [], [], []
    prompt, completion, max_tokens, ttft, e2e, queue, prefill, decode, tpot = [], [], [], [], [], [], [], [], []
    other = 0
    for rs in request.resource_spans:
        res = {kv.key: kv.value for kv in rs.resource.attributes}
        replica = (
            _text(res.get("fleetscope.replica"))
            or _text(res.get("service.instance.id"))
            or _text(res.get("service.name"))
        )
        resource_model = _text(res.get("fleetscope.model"))
        for ss in rs.scope_spans:
            for span in ss.spans:
                if span.name != REQUEST_SPAN:
                    other += 1
                    continue
                a = {kv.key: kv.value for kv in span.attributes}
                n_out = _uint32(_number(a.get("gen_ai.usage.completion_tokens")))
                d = _number(a.get("gen_ai.latency.time_in_model_decode"))
                error = span.status.code == STATUS_ERROR
                ts.append(span.start_time_unix_nano / 1e9)
                request_id.append(_text(a.get("gen_ai.request.id")))
                trace_id.append(span.trace_id.hex())
                replicas.append(replica)
                models.append(resource_model or _text(a.get("gen_ai.response.model")))
                status.append(500 if error else 200)
                outcome.append("error" if error else "ok")
                prompt.append(_uint32(_number(a.get("gen_ai.usage.prompt_tokens"))))
                completion.append(n_out)
                max_tokens.append(_uint32(_number(a.get("gen_ai.request.max_tokens"))))
                ttft.append(_number(a.get("gen_ai.latency.time_to_first_token")))
                e2e.append(_number(a.get("gen_ai.latency.e2e")))
                queue.append(_number(a.get("gen_ai.latency.time_in_queue")))
                prefill.append(_number(a.get("gen_ai.latency.time_in_model_prefill")))
                decode.append(d)
                tpot.append(d / (n_out - 1) if n_out > 1 else 0.0)
    n = len(ts)
    empty, zeros = [""] * n, [0] * n
    columns = {
        "ts": ts,
        "source": ["otlp"] * n,
        "gateway": empty,
        "request_id": request_id,
        "trace_id": trace_id,
        "replica": replicas,
        "model": models,
        "tenant": empty,
        "route": empty,
        "status_code": status,
        "finish_reason": empty,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": zeros,
        "max_tokens": max_tokens,
        "ttft_seconds": ttft,
        "e2e_seconds": e2e,
        "queue_seconds": queue,
        "prefill_seconds": prefill,
        "decode_seconds": decode,
        "tpot_seconds": tpot,
        "session": empty,
        "route_reason": empty,
        "outcome": outcome,
        "error": empty,
        "itl_seconds": [0.0] * n,
        "prefix_hash": empty,
        "stream": zeros,
    }
    return fill_columns(columns, n), other  # engine spans carry no answer scores: not evaluated


def spans_from_message(request: ExportTraceServiceRequest) -> list[SpanRecord]:
    spans = []
    for rs in request.resource_spans:
        resource = {kv.key: _any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                spans.append(
                    SpanRecord(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                        attributes={kv.key: _any_value(kv.value) for kv in span.attributes},
                        resource=resource,
                    )
                )
    return spans


_JSON_KINDS = ("stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue", "bytesValue")


def _json_value(value: Any) -> Any:
    if not isinstance(value, dict):
        raise OtlpError("attribute value must be an object")
    for kind in _JSON_KINDS:
        if kind in value:
            raw = value[kind]
            if kind == "intValue":
                return int(raw)
            if kind == "doubleValue":
                return float(raw)
            if kind == "arrayValue":
                return [_json_value(v) for v in (raw or {}).get("values", [])]
            if kind == "bytesValue":  # base64 in protobuf's JSON mapping
                return base64.b64decode(raw, validate=True)
            if kind == "kvlistValue":
                return {kv["key"]: _json_value(kv.get("value", {})) for kv in (raw or {}).get("values", [])}
            return raw
    return None


def _json_attrs(items: Any) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise OtlpError("attributes must be a list")
    out = {}
    for kv in items:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise OtlpError("an attribute is an object with a string key")
        out[kv["key"]] = _json_value(kv.get("value", {}))
    return out


def decode_json(body: bytes) -> list[SpanRecord]:
    """OTLP/JSON (hex ids; 64-bit integers may be strings)."""
    try:
        data = json.loads(body)
        spans = []
        for rs in data.get("resourceSpans", []) or []:
            resource = _json_attrs((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans", []) or []:
                for span in ss.get("spans", []) or []:
                    trace_id = str(span.get("traceId", "")).lower()
                    if len(trace_id) != 32 or any(c not in "0123456789abcdef" for c in trace_id):
                        raise OtlpError(f"traceId must be 32 hex digits, got {trace_id!r}")
                    spans.append(
                        SpanRecord(
                            name=str(span.get("name", "")),
                            trace_id=trace_id,
                            start_ns=int(span.get("startTimeUnixNano", 0)),
                            end_ns=int(span.get("endTimeUnixNano", 0)),
                            status_code=int((span.get("status") or {}).get("code", 0)),
                            attributes=_json_attrs(span.get("attributes")),
                            resource=resource,
                        )
                    )
        return spans
    except OtlpError:
        raise
    except RecursionError:
        raise OtlpError("OTLP/JSON body nested too deeply") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        raise OtlpError(f"not an OTLP/JSON ExportTraceServiceRequest: {type(exc).__name__}: {exc}") from None


def _num(attrs: dict[str, Any], key: str) -> float:
    value = attrs.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _str(value: Any) -> str:
    # a decoded attribute as text, by _text's rule: a string, a non-zero integer, else nothing (a
    # double, bool, array, map or bytes is no id or name)
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int) and not isinstance(value, bool) and value else ""


def request_row(span: SpanRecord) -> dict[str, Any] | None:
    """The ``requests`` row of an ``llm_request`` span (None for any other span)."""
    if span.name != REQUEST_SPAN:
        return None
    a, r = span.attributes, span.resource
    completion = _uint32(_num(a, "gen_ai.usage.completion_tokens"))
    decode = _num(a, "gen_ai.latency.time_in_model_decode")
    replica = _str(r.get("fleetscope.replica")) or _str(r.get("service.instance.id")) or _str(r.get("service.name"))
    model = _str(r.get("fleetscope.model")) or _str(a.get("gen_ai.response.model"))
    row = {
        "ts": span.start_ns / 1e9,
        "source": "otlp",
        "gateway": "",
        "request_id": _str(a.get("gen_ai.request.id")),
        "trace_id": span.trace_id,
        "replica": replica,
        "model": model,
        "tenant": "",
        "route": "",
        "status_code": 500 if span.status_code == STATUS_ERROR else 200,
        "finish_reason": "",
        "prompt_tokens": _uint32(_num(a, "gen_ai.usage.prompt_tokens")),
        "completion_tokens": completion,
        "cached_tokens": 0,
        "max_tokens": _uint32(_num(a, "gen_ai.request.max_tokens")),
        "ttft_seconds": _num(a, "gen_ai.latency.time_to_first_token"),
        "e2e_seconds": _num(a, "gen_ai.latency.e2e"),
        "queue_seconds": _num(a, "gen_ai.latency.time_in_queue"),
        "prefill_seconds": _num(a, "gen_ai.latency.time_in_model_prefill"),
        "decode_seconds": decode,
        "tpot_seconds": decode / (completion - 1) if completion > 1 else 0.0,
        "session": "",
        "route_reason": "",
        "outcome": "error" if span.status_code == STATUS_ERROR else "ok",
        "error": "",
        "itl_seconds": 0.0,
        "prefix_hash": "",
        "stream": 0,
    }
    return fill_row(row)  # engine spans carry no answer scores: not evaluated
