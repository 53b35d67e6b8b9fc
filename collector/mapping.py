"""Request telemetry from any gateway: a record's attributes -> a ``requests`` row, by a mapping.

In:  a ``Record``: the flat attributes of one request as a gateway reported it — an OTLP span
     (GenAI conventions, both attribute generations; LiteLLM's ``litellm_request``), an OTLP log
     record (Envoy's access log) or a LiteLLM ``StandardLoggingPayload`` (its ``generic_api``
     callback) — with the carrier's own fields under reserved keys (``span.name``,
     ``span.start_time``, ``span.end_time``, ``span.trace_id``, ``span.status``; ``log.time``,
     ``log.trace_id``, ``log.body``; ``resource.<key>``, ``scope.name``), and the mappings in
     order (the user's ``collector.request_mappings``, then ``DEFAULT_MAPPINGS``).
Out: ``map_record``: the row (``source = 'gateway'``, ``gateway`` = the mapping's name) of the
     first mapping whose ``match`` holds, ``None`` when none matches (an unknown shape: the caller
     counts it), or ``MappingError`` when a mapping matched but the record cannot make a row (no
     model, a token count that is no count, a time that is no time): counted and reported, never
     stored. A field's keys are tried in order; the first one present and usable wins.

The serving backend (``replica``: a URL or ``host:port``) is left as the gateway gave it; the
collector resolves it to a replica name through its scrape targets (``Backends``).
docs/gateways.md describes every field and the shipped mappings.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from collector.errors import CollectorError
from common.config import Section

__all__ = [
    "DEFAULT_MAPPINGS",
    "Backends",
    "Carrier",
    "KeySpec",
    "MappingError",
    "Record",
    "RequestMapping",
    "flatten",
    "map_record",
    "trace_id_of",
]

Carrier = Literal["span", "log", "litellm"]
Unit = Literal["auto", "s", "ms", "us", "ns"]
_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
MAX_TOKENS = 2**32 - 1  # the columns are UInt32
MAX_TEXT = 512  # longer ids and names are cut, a longer model name refused (no garbage as a pool)
# 2001-09-09 .. 2286-11-20 as epoch seconds: a request time outside it is no request time
_EARLIEST, _LATEST = 1e9, 1e10


class MappingError(CollectorError, ValueError):
    """A record a mapping matched but cannot make a row of; the message says why."""


class KeySpec(Section):
    """One place a field may come from: an attribute key, and the unit of a time or duration."""

    key: str = Field(min_length=1)
    unit: Unit = "auto"
    port: str | None = Field(default=None, description="an attribute holding the port, joined as host:port")
    strip: str | None = Field(
        default=None,
        description="an attribute naming a provider: a model's 'provider/' prefix is cut (hosted_vllm/tiny-small)",
    )


Keys = list[KeySpec]


def _keys(value: Any) -> Any:
    # a field may list plain keys ("gen_ai.usage.input_tokens") or {key, unit} objects
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        return [{"key": v} if isinstance(v, str) else v for v in value]
    return value


class RequestMapping(Section):
    """Which attribute of a gateway's record is which column of a request row."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,39}$", description="stored in requests.gateway")
    carriers: list[Carrier] = Field(default=["span", "log", "litellm"], min_length=1)
    match: dict[str, str] = Field(
        default_factory=dict, description="attribute -> value every record must have ('*': present)"
    )
    model: Keys = Field(default_factory=list)
    tenant: Keys = Field(default_factory=list)
    route: Keys = Field(default_factory=list)
    route_reason: Keys = Field(default_factory=list)
    replica: Keys = Field(default_factory=list, description="the serving backend: URL, host:port or replica name")
    request_id: Keys = Field(default_factory=list)
    trace_id: Keys = Field(default_factory=list, description="32 hex digits, 16 bytes or a W3C traceparent")
    session: Keys = Field(default_factory=list)
    status_code: Keys = Field(default_factory=list)
    finish_reason: Keys = Field(default_factory=list)
    error: Keys = Field(default_factory=list)
    prompt_tokens: Keys = Field(default_factory=list)
    completion_tokens: Keys = Field(default_factory=list)
    cached_tokens: Keys = Field(default_factory=list)
    max_tokens: Keys = Field(default_factory=list)
    stream: Keys = Field(default_factory=list)
    start_time: Keys = Field(default_factory=list, description="epoch (unit auto: s, ms, us or ns) or ISO 8601")
    end_time: Keys = Field(default_factory=list)
    first_token_time: Keys = Field(default_factory=list)
    ttft_seconds: Keys = Field(default_factory=list, description="a duration (unit: s unless given)")
    e2e_seconds: Keys = Field(default_factory=list)
    queue_seconds: Keys = Field(default_factory=list)

    _fields = field_validator(
        "model",
        "tenant",
        "route",
        "route_reason",
        "replica",
        "request_id",
        "trace_id",
        "session",
        "status_code",
        "finish_reason",
        "error",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "max_tokens",
        "stream",
        "start_time",
        "end_time",
        "first_token_time",
        "ttft_seconds",
        "e2e_seconds",
        "queue_seconds",
        mode="before",
    )(_keys)

    def matches(self, carrier: Carrier, attrs: Mapping[str, Any]) -> bool:
        if carrier not in self.carriers:
            return False
        for key, want in self.match.items():
            if attrs.get(key) in (None, "", "-"):  # "-": Envoy's word for a value it does not have
                return False
            if want != "*" and _text(attrs[key]) != want:
                return False
        return True


