"""vllm-router (the vLLM project's Rust router, PyPI ``vllm-router``) in front of the fleet.

In:  the fleet spec: its replicas (the router's workers) and ``gateway`` (port, policy, metrics port).
Out: a ``GatewayPlan``: ``vllm-router --worker-urls ... --policy ...`` on the gateway's port, its
     Prometheus metrics on ``metrics_port`` (``vllm_router_*``: requests, decisions, health and
     circuit breaker per worker). It logs no requests (no tenant, no tokens, no reason): the
     engines' own spans are the request log behind it. It sends any request to any worker (it
     does not route by model), so the replicas must serve one model.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from fleet.gateways import GatewayError, GatewayPlan, metrics_url
from fleet.spec import FleetSpec

__all__ = ["POLICIES", "plan"]

# fleetscope's policy names -> the router's
POLICIES = {"round_robin": "round_robin", "least_loaded": "power_of_two", "affinity": "consistent_hash"}


def binary() -> str:
    """The ``vllm-router`` command: beside this Python (the project's virtualenv), else on PATH."""
    here = Path(sys.executable).with_name("vllm-router")
    found = str(here) if here.exists() else shutil.which("vllm-router")
    if not found:
        raise GatewayError("vllm-router is not installed: `make install` installs it (the gateways extra)")
    return found


def plan(spec: FleetSpec, state_dir: Path) -> GatewayPlan:
    gw = spec.gateway
    assert gw is not None
    models = sorted({r.model for r in spec.replicas})
    adapters = " and LoRA adapters" if any(r.adapters for r in spec.replicas) else ""
    if len(models) > 1 or adapters:
        raise GatewayError(
            "vllm-router sends any request to any worker (it does not route by model), so its replicas must "
            f"serve one model; this spec's serve {', '.join(models)}{adapters}. "
            "Put LiteLLM or Envoy in front instead (--gateway litellm|envoy), or a spec of one model"
        )
    if gw.model_router is not None:
        raise GatewayError(
            "vllm-router has no model router (auto): remove gateway.model_router, or use --gateway litellm"
        )
    cmd = [
        binary(),
        "--worker-urls",
        *[spec.url(r) for r in spec.replicas],
        "--policy",
        POLICIES[gw.policy],
        "--host",
        spec.host,
        "--port",
        str(gw.port),
        "--prometheus-host",
        spec.host,
        "--prometheus-port",
        str(gw.metrics_port_or_default()),
        "--log-level",
        "warning",
        "--health-check-interval-secs",
        str(max(1, round(gw.health_interval_s))),
        "--worker-startup-check-interval",
        "1",
    ]
    return GatewayPlan(
        kind="vllm-router",
        cmd=cmd,
        env={},
        health_url=f"http://{spec.host}:{gw.port}/health",
        metrics_url=metrics_url(spec),
    )
