"""Prometheus remote-write 1.0 messages (``prometheus.WriteRequest``), built without ``protoc``.

In:  nothing (the message layout of prometheus/prompb ``remote.proto`` and ``types.proto``, as
     field numbers below).
Out: message classes: ``WriteRequest`` (labels decoded, for checks and tests), ``RawWriteRequest``
     (the same bytes, each series' labels kept as their encoded bytes: a tuple of them is the
     key of a series the receiver has seen, so a known series costs no label decoding), ``Label``.

The raw form is wire-compatible: a length-delimited ``Label`` message and a ``bytes`` field are
encoded alike. Native histograms (``TimeSeries.histograms``, field 4) and exemplars are read as
bytes and only counted: fleetscope stores classic histograms' ``_bucket`` series.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["Label", "RawWriteRequest", "WriteRequest", "metric_types"]

_F: Any = descriptor_pb2.FieldDescriptorProto
_PACKAGE = "fleetscope.prompb"
# MetricMetadata.MetricType, by number
_TYPES = ("unknown", "counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset")


def _field(name: str, number: int, kind: int, *, repeated: bool = False, message: str = "") -> Any:
    field = _F(name=name, number=number, type=kind, label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if message:
        field.type_name = f".{_PACKAGE}.{message}"
    return field


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(name="fleetscope_prompb.proto", package=_PACKAGE, syntax="proto3")

    def message(name: str, *fields: Any) -> None:
        file.message_type.add(name=name).field.extend(fields)

    message("Label", _field("name", 1, _F.TYPE_STRING), _field("value", 2, _F.TYPE_STRING))
    message("Sample", _field("value", 1, _F.TYPE_DOUBLE), _field("timestamp", 2, _F.TYPE_INT64))
    message(
        "MetricMetadata",
        _field("type", 1, _F.TYPE_INT32),  # an enum on the wire is a varint
        _field("metric_family_name", 2, _F.TYPE_STRING),
        _field("help", 4, _F.TYPE_STRING),
        _field("unit", 5, _F.TYPE_STRING),
    )
    for prefix, labels in (("", (_F.TYPE_MESSAGE, "Label")), ("Raw", (_F.TYPE_BYTES, ""))):
        message(
            f"{prefix}TimeSeries",
            _field("labels", 1, labels[0], repeated=True, message=labels[1]),
            _field("samples", 2, _F.TYPE_MESSAGE, repeated=True, message="Sample"),
            _field("exemplars", 3, _F.TYPE_BYTES, repeated=True),
            _field("histograms", 4, _F.TYPE_BYTES, repeated=True),
        )
        message(
            f"{prefix}WriteRequest",
            _field("timeseries", 1, _F.TYPE_MESSAGE, repeated=True, message=f"{prefix}TimeSeries"),
            _field("metadata", 3, _F.TYPE_MESSAGE, repeated=True, message="MetricMetadata"),
        )
    return file


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
        for name in ("Label", "WriteRequest", "RawWriteRequest")
    }


_CLASSES = _classes()
Label: Any = _CLASSES["Label"]
WriteRequest: Any = _CLASSES["WriteRequest"]
RawWriteRequest: Any = _CLASSES["RawWriteRequest"]


def metric_types(message: Any) -> dict[str, str]:
    """A request's metadata: metric family name -> type (``counter``, ``gauge``, ``histogram`` ...)."""
    return {
        m.metric_family_name: _TYPES[m.type] if 0 <= m.type < len(_TYPES) else "unknown"
        for m in message.metadata
        if m.metric_family_name
    }
