"""``explain_quality`` (``fleetscope explain --metric truncation|refusal|empty``): the rise of a
quality rate found as a break, and what moved with it named.

On the simulated max-tokens-release run (globex's client lowers max_tokens to 40 at +600 s) the
break is found there and the sentence names globex and its max_tokens; the rates are checked
against the store's own rows. A refusal rise (a tenant's traffic moved by the router to an adapter
that refuses everything) is built from hand-written gateway rows, as is a rate that only wobbles;
the steady scenario gives "no break found". The CLI runs in-process (typer's CliRunner) on the
scenario's store: only the opening of the store is replaced, by the test's chDB client."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from analytics.errors import BadInput
from analytics.explain import explain_quality
from collector.request_columns import QUALITY_DEFAULTS
from migrations import clickhouse_runner
from tests.analytics.scenario_data import play

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
MOVE = T0 + timedelta(minutes=20)  # initech's requests go to the refusing adapter from here
TYPES = {"evaluated": "uint8", "refusal": "uint8", "truncated": "uint8", "max_tokens": "uint32"}
TENANTS = {"acme": 15, "globex": 9, "initech": 6}  # requests per minute


@pytest.fixture(scope="module")
def release(chdb_dir: Path) -> Any:
    return play(chdb_dir, "max-tokens-release", seed=1)


def scalar(run: Any, sql: str, **times: datetime) -> float:
    params = {name: t.replace(tzinfo=None) for name, t in times.items()}
    return float(run.client.query(sql, parameters=params).result_rows[0][0])


def test_a_max_tokens_release_is_a_truncation_break_named_by_tenant_and_max_tokens(release: Any) -> None:
    ex = explain_quality(release.client, release.start, release.end, rate="truncation")
    released = release.phase("globex-client-release")
    assert ex.break_at is not None and abs((ex.break_at - released).total_seconds()) <= 2 * ex.step
    assert "globex" in ex.sentence and "max_tokens" in ex.sentence, ex.sentence
    top = str(ex.evidence["signal"].iloc[0])
    assert "globex" in top and "max_tokens" in top, ex.evidence
    assert ex.evidence["before"].iloc[0] > 55 and ex.evidence["after"].iloc[0] == 40  # the median max_tokens
    # the store's own rows: no answer was truncated before the release; after it, the weighted share
    # of the evaluated answers that were, which is globex's share of them times its cut share
    assert ex.periods is not None
    window = "ts >= {a:DateTime64(3)} AND ts < {b:DateTime64(3)} AND source = 'gateway' AND evaluated = 1"
    cut_before = scalar(
        release, f"SELECT count() FROM requests WHERE {window} AND truncated = 1", a=ex.periods[0], b=released
    )
    assert cut_before == 0 and ex.before == 0
    after = scalar(
        release,
        f"SELECT sum(weight * truncated) / sum(weight) FROM requests WHERE {window}",
        a=ex.periods[1],
        b=ex.periods[2],
    )
    globex = scalar(
        release, f"SELECT avg(tenant = 'globex') FROM requests WHERE {window}", a=ex.periods[1], b=ex.periods[2]
    )
    assert ex.after == pytest.approx(after, rel=1e-6)
    assert 0.5 * globex < ex.after <= globex  # most of globex's answers cut, nobody else's
    assert ex.step >= 30 and ex.series["evaluated"].mean() >= 20  # steps that hold enough scored answers


def test_the_release_raises_no_refusal_or_empty_answer_break(release: Any) -> None:
    for rate in ("refusal", "empty"):
        ex = explain_quality(release.client, release.start, release.end, rate=rate)
        assert ex.break_at is None and "no break found" in ex.sentence, ex.sentence


def test_a_steady_run_has_no_break(chdb_dir: Path) -> None:
    run = play(chdb_dir, "steady", seed=2)
    ex = explain_quality(run.client, run.start, run.end, rate="truncation")
    assert ex.break_at is None and ex.evidence.empty
    assert "no break found" in ex.sentence, ex.sentence


def gateway_row(minute: float, tenant: str, model: str, refused: bool, **more: Any) -> dict[str, Any]:
    return {
        **QUALITY_DEFAULTS,
        "ts": T0 + timedelta(minutes=minute),
        "source": "gateway",
        "gateway": "fleetscope",
        "tenant": tenant,
        "model": model,
        "route": "pinned/least_loaded",
        "route_reason": "client named the model",
        "max_tokens": 256,
        "finish_reason": "stop",
        "weight": 1.0,
        "evaluated": 1,
        "refusal": int(refused),
        **more,
    }


def refusal_rows(minutes: int, moved: bool, base_rate: float, seed: int = 7) -> list[dict[str, Any]]:
    """Every answer scored; ``base_rate`` of them refused at random; with ``moved``, initech's
    requests go to the adapter guard-bot from ``MOVE`` on, routed by a tenant rule, and all are refused."""
    rng = random.Random(seed)
    rows = []
    for minute in range(minutes):
        for tenant, n in TENANTS.items():
            for i in range(n):
                at = minute + i / n
                if moved and tenant == "initech" and T0 + timedelta(minutes=at) >= MOVE:
                    rows.append(
                        gateway_row(
                            at,
                            tenant,
                            "guard-bot",
                            True,
                            route="rule/guard-bot",
                            route_reason="tenant rule (initech -> guard-bot)",
                        )
                    )
                else:
                    rows.append(gateway_row(at, tenant, "tiny-small", rng.random() < base_rate))
    return rows


def stored(ch: Any, rows: list[dict[str, Any]]) -> Any:
    clickhouse_runner.apply(ch)
    ch.insert_df("requests", pd.DataFrame(rows).astype(TYPES))
    return ch


def test_a_refusal_rise_names_the_tenant_and_the_adapter_it_moved_to(ch: Any) -> None:
    stored(ch, refusal_rows(40, moved=True, base_rate=0.03))
    ex = explain_quality(ch, T0, T0 + timedelta(minutes=40), rate="refusal")
    assert ex.break_at is not None and abs((ex.break_at - MOVE).total_seconds()) <= 2 * ex.step
    assert "tenant initech" in ex.sentence and "guard-bot" in ex.sentence, ex.sentence
    assert "rule/guard-bot" in ex.sentence and "tenant rule" in ex.sentence  # the router moved them
    top = set(ex.evidence["signal"].head(2))
    assert top == {"model mix (tenant initech)", "tenant initech"}, ex.evidence
    mix = ex.evidence.set_index("signal").loc["model mix (tenant initech)"]
    assert (mix["before"], mix["after"]) == (0.0, 1.0)
    assert ex.before < 0.06 and 0.18 < ex.after < 0.26  # initech's fifth of the answers, all refused


def test_a_rate_that_only_wobbles_has_no_break(ch: Any) -> None:
    stored(ch, refusal_rows(40, moved=False, base_rate=0.1))
    ex = explain_quality(ch, T0, T0 + timedelta(minutes=40), rate="refusal")
    assert ex.break_at is None and "no break found" in ex.sentence, ex.sentence
    assert ex.step == 60  # 30 scored answers a minute: a minute holds the 20 a step needs
    with pytest.raises(BadInput):
        explain_quality(ch, T0, T0 + timedelta(minutes=40), rate="latency")


class _Kept:
    """The test's client, left open when the command closes it."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def close(self) -> None:
        pass


