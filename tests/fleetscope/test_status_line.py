"""``fleetscope up``'s status line on a real chDB store: each request counted once, however many
request logs saw it; replicas up from the last scrapes; alerts firing from the metadata DB."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetscope.up_status import status_line
from migrations import clickhouse_runner
from tests.conftest import migrated_sessions


@pytest.fixture
def sessions(sqlite_url: str):
    yield from migrated_sessions(sqlite_url)


def test_a_request_seen_by_the_gateway_and_its_engine_counts_once(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    now = datetime.now(UTC).replace(microsecond=0)
    rows = [[now - timedelta(seconds=i), "tiny-small", source] for i in range(1, 31) for source in ("gateway", "otlp")]
    ch.insert("requests", rows, column_names=["ts", "model", "source"])
    ch.insert(
        "scrapes",
        [[now - timedelta(seconds=5), "vllm", f"127.0.0.1:{8101 + i}", f"small-{i}", i] for i in range(2)],
        column_names=["ts", "job", "instance", "replica", "up"],
    )
    line = status_line(ch, sessions, now=now)
    assert "replicas up 1/2" in line  # small-1 answered, small-0 did not
    assert "0.5 req/s" in line  # 30 requests in the last minute, not 60
    assert line.endswith("firing alerts 0") and "p99 TTFT (5 min) – " in line  # no histograms yet: a dash, not "nan"
    ch.command("TRUNCATE TABLE requests")
    ch.insert(
        "requests",
        [[now - timedelta(seconds=i), "tiny-small", "otlp"] for i in range(1, 13)],
        column_names=["ts", "model", "source"],
    )
    assert "0.2 req/s" in status_line(ch, sessions, now=now)  # no gateway: the engines' spans alone


def test_each_models_p99_stands_beside_its_slo_target(chdb_dir, sessions) -> None:
    # the demo's steady phase is healthy when each model is under its own target: the line shows both
    from analytics.metrics import histogram_quantile
    from storage.catalog import SloTarget, set_slo
    from tests.analytics.scenario_data import play

    run = play(chdb_dir, "long-context-rollout", seed=1)
    set_slo(sessions, SloTarget("tiny-small", "ttft", 5.0))
    p99 = histogram_quantile(
        run.client, "vllm:time_to_first_token_seconds", 0.99, run.end - timedelta(minutes=5), run.end, "model"
    ).set_index("model")["quantile"]
    line = status_line(run.client, sessions, now=run.end)
    assert (
        f"p99 TTFT (5 min) tiny-large {p99['tiny-large']:.2f}s, tiny-small {p99['tiny-small']:.2f}s (SLO 5s) · " in line
    ), line


def test_alerts_on_their_way_to_firing_are_counted_beside_the_firing_ones(ch, sessions) -> None:
    # a demo must show that nothing is even pending in its healthy phase, and when something is
    from alerts.state import Instance
    from alerts.store import save_states

    clickhouse_runner.apply(ch)
    now = datetime.now(UTC).replace(microsecond=0)

    def instance(name: str, state: str) -> Instance:
        return Instance(name, {"alertname": name}, {}, state, 1.0, now - timedelta(minutes=1))

    save_states(
        sessions, {"TTFTOverSLO": {"a": instance("a", "pending")}, "KVCacheSaturated": {"b": instance("b", "firing")}}
    )
    assert status_line(ch, sessions, now=now).endswith("firing alerts 1 (pending 1)")
