"""Every example in docs/queries/ runs, read-only, on a simulated incident and returns rows that
answer its question."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "docs" / "queries").glob("*.sql"))


def test_the_examples_answer_the_questions_users_ask() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "p99_ttft_by_model_per_hour",
        "kv_cache_above_90_for_10_minutes",
        "cost_per_1m_tokens_by_tenant_last_week",
        "long_context_share_per_day",
        "slower_than_slo_by_route",
        "top_prefix_hashes_by_tokens",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_each_example_returns_rows(incident, path: Path) -> None:
    result = incident.runner().run(path.read_text())
    assert result.rows, f"{path.name} returned no rows"
    frame = result.frame()
    if path.stem == "kv_cache_above_90_for_10_minutes":
        # the small replicas were saturated through the 15-minute rollout, the large one was not
        assert set(frame["replica"]) <= {"small-0", "small-1"} and (frame["minutes"] >= 10).all()
    if path.stem == "cost_per_1m_tokens_by_tenant_last_week":
        assert set(frame["tenant"]) == {"acme", "globex", "initech"} and (frame["usd_per_1m_tokens"] > 0).all()
    if path.stem == "long_context_share_per_day":
        assert 0 < frame["long_share_of_requests"].max() < 1
    if path.stem == "p99_ttft_by_model_per_hour":
        assert set(frame["model"]) == {"tiny-small", "tiny-large"}
