"""LiteLLM's proxy (``litellm[proxy]==1.106.2``, in its own virtualenv ``.venv-litellm``) in front of the fleet.

In:  the fleet spec: its replicas, the names they serve, ``gateway`` (port, policy, model router,
     master key) and the collector's address.
Out: a ``GatewayPlan`` running ``litellm --config <state>/litellm.yaml``. The configuration (``config``):
     - one deployment per replica (``openai/<model>`` at the replica's ``/v1``: LiteLLM's
       OpenAI-compatible route, which passes token-id prompts through; its id the replica's name)
       under each name it serves;
     - the spec's model router as a LiteLLM pre-call hook (``fleet/gateways/litellm_callbacks.py``,
       copied beside the configuration as ``fleetscope_litellm.py``): a request for ``auto`` goes to
       the small or the large model by the router's rules, and the decision is recorded in the
       request's ``metadata.spend_logs_metadata`` (``fleetscope_route``, ``fleetscope_route_reason``:
       LiteLLM strips a ``routing_decision`` a hook sets);
     - the tenant is the ``x-tenant`` header (``general_settings.user_header_mappings``: LiteLLM's
       end user), so no virtual keys or database are needed;
     - the request rows: StandardLoggingPayload records posted to the collector's ``/v1/litellm``
       every second by fleetscope's callback in the same module (LiteLLM's own ``generic_api``
       callback posts the same records, but 1.106.2 loses those that finish while a batch is in
       flight); its ``otel`` callback only
       forwards the client's ``traceparent`` to the engine (so the engine's span joins the row;
       LiteLLM forwards it only with that callback on): its spans go to the collector marked
       ``fleetscope.request_rows=off`` (1.106.2's span has no token counts for a non-streamed
       text completion) and make no row; message text is not logged;
     - the ``prometheus`` callback's ``/metrics/`` is open (``require_auth_for_metrics_endpoint:
       false``; it listens on the fleet's host) with the end user as a label.
Every client sends ``Authorization: Bearer <gateway.litellm_master_key>`` (``client_headers``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from fleet.gateways import GatewayError, GatewayPlan, client_headers, collector_base, metrics_url
from fleet.spec import FleetSpec

__all__ = ["ROUTING", "config", "plan", "venv"]

ROOT = Path(__file__).resolve().parent.parent.parent
VERSION = "1.106.2"
# fleetscope's policy names -> LiteLLM's routing strategies (it has no round robin)
ROUTING = {"round_robin": "simple-shuffle", "least_loaded": "least-busy", "affinity": "simple-shuffle"}


def venv() -> Path:
    """LiteLLM's own virtualenv: ``$FLEETSCOPE_LITELLM_VENV``, else ``.venv-litellm`` in the project."""
    return Path(os.environ.get("FLEETSCOPE_LITELLM_VENV", ROOT / ".venv-litellm"))


def _deployment(spec: FleetSpec, group: str, replica: Any, model: str, **extra: Any) -> dict[str, Any]:
    info = {"id": extra.pop("id", replica.name)}
    if "max_input_tokens" in extra:
        info["max_input_tokens"] = extra.pop("max_input_tokens")
    return {
        "model_name": group,
        "litellm_params": {
            # openai/: the OpenAI-compatible route, which passes token-id prompts through (hosted_vllm/ refuses them)
            "model": f"openai/{model}",
            "api_base": f"{spec.url(replica)}/v1",
            "api_key": "none",
            **extra,
        },
        "model_info": info,
    }


def config(spec: FleetSpec) -> dict[str, Any]:
    """LiteLLM's proxy configuration for the spec (a dict: ``yaml.safe_dump`` writes it)."""
    gw = spec.gateway
    assert gw is not None
    models: list[dict[str, Any]] = []
    for r in spec.replicas:
        for name in (r.model, *r.adapters):
            models.append(_deployment(spec, name, r, name, id=r.name if name == r.model else f"{r.name}/{name}"))
    callbacks = ["fleetscope_litellm.requests", "otel", "prometheus"]  # the module beside the configuration
    if gw.model_router is not None:
        callbacks.insert(0, "fleetscope_litellm.router")
        # the group clients ask for; the hook sends each request on to the small or the large model
        models.extend(
            _deployment(spec, gw.auto_model, r, r.model, id=f"{gw.auto_model}/{r.name}")
            for r in spec.replicas
            if r.model == gw.model_router.small_model
        )
    return {
        "model_list": models,
        "router_settings": {"routing_strategy": ROUTING[gw.policy]},
        "litellm_settings": {
            "callbacks": callbacks,
            "forward_traceparent_to_llm_provider": True,
            "require_auth_for_metrics_endpoint": False,
            "enable_end_user_cost_tracking_prometheus_only": True,
            "turn_off_message_logging": True,
            "num_retries": 0,  # a failed request is the engine's answer, as behind fleetscope's gateway
        },
        "general_settings": {
            "master_key": "os.environ/LITELLM_MASTER_KEY",
            "user_header_mappings": [{"header_name": "x-tenant", "litellm_user_role": "customer"}],
        },
    }


def plan(spec: FleetSpec, state_dir: Path) -> GatewayPlan:
    gw = spec.gateway
    assert gw is not None
    if gw.model_router is not None and gw.model_router.large_tenants:
        raise GatewayError("LiteLLM has no per-tenant route to the large model: remove model_router.large_tenants")
    command = venv() / "bin" / "litellm"
    if not command.exists():
        raise GatewayError(
            f"LiteLLM's proxy is not installed at {command}: `make install` makes its virtualenv "
            "(fleet/gateways/litellm-requirements.txt), or set FLEETSCOPE_LITELLM_VENV"
        )
    path = state_dir / "litellm.yaml"
    hook = state_dir / "fleetscope_litellm.py"
    hook.write_text((Path(__file__).with_name("litellm_callbacks.py")).read_text())
    path.write_text(
        f"# written by fleetscope (fleet/gateways/litellm.py) for `up --gateway litellm`, LiteLLM {VERSION}\n"
        + yaml.safe_dump(config(spec), sort_keys=False)
    )
    base = f"http://{spec.host}:{gw.port}"
    env = {
        "LITELLM_MASTER_KEY": gw.litellm_master_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # offline: no cost map download
        "OTEL_EXPORTER": "otlp_http",
        "OTEL_ENDPOINT": f"{collector_base(spec)}/v1/traces",
        "OTEL_SERVICE_NAME": "litellm",
        "OTEL_RESOURCE_ATTRIBUTES": "fleetscope.request_rows=off",  # the rows come from the records
        "OTEL_BSP_SCHEDULE_DELAY": "1000",  # spans leave within a second
        "FLEETSCOPE_REQUESTS_URL": f"{collector_base(spec)}/v1/litellm",
        "DISABLE_SCHEMA_UPDATE": "True",
        "NO_DOCS": "True",
    }
    if gw.model_router is not None:
        r = gw.model_router
        env["FLEETSCOPE_AUTO_MODEL"] = gw.auto_model
        env["FLEETSCOPE_ROUTER"] = json.dumps(
            {
                "small_model": r.small_model,
                "large_model": r.large_model,
                "long_prompt_tokens": r.long_prompt_tokens,
                "high_max_tokens": r.high_max_tokens,
            }
        )
    return GatewayPlan(
        kind="litellm",
        cmd=[str(command), "--config", str(path), "--host", spec.host, "--port", str(gw.port), "--num_workers", "1"],
        env=env,
        health_url=f"{base}/health/liveliness",
        metrics_url=metrics_url(spec),
        client_headers=client_headers(spec),
        flush_s=2.5,
        files=(path, hook),
    )