@dataclass(frozen=True)
class Record:
    """One request as a gateway reported it: where from, and its flat attributes."""

    carrier: Carrier
    attrs: Mapping[str, Any]


def flatten(value: Any, prefix: str = "", out: dict[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:
    """A JSON object as dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``). A list is kept as a
    value, and its first 8 objects are also flattened under ``key.0``, ``key.1`` ...; nothing
    deeper than 8 levels is read."""
    out = {} if out is None else out
    if depth > 8 or not isinstance(value, Mapping):
        return out
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping):
            flatten(item, f"{name}.", out, depth + 1)
            continue
        out[name] = item
        if isinstance(item, list):
            for i, element in enumerate(item[:8]):
                flatten(element, f"{name}.{i}.", out, depth + 1)
    return out


# ---------------------------------------------------------------- values


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else ""  # no id or name is a 31-digit number
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else str(value)
    if isinstance(value, list) and value and not isinstance(value[0], list | dict):
        return _text(value[0])  # e.g. gen_ai.response.finish_reasons: the first
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return ""


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool):
        raise MappingError(f"{field}: expected a number, got a boolean")
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:
            raise MappingError(f"{field}: {str(value)[:40]}... is not a finite number") from None
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise MappingError(f"{field}: expected a number, got {value[:40]!r}") from None
    else:
        raise MappingError(f"{field}: expected a number, got {type(value).__name__}")
    if not math.isfinite(number):
        raise MappingError(f"{field}: {value!r} is not a finite number")
    return number


def _count(value: Any, field: str) -> int:
    number = _number(value, field)
    if number < 0 or number > MAX_TOKENS or not number.is_integer():
        raise MappingError(f"{field}: {value!r} is not a count (a whole number 0..{MAX_TOKENS})")
    return int(number)


def _epoch(value: Any, unit: Unit, field: str) -> float:
    """Epoch seconds of a time: a number in ``unit`` (auto: by magnitude) or ISO 8601 text."""
    if isinstance(value, str) and not _looks_numeric(value):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise MappingError(f"{field}: {value[:40]!r} is neither an epoch nor an ISO 8601 time") from None
        if parsed.tzinfo is None:
            raise MappingError(f"{field}: {value[:40]!r} has no time zone")
        seconds = parsed.timestamp()
    else:
        number = _number(value, field)
        if unit == "auto":
            magnitude = abs(number)
            scale = 1e-9 if magnitude >= 1e17 else 1e-6 if magnitude >= 1e14 else 1e-3 if magnitude >= 1e11 else 1.0
        else:
            scale = _SCALE[unit]
        seconds = number * scale
    if not _EARLIEST <= seconds <= _LATEST:
        raise MappingError(f"{field}: {value!r} is not a plausible request time")
    return seconds


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _seconds(value: Any, unit: Unit, field: str) -> float:
    number = _number(value, field) * _SCALE["s" if unit == "auto" else unit]
    if number < 0 or number > 86_400:
        raise MappingError(f"{field}: {value!r} is not a duration (0 .. 1 day)")
    return number


