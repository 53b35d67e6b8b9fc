"""`fleetscope up --gateway` and `fleetscope fleet gateway-config`: the spec `up` starts behind the
gateway asked for, refusals in words, and the configuration a user copies for their own gateway."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from fleet.spec import load_spec
from fleetscope.cli import app
from fleetscope.up import derived_spec

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_up_behind_a_gateway_starts_the_spec_with_that_gateway(tmp_path: Path) -> None:
    for kind in ("litellm", "envoy", "vllm-router", "fleetscope"):
        path = derived_spec(ROOT / "fleet.yaml", tmp_path / f"{kind}.yaml", fleet="vllm", replicas=None, gateway=kind)
        spec = load_spec(path, base_dir=ROOT)
        assert spec.gateway is not None and spec.gateway.kind == kind
        # the model router stays where the gateway can run it (fleetscope's own, LiteLLM's hook)
        assert (spec.gateway.model_router is not None) == (kind in ("litellm", "fleetscope"))
        assert [r.name for r in spec.replicas] == ["small-0", "small-1", "large-0"]
    assert derived_spec(ROOT / "fleet.yaml", tmp_path / "x.yaml", fleet="vllm", replicas=None) == ROOT / "fleet.yaml"


def test_an_unknown_gateway_is_refused_with_the_choices() -> None:
    result = runner.invoke(app, ["up", "--gateway", "nginx"])
    assert result.exit_code == 2
    assert "--gateway must be one of fleetscope, litellm, vllm-router, envoy, not 'nginx'" in result.output


def test_gateway_config_prints_what_up_would_run(tmp_path: Path) -> None:
    result = runner.invoke(app, ["fleet", "gateway-config", "envoy", "--spec", str(ROOT / "fleet.yaml")])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.output)
    routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"
    ]["virtual_hosts"][0]["routes"]
    assert [r["name"] for r in routes] == ["tiny-large", "tiny-small", "no-model"]
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    ports = [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for e in clusters["tiny-small"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]
    assert ports == [8101, 8102]  # the spec's small replicas
    result = runner.invoke(app, ["fleet", "gateway-config", "litellm", "--spec", str(ROOT / "fleet.yaml")])
    litellm = yaml.safe_load(result.output)
    groups = [(m["model_name"], m["model_info"]["id"]) for m in litellm["model_list"]]
    assert ("tiny-large", "large-0") in groups and ("auto", "auto/small-0") in groups
    assert litellm["litellm_settings"]["callbacks"][0] == "fleetscope_litellm.router"
    refused = runner.invoke(app, ["fleet", "gateway-config", "vllm-router", "--spec", str(ROOT / "fleet.yaml")])
    assert refused.exit_code == 2 and "takes its workers as flags" in refused.output
