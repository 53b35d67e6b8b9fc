"""OTLP protobuf bodies parsed by ClickHouse: the collector checks and counts, the store decodes.

In:  an OTLP ``ExportTraceServiceRequest`` body (protobuf bytes, HTTP or gRPC).
Out: ``check(body)``: (``llm_request`` spans, other spans): the body parsed by protobuf's C
     parser (upb) as a skeleton of the export (``SKELETON``: every level down to each span's own
     fields, the span's attributes, events, links and status kept as bytes), which refuses a
     body whose wire format is broken anywhere down to them (``OtlpError``) before anything is
     queued, and counts the spans (the ``llm_request`` ones on the bytes): a quarter of the full
     parse's cost (0.27 against 0.99 us a span of vLLM's). What is inside an attribute ClickHouse
     decodes; a body it cannot is set aside alone (``collector.writer``: a refused raw batch is
     split by body); ``prefix(body)``: the length that
     makes the body one length-delimited message of ClickHouse's ``Protobuf`` input format, for
     ``Writer.add_raw(TABLE, (prefix(body), body), ..., fmt=FORMAT, settings=settings_for(client))``. ClickHouse
     parses the bodies with ``otlp_trace.proto`` (the file for the in-process store; its text
     with the insert, ``format_schema_source = 'string'``, for a server) into ``otlp_exports``
     (Null engine), and
     ``otlp_exports_mv`` flattens the ``llm_request`` spans into ``requests`` rows
     (migrations/clickhouse/0010_otlp_exports.sql): the rows ``collector.otlp.request_columns``
     gives, without a Python object per attribute (tests/collector/test_otlp_native.py).
     ``supported(client)``: whether the store can take them (the setting and the table exist).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

from collector.otlp import REQUEST_SPAN, OtlpError
from storage.clickhouse import is_embedded

__all__ = ["FORMAT", "TABLE", "check", "framed", "prefix", "settings_for", "supported"]

TABLE = "otlp_exports"
_NAME_FIELD = b"\x2a" + bytes([len(REQUEST_SPAN)]) + REQUEST_SPAN.encode()
FORMAT = "Protobuf"  # length-delimited messages: several bodies make one insert
PROTO = Path(__file__).resolve().with_name("otlp_trace.proto")
MESSAGE = "ExportTraceServiceRequest"


def settings_for(client: Any) -> dict[str, str]:
    """The insert's schema settings: the in-process store reads the shipped file where it is; a
    server gets the schema's text with the insert (``format_schema_source = 'string'``)."""
    if is_embedded(client):
        return {"format_schema": f"{PROTO}:{MESSAGE}"}
    return {"format_schema_source": "string", "format_schema": PROTO.read_text(), "format_schema_message_name": MESSAGE}


_F = descriptor_pb2.FieldDescriptorProto
_BYTES, _MESSAGE, _ONE, _MANY = _F.TYPE_BYTES, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
# OTLP's ExportTraceServiceRequest with the field numbers and wire types of
# opentelemetry/proto/trace/v1/trace.proto; nested messages below a span's own fields are bytes
SKELETON = {
    "Export": [(1, "resource_spans", _MESSAGE, _MANY, "ResourceSpans")],
    "ResourceSpans": [
        (1, "resource", _BYTES, _ONE, ""),
        (2, "scope_spans", _MESSAGE, _MANY, "ScopeSpans"),
        (3, "schema_url", _F.TYPE_STRING, _ONE, ""),
    ],
    "ScopeSpans": [
        (1, "scope", _BYTES, _ONE, ""),
        (2, "spans", _MESSAGE, _MANY, "Span"),
        (3, "schema_url", _F.TYPE_STRING, _ONE, ""),
    ],
    "Span": [
        (1, "trace_id", _BYTES, _ONE, ""),
        (2, "span_id", _BYTES, _ONE, ""),
        (3, "trace_state", _BYTES, _ONE, ""),
        (4, "parent_span_id", _BYTES, _ONE, ""),
        (5, "name", _BYTES, _ONE, ""),
        (6, "kind", _F.TYPE_INT32, _ONE, ""),
        (7, "start_time_unix_nano", _F.TYPE_FIXED64, _ONE, ""),
        (8, "end_time_unix_nano", _F.TYPE_FIXED64, _ONE, ""),
        (9, "attributes", _BYTES, _MANY, ""),
        (10, "dropped_attributes_count", _F.TYPE_UINT32, _ONE, ""),
        (11, "events", _BYTES, _MANY, ""),
        (12, "dropped_events_count", _F.TYPE_UINT32, _ONE, ""),
        (13, "links", _BYTES, _MANY, ""),
        (14, "dropped_links_count", _F.TYPE_UINT32, _ONE, ""),
        (15, "status", _BYTES, _ONE, ""),
        (16, "flags", _F.TYPE_FIXED32, _ONE, ""),
    ],
}


def _skeleton() -> type[Message]:
    package = "fleetscope.otlp_skeleton"
    proto = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto3")
    for name, fields in SKELETON.items():
        message = proto.message_type.add(name=name)
        for number, field, kind, label, type_name in fields:
            added = message.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                added.type_name = f".{package}.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    export: type[Message] = message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Export"))
    return export


_Export = _skeleton()


def check(body: bytes) -> tuple[int, int]:
    """(``llm_request`` spans, other spans) of an export body; ``OtlpError`` if it is not one."""
    request: Any = _Export()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        said = str(exc).replace("fleetscope.otlp_skeleton.Export", "ExportTraceServiceRequest")
        raise OtlpError(f"not an OTLP protobuf ExportTraceServiceRequest: {said}") from None
    total = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    # a span named llm_request carries these 13 bytes (field 5, length 11, the name); counting them
    # costs a memchr where reading every span's name from the message costs ~2 us a span. Only a
    # string value holding exactly them could count twice: in this metric, never in the rows.
    llm = min(body.count(_NAME_FIELD), total)
    return llm, total - llm


def prefix(body: bytes) -> bytes:
    """``body``'s length as a varint: put before it, one message of the ``Protobuf`` format."""
    n, head = len(body), bytearray()
    while n > 0x7F:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head)


def framed(body: bytes) -> bytes:
    """``body`` preceded by its length: one message of the ``Protobuf`` format (a copy of the
    body; ``Writer.add_raw`` takes ``(prefix(body), body)`` and joins it with the batch)."""
    return prefix(body) + body


def supported(client: Any) -> bool:
    """Whether the store takes OTLP bodies: ``format_schema_source`` (ClickHouse 25.8+, chDB 4.4),
    the ``otlp_exports`` table and its view (migration 0010). False on any error (the Python path works
    everywhere)."""
    try:
        found = client.command(
            "SELECT (SELECT count() FROM system.settings WHERE name = 'format_schema_source') + "
            "(SELECT count() FROM system.tables WHERE database = currentDatabase() "
            f"AND name IN ('{TABLE}', '{TABLE}_mv'))"
        )
    except Exception:  # noqa: BLE001 - an unreachable or older store: decode in Python
        return False
    return int(found) == 3  # the setting, the landing table and its view (without it rows would vanish)