def trace_id_of(value: Any) -> str:
    """32 lower-case hex digits from a hex id, 16 bytes or a W3C ``traceparent``; '' if none."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex() if len(value) == 16 and any(value) else ""
    if not isinstance(value, str):
        return ""
    text = value.strip().lower()
    if _HEX32.match(text):
        return text if text != "0" * 32 else ""
    found = _TRACEPARENT.match(text)
    if found and found.group(1) != "0" * 32:
        return found.group(1)
    return ""


def _first(attrs: Mapping[str, Any], keys: Iterable[KeySpec]) -> tuple[Any, KeySpec] | None:
    for spec in keys:
        value = attrs.get(spec.key)
        if value is None or value == "" or value == "-":  # "-": Envoy's word for a missing operator value
            continue
        return value, spec
    return None


def _pick_text(attrs: Mapping[str, Any], keys: Keys) -> str:
    for spec in keys:
        text = _text(attrs.get(spec.key))
        if text and text != "-":
            if spec.strip:
                # the provider's name, or a provider named after it (text-completion-openai: openai/)
                provider = _text(attrs.get(spec.strip))
                head = text.split("/", 1)[0]
                if provider and "/" in text and head and head in provider:
                    text = text[len(head) + 1 :]
            return text[:MAX_TEXT]
    return ""


def _backend(attrs: Mapping[str, Any], keys: Keys) -> str:
    """The serving backend as given, with its port attribute joined (``server.address`` +
    ``server.port`` -> ``host:port``)."""
    for spec in keys:
        text = _text(attrs.get(spec.key))
        if not text or text == "-":
            continue
        port = _text(attrs.get(spec.port)) if spec.port else ""
        if port and ":" not in text.rsplit("]", 1)[-1]:
            text = f"{text}:{port}"
        return text[:MAX_TEXT]
    return ""


# ---------------------------------------------------------------- rows


def map_record(record: Record, mappings: Iterable[RequestMapping]) -> dict[str, Any] | None:
    """The request row of ``record`` by the first mapping that matches; None if none does."""
    for mapping in mappings:
        if mapping.matches(record.carrier, record.attrs):
            return _row(mapping, record.attrs)
    return None


def _count_at(a: Mapping[str, Any], keys: Keys, field: str) -> int:
    found = _first(a, keys)
    return _count(found[0], field) if found else 0


def _epoch_at(a: Mapping[str, Any], keys: Keys, field: str) -> float | None:
    found = _first(a, keys)
    return _epoch(found[0], found[1].unit, field) if found else None


def _seconds_at(a: Mapping[str, Any], keys: Keys, field: str) -> float | None:
    found = _first(a, keys)
    return _seconds(found[0], found[1].unit, field) if found else None


def _when(m: RequestMapping, a: Mapping[str, Any]) -> tuple[float, float | None, float | None]:
    """The request's start (epoch seconds), its end-to-end time and its TTFT (None where neither is
    given nor follows from the times given)."""
    start, end, first = (
        _epoch_at(a, m.start_time, "start_time"),
        _epoch_at(a, m.end_time, "end_time"),
        _epoch_at(a, m.first_token_time, "first_token_time"),
    )
    e2e = _seconds_at(a, m.e2e_seconds, "e2e_seconds")
    ttft = _seconds_at(a, m.ttft_seconds, "ttft_seconds")
    if e2e is None and start is not None and end is not None:
        e2e = max(0.0, end - start)
    if start is None and end is not None:
        start = end - (e2e or 0.0)
    if start is None:
        raise MappingError(f"{m.name}: no request time ({', '.join(k.key for k in m.start_time + m.end_time)})")
    if ttft is None and first is not None:
        ttft = max(0.0, first - start)
    return start, e2e, ttft


def _row(m: RequestMapping, a: Mapping[str, Any]) -> dict[str, Any]:
    model = _pick_text(a, m.model)
    if not model:
        raise MappingError(f"{m.name}: no model ({', '.join(k.key for k in m.model) or 'no model keys mapped'})")
    if len(model) >= MAX_TEXT or not model.isprintable():
        raise MappingError(f"{m.name}: {model[:40]!r} is not a model name")
    start, e2e, ttft = _when(m, a)
    status_found = _first(a, m.status_code)
    status = _count(status_found[0], "status_code") if status_found else 200
    aborted = status == 0  # Envoy's %RESPONSE_CODE% when the client went away before an answer
    if aborted:
        status = 499
    if not 100 <= status <= 599:
        raise MappingError(f"status_code: {status} is not an HTTP status")
    if (_text(a.get("span.status")) == "error" or _text(a.get("status")) == "failure") and status < 400:
        status = 500  # an error span, or a LiteLLM record of a failure without an HTTP code
    if status >= 400:
        ttft = None  # a failed request sent no token (LiteLLM writes its end as the first token's time)
    trace = ""
    for spec in m.trace_id:
        trace = trace_id_of(a.get(spec.key))
        if trace:
            break
    completion = _count_at(a, m.completion_tokens, "completion_tokens")
    e2e_s, ttft_s = e2e or 0.0, min(ttft or 0.0, e2e or ttft or 0.0)
    decode = max(0.0, e2e_s - ttft_s) if ttft_s else 0.0
    stream_found = _first(a, m.stream)
    return {
        "ts": start,
        "source": "gateway",
        "gateway": m.name,
        "request_id": _pick_text(a, m.request_id),
        "trace_id": trace,
        "replica": _backend(a, m.replica),
        "model": model,
        "tenant": _pick_text(a, m.tenant),
        "route": _pick_text(a, m.route),
        "status_code": status,
        "finish_reason": _pick_text(a, m.finish_reason),
        "prompt_tokens": _count_at(a, m.prompt_tokens, "prompt_tokens"),
        "completion_tokens": completion,
        "cached_tokens": _count_at(a, m.cached_tokens, "cached_tokens"),
        "max_tokens": _count_at(a, m.max_tokens, "max_tokens"),
        "ttft_seconds": ttft_s,
        "e2e_seconds": e2e_s,
        "queue_seconds": _seconds_at(a, m.queue_seconds, "queue_seconds") or 0.0,
        "prefill_seconds": 0.0,
        "decode_seconds": decode,
        "tpot_seconds": decode / (completion - 1) if completion > 1 and decode else 0.0,
        "session": _pick_text(a, m.session),
        "route_reason": _pick_text(a, m.route_reason),
        "outcome": "client_abort" if aborted else "ok" if status < 400 else "upstream_error",
        "error": _pick_text(a, m.error)[:2000],
        "itl_seconds": 0.0,
        "prefix_hash": "",
        "stream": 1 if stream_found and _text(stream_found[0]) in ("true", "1", "True") else 0,
    }


# ---------------------------------------------------------------- backends -> replicas


class Backends:
    """A gateway's backend (``http://127.0.0.1:8101/v1``, ``127.0.0.1:8101``, a replica name) ->
    (replica, model) by the scrape targets' ``instance`` and labels; unknown backends keep their
    ``host:port`` and the row's own model."""

    def __init__(self) -> None:
        self._by_address: dict[str, tuple[str, str]] = {}
        self._by_host: dict[str, list[tuple[str, str]]] = {}

    def update(self, targets: Iterable[tuple[str, str, str]]) -> None:
        """From (instance ``host:port``, replica, model) of the targets that name a replica."""
        by_address: dict[str, tuple[str, str]] = {}
        by_host: dict[str, list[tuple[str, str]]] = {}
        for instance, replica, model in targets:
            address = _address(instance)
            by_address[address] = (replica, model)
            by_address[replica] = (replica, model)
            by_host.setdefault(address.rsplit(":", 1)[0], []).append((replica, model))
        self._by_address, self._by_host = by_address, by_host

    def resolve(self, backend: str) -> tuple[str, str]:
        """(replica, model): the target's, or (the backend as ``host:port``, '') when none is known."""
        if not backend:
            return "", ""
        address = _address(backend)
        found = self._by_address.get(address)
        if found:
            return found
        if ":" not in address:  # a host without a port (e.g. server.address): its only replica
            candidates = self._by_host.get(address, [])
            if len(candidates) == 1:
                return candidates[0]
        return address, ""