def test_the_cli_explains_a_truncation_break_as_json(
    release: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from fleetscope import stores
    from fleetscope.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(stores, "open_clickhouse", lambda settings, **kw: _Kept(release.client))
    window = ["--start", release.start.isoformat(), "--end", release.end.isoformat()]
    result = CliRunner().invoke(app, ["explain", "--metric", "truncation", *window, "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["metric"] == "truncation rate" and doc["break_at"] is not None
    assert "globex" in doc["sentence"] and "max_tokens" in doc["sentence"]
    assert doc["evidence"][0]["signal"] == "max_tokens (tenant globex)" and doc["before"] == 0
    text = CliRunner().invoke(app, ["explain", "--metric", "truncation", "--tenant", "acme", *window])
    assert text.exit_code == 0 and "no break found" in text.output  # acme's answers were never cut
    assert CliRunner().invoke(app, ["explain", "--metric", "truncations", *window]).exit_code == 2


def test_the_refusing_adapter_scenario_names_initech_guard_bot_and_its_cost(chdb_dir: Path) -> None:
    """The simulator's refusing-adapter run: the refusal break names initech and guard-bot, and with
    prices the sentence puts initech's cost per 1M tokens beside it (from the showback of each period)."""
    run = play(chdb_dir, "refusing-adapter", seed=3, spec="fleet-spec-lora.yaml")
    ex = explain_quality(run.client, run.start, run.end, rate="refusal", prices={"cpu-demo": 0.10})
    moved = run.phase("initech-to-guard-bot")
    assert ex.break_at is not None and abs((ex.break_at - moved).total_seconds()) <= 2 * ex.step, ex.sentence
    assert ex.before == 0 and 0.12 < ex.after < 0.3, ex.sentence  # initech's 20 % of the answers
    assert "tenant initech" in ex.sentence and "guard-bot" in ex.sentence
    assert ex.cost["tenant"] == "initech" and ex.cost["before"] > 0 and ex.cost["after"] > 0
    assert "initech's cost per 1M tokens" in ex.sentence
    assert ex.to_dict()["cost"]["tenant"] == "initech"
    without = explain_quality(run.client, run.start, run.end, rate="refusal")
    assert without.cost == {} and "cost per 1M" not in without.sentence
