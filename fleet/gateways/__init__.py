"""Third-party gateways in front of the bundled fleet: LiteLLM, vllm-router and Envoy.

In:  a ``FleetSpec`` whose ``gateway.kind`` names one (``litellm``, ``vllm-router``, ``envoy``),
     the launcher's state directory, and where the collector listens (the base of the gateway's
     ``request_log_url``).
Out: ``gateway_plan(spec, state_dir)`` -> ``GatewayPlan``: the command and environment that run
     it (its configuration written into ``state_dir``), the URL to poll until it answers, its
     own ``/metrics`` (scraped as job ``gateway``, label ``gateway=<kind>``), the headers every
     client must send (LiteLLM's key), and how long its telemetry takes to leave it (the launcher
     waits that long before stopping it). Its telemetry goes to the collector: LiteLLM's otel
     spans to ``/v1/traces``, Envoy's access log to ``/v1/logs``; vllm-router has none.
     docs/gateways.md describes each, and the configuration to copy for a fleet of one's own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from fleet.errors import FleetError
from fleet.spec import FleetSpec

__all__ = ["KINDS", "GatewayError", "GatewayPlan", "client_headers", "collector_base", "gateway_plan", "metrics_url"]

KINDS = ("fleetscope", "litellm", "vllm-router", "envoy")


class GatewayError(FleetError, ValueError):
    """The spec cannot be served by the gateway asked for; the message says why."""


@dataclass(frozen=True)
class GatewayPlan:
    kind: str
    cmd: list[str]
    env: dict[str, str]
    health_url: str
    metrics_url: str | None
    client_headers: dict[str, str] = field(default_factory=dict)
    flush_s: float = 0.0  # how long its last telemetry takes to leave it
    files: tuple[Path, ...] = ()


def collector_base(spec: FleetSpec) -> str:
    """``http://host:port`` of the collector the gateway reports to (its ``request_log_url``'s, else
    the engines' OTLP endpoint's)."""
    assert spec.gateway is not None
    url = spec.gateway.request_log_url or spec.otlp_traces_endpoint or "http://127.0.0.1:4318"
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def third_party(spec: FleetSpec) -> str | None:
    """The kind of the spec's third-party gateway, or None (none, or fleetscope's own)."""
    gw = spec.gateway
    return gw.kind if gw is not None and gw.enabled and gw.kind != "fleetscope" else None


def metrics_url(spec: FleetSpec) -> str | None:
    """The third-party gateway's own ``/metrics`` (None: none, or fleetscope's own gateway)."""
    kind = third_party(spec)
    if kind is None:
        return None
    assert spec.gateway is not None
    if kind == "litellm":
        return f"http://{spec.host}:{spec.gateway.port}/metrics/"
    port = spec.gateway.metrics_port_or_default()
    return f"http://{spec.host}:{port}/stats/prometheus" if kind == "envoy" else f"http://{spec.host}:{port}/metrics"


def client_headers(spec: FleetSpec) -> dict[str, str]:
    """What every client of the spec's gateway sends besides the request (LiteLLM's key)."""
    if third_party(spec) == "litellm":
        assert spec.gateway is not None
        return {"Authorization": f"Bearer {spec.gateway.litellm_master_key}"}
    return {}


def gateway_plan(spec: FleetSpec, state_dir: Path) -> GatewayPlan:
    """How to run the spec's third-party gateway (``gateway.kind``)."""
    if spec.gateway is None or spec.gateway.kind == "fleetscope":
        raise GatewayError("the spec's gateway is fleetscope's own (fleet.gateway), not a third-party one")
    state_dir.mkdir(parents=True, exist_ok=True)
    kind = spec.gateway.kind
    if kind == "litellm":
        from fleet.gateways.litellm import plan
    elif kind == "vllm-router":
        from fleet.gateways.vllm_router import plan
    elif kind == "envoy":
        from fleet.gateways.envoy import plan
    else:
        raise GatewayError(f"unknown gateway kind {kind!r}; one of {', '.join(KINDS)}")
    return plan(spec, state_dir)