def _address(backend: str) -> str:
    text = backend.strip()
    if "://" in text:
        try:
            parts = urlsplit(text)
            host, port = parts.hostname or "", parts.port
        except ValueError:  # a port out of range, a broken IPv6 literal: kept as given
            return text.split("://", 1)[1].split("/", 1)[0].lower()
        if port is None:
            port = 443 if parts.scheme == "https" else 80
        text = f"{host}:{port}"
    text = text.split("/", 1)[0]
    if text.startswith("localhost"):
        text = "127.0.0.1" + text[len("localhost") :]
    return text.lower()


# ---------------------------------------------------------------- shipped mappings

_GENAI_COMMON: dict[str, Any] = {
    "model": ["gen_ai.response.model", "gen_ai.request.model"],
    "prompt_tokens": ["gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"],
    "completion_tokens": ["gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"],
    "cached_tokens": ["gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens"],
    "max_tokens": ["gen_ai.request.max_tokens"],
    "finish_reason": ["gen_ai.response.finish_reasons", "gen_ai.response.finish_reason"],
    "request_id": ["gen_ai.response.id", "gen_ai.request.id"],
    "tenant": ["tenant", "user.id", "enduser.id", "gen_ai.request.user"],
    "replica": [{"key": "server.address", "port": "server.port"}],
    "status_code": ["http.response.status_code", "http.status_code"],
    "error": ["error.type"],
    "trace_id": ["span.trace_id", "log.trace_id", "traceparent"],
    "start_time": ["span.start_time", "log.time"],
    "end_time": ["span.end_time"],
}

# a LiteLLM request's tenant: its team (virtual keys), else the end user (the x-litellm-end-user-id
# header, a header named by general_settings.user_header_mappings, or the body's user)
_LITELLM_TENANT = [
    "metadata.user_api_key_team_alias",
    "metadata.user_api_key_team_id",
    "metadata.user_api_key_end_user_id",
    "llm.user",
]

# a router's decision recorded in the request's spend_logs_metadata (fleetscope's LiteLLM hook,
# fleet/gateways/litellm_callbacks.py, writes these), else LiteLLM's own auto-router provenance
_LITELLM_ROUTE = ["metadata.spend_logs_metadata.fleetscope_route"]
_LITELLM_REASON = [
    "metadata.spend_logs_metadata.fleetscope_route_reason",
    "metadata.routing_decision.signals",
    "metadata.routing_decision.cause",
]

DEFAULT_MAPPINGS: tuple[RequestMapping, ...] = (
    RequestMapping.model_validate(
        {
            # LiteLLM proxy's otel callback (1.106): its litellm_request span; JSON and Python-literal
            # attribute strings (hidden_params, metadata.usage_object) arrive expanded (collector.records)
            "name": "litellm",
            "carriers": ["span"],
            "match": {"span.name": "litellm_request"},
            **_GENAI_COMMON,
            "model": ["gen_ai.request.model", "gen_ai.response.model"],  # the deployment's model
            "tenant": _LITELLM_TENANT,
            "route": _LITELLM_ROUTE + ["litellm.model_group", "metadata.model_group"],
            "route_reason": _LITELLM_REASON,
            "replica": ["hidden_params.api_base"],
            "request_id": ["litellm.call_id", "gen_ai.response.id"],
            "cached_tokens": ["metadata.usage_object.prompt_tokens_details.cached_tokens"],
            "status_code": ["http.response.status_code", "error.code"],
            "error": ["error.message"],
        }
    ),
    RequestMapping.model_validate(
        {
            # LiteLLM proxy's generic_api callback: StandardLoggingPayload records (POST /v1/litellm)
            "name": "litellm",
            "carriers": ["litellm"],
            "model": [{"key": "model", "strip": "custom_llm_provider"}, "hidden_params.litellm_model_name"],
            "tenant": ["end_user", *_LITELLM_TENANT],
            "route": _LITELLM_ROUTE + ["model_group"],
            "route_reason": _LITELLM_REASON,
            "replica": ["api_base", "hidden_params.api_base"],
            "request_id": ["litellm_call_id", "id"],
            "trace_id": ["trace_id", "metadata.requester_metadata.trace_id"],
            "prompt_tokens": ["prompt_tokens"],
            "completion_tokens": ["completion_tokens"],
            "cached_tokens": ["metadata.usage_object.prompt_tokens_details.cached_tokens"],
            "max_tokens": ["model_parameters.max_tokens", "model_parameters.max_completion_tokens"],
            "status_code": ["error_information.error_code"],
            "error": ["error_str", "error_information.error_message"],
            "start_time": ["startTime"],
            "end_time": ["endTime"],
            "first_token_time": ["completionStartTime"],
            "stream": ["stream"],
        }
    ),
    RequestMapping.model_validate(
        {
            # Envoy's OpenTelemetry access logger (its built-in resource label log_name) with the
            # attributes of the shipped snippet (fleet/gateways/envoy.py, docs/gateways.md): every
            # value arrives as a string, "-" when Envoy has none
            "name": "envoy",
            "carriers": ["log"],
            "match": {"resource.log_name": "*", "gen_ai.request.model": "*"},
            **_GENAI_COMMON,
            "replica": ["upstream.host", {"key": "server.address", "port": "server.port"}],
            "route": ["route_name"],
            "request_id": ["x_request_id", "x-request-id"],
            "e2e_seconds": [{"key": "duration_ms", "unit": "ms"}],
            "start_time": ["log.time", "start_time"],
        }
    ),
    RequestMapping.model_validate(
        {"name": "genai", "carriers": ["span", "log"], "match": {"gen_ai.request.model": "*"}, **_GENAI_COMMON}
    ),
    RequestMapping.model_validate(
        {"name": "genai", "carriers": ["span", "log"], "match": {"gen_ai.operation.name": "*"}, **_GENAI_COMMON}
    ),
)
