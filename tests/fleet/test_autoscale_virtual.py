"""The autoscaler in virtual time: the router-defeat scenario grows the large pool and the bill as a
live run would show them in the store (samples of the replicas that exist, scale_events tied by
decision id, spend per hour from analytics.cost); a drained replica finishes its requests and gets
no new one; the flag and the spec turn scaling on and off."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from analytics.allocation import FLEET
from analytics.cost import cost_per_token
from fleet.autoscale.policy import SIGNALS
from fleet.errors import FleetError
from fleet.sim.replay import Tick, play
from fleet.spec import FleetSpec, load_spec
from fleet.traffic import Scenario, load_scenario
from tests.analytics.scenario_data import PRICES, Run
from tests.analytics.scenario_data import play as play_into_store

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "fleet-autoscale.yaml", ROOT)
COLD_START = SPEC.autoscale.pools["tiny-large"].cold_start_s if SPEC.autoscale else 0.0
START = 1_800_000_000.0
UP = "vllm:num_requests_running"  # the series whose presence analytics count as a replica up
SHIFT_S = 720.0  # router-defeat: acme's prompts cross the long-prompt rule
BACK_S = 1380.0  # ... and shrink back


@pytest.fixture(scope="module")
def defeat(chdb_dir: Path) -> Run:
    return play_into_store(chdb_dir, "router-defeat", seed=1, spec="fleet-autoscale.yaml")


def large_replicas_per_minute(run: Run) -> dict[int, int]:
    """Minute of the run -> tiny-large replicas with samples in it (what a user counts on a chart)."""
    df = run.client.query_df(
        f"SELECT toStartOfMinute(s.ts) AS m, uniqExact(r.replica) AS n FROM samples AS s INNER JOIN "
        f"(SELECT DISTINCT fingerprint, replica FROM series WHERE metric = '{UP}' AND model = 'tiny-large') AS r "
        f"USING fingerprint WHERE s.metric = '{UP}' GROUP BY m"
    )
    return {int((pd.Timestamp(m).to_pydatetime() - run.start).total_seconds() // 60): int(n) for m, n in df.values}


def first_and_last_sample(run: Run, replica: str) -> tuple[pd.Timestamp, pd.Timestamp]:
    df = run.client.query_df(
        "SELECT min(ts) AS first, max(ts) AS last FROM samples WHERE fingerprint IN "
        f"(SELECT fingerprint FROM series WHERE replica = '{replica}')"
    )
    return pd.Timestamp(df["first"][0]), pd.Timestamp(df["last"][0])


def events(run: Run) -> pd.DataFrame:
    return run.client.query_df("SELECT * FROM scale_events ORDER BY ts, kind")


def spend_per_hour(run: Run, start: datetime, end: datetime) -> float:
    fleet = cost_per_token(run.client, start, end, PRICES).set_index("model").loc[FLEET]
    return float(fleet["spend"]) / ((end - start).total_seconds() / 3600)


def test_router_defeat_scales_the_large_pool_out_and_the_spend_per_hour_follows(defeat: Run) -> None:
    per_minute = large_replicas_per_minute(defeat)
    shift = int(SHIFT_S // 60)
    assert {per_minute[m] for m in range(shift)} == {1}  # one large replica before the shift
    assert min(per_minute[m] for m in range(shift + 3, int(BACK_S // 60))) >= 2  # >= 2 within 3 minutes of it

    ev = events(defeat)
    out = ev[ev.kind == "scale_out"].iloc[0]
    steps = ev[ev.decision_id == out.decision_id].set_index("kind")
    assert {"scale_out", "ready", "serving"} <= set(steps.index) and out.replica == "large-1"
    assert (steps.loc["ready", "ts"] - out.ts).total_seconds() == pytest.approx(COLD_START, abs=0.01)
    assert steps.loc["serving", "ts"] >= steps.loc["ready", "ts"]
    assert (out.ts - defeat.start).total_seconds() - SHIFT_S < 120  # decided within two minutes of the shift
    assert out.from_replicas == 1 and out.to_replicas == 2 and out.signal in SIGNALS and out.source == "sim"
    assert out.value > out.threshold > 0 and out.crossed_at <= out.ts and out.signal in out.detail

    before = spend_per_hour(defeat, defeat.start + timedelta(minutes=2), defeat.phase("acme-long-prompts"))
    after = spend_per_hour(defeat, defeat.phase("acme-long-prompts") + timedelta(minutes=3), defeat.phase("acme-back"))
    assert after >= 1.5 * before  # measured 2026-12-05: 0.60 -> 1.00 $/h (+67 %) on seeds 0-3


def test_a_new_replica_has_no_samples_before_it_is_ready(defeat: Run) -> None:
    ev = events(defeat)
    ready = ev[(ev.kind == "ready") & (ev.replica == "large-1")].ts.min()
    first, _last = first_and_last_sample(defeat, "large-1")
    assert first >= ready
    decided = ev[(ev.kind == "scale_out") & (ev.replica == "large-1")].ts.min()
    assert first - decided >= timedelta(seconds=COLD_START)  # the cold start is not scraped (nor billed)


def test_router_defeat_drains_the_added_replica_when_acme_is_back_and_fails_nothing(defeat: Run) -> None:
    ev = events(defeat)
    draining = ev[ev.kind == "draining"]
    assert len(draining) >= 1, "the large pool scales in after acme's prompts shrink back"
    drain = draining.iloc[0]
    removed = ev[(ev.kind == "removed") & (ev.decision_id == drain.decision_id)].ts.iloc[0]
    assert (drain.ts - defeat.start).total_seconds() > BACK_S
    requests = defeat.client.query_df("SELECT ts, replica, outcome FROM requests")
    assert len(requests[(requests.replica == drain.replica) & (requests.ts >= drain.ts)]) == 0
    assert set(requests.outcome) == {"ok"}
    _first, last = first_and_last_sample(defeat, drain.replica)
    assert last <= removed  # not scraped once removed: it costs nothing more


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_router_defeat_scales_out_on_every_seed(seed: int) -> None:
    scale = [e for t in play(SPEC, load_scenario("router-defeat"), START, seed=seed) for e in t.events]
    outs = [e for e in scale if e.kind == "scale_out"]
    assert outs and SHIFT_S < outs[0].ts - START < SHIFT_S + 120
    ready = [e for e in scale if e.kind == "ready" and e.decision_id == outs[0].decision_id]
    assert ready and ready[0].ts - outs[0].ts == pytest.approx(COLD_START)


def drain_spec() -> FleetSpec:
    """Two large replicas and a policy that scales in at once (its in-signal always holds)."""
    data: dict[str, Any] = yaml.safe_load((ROOT / "fleet-autoscale.yaml").read_text())
    large = dict(data["replicas"][2], name="large-1", port=8104)
    data["replicas"].append(large)
    data["autoscale"]["pools"]["tiny-large"] = {
        "min_replicas": 1, "max_replicas": 2, "out": {"kv_cache_usage": 1.0}, "in": {"requests_waiting": 1000},
        "in_for_s": 0, "in_cooldown_s": 0,
    }  # fmt: skip
    return FleetSpec.model_validate(data).resolve(ROOT)


def busy_large_scenario(autoscale: bool | None = None) -> Scenario:
    return Scenario.model_validate(
        {
            "name": "busy-large",
            "duration_s": 90,
            "autoscale": autoscale,
            "mix": {
                "rate": 2.0,
                "tenants": [{"name": "umbrella", "weight": 1.0}],
                "models": {"tiny-large": 1.0},
                "prompt_tokens": {"dist": "lognormal", "median": 300, "sigma": 0.3, "min": 64, "max": 600},
                "output_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.2, "min": 100, "max": 300},
            },
        }
    )


def test_a_drained_replica_finishes_its_requests_and_gets_no_new_one() -> None:
    ticks: list[Tick] = list(play(drain_spec(), busy_large_scenario(), START, seed=3, autoscale=True))
    scale = [e for t in ticks for e in t.events]
    drain = next(e for e in scale if e.kind == "draining")
    removed = next(e for e in scale if e.kind == "removed" and e.decision_id == drain.decision_id)
    assert drain.replica == "large-1" and drain.ts == START + 5  # the first evaluation scales 2 -> 1
    rows = [r for t in ticks for r in t.records]
    on_drained = [r for r in rows if r.get("replica") == "large-1"]
    in_flight = [r for r in on_drained if r["ts"] + r["e2e_seconds"] > drain.ts]
    assert in_flight, "requests were running on the replica when its drain began"
    assert all(r["ts"] < drain.ts for r in on_drained)  # nothing new after the drain began
    assert {r["outcome"] for r in rows} == {"ok"}  # the drain failed no request
    assert removed.ts >= max(r["ts"] + r["e2e_seconds"] for r in in_flight)
    scraped: dict[str, list[float]] = defaultdict(list)
    for t in ticks:
        for s in t.scrapes:
            scraped[s.replica].append(t.ts)
    assert max(scraped["large-1"]) <= removed.ts and max(scraped["large-0"]) == ticks[-1].ts


def test_the_flag_and_the_spec_turn_autoscaling_on_and_off() -> None:
    fixed = list(play(SPEC, load_scenario("router-defeat"), START, seed=1, autoscale=False))
    assert not [e for t in fixed for e in t.events]
    assert {s.replica for t in fixed for s in t.scrapes} == {"small-0", "small-1", "large-0"}
    # the scenario's `autoscale:` turns a spec's disabled section on (the flag would override it)
    off = drain_spec().model_copy(update={"autoscale": drain_spec().autoscale.model_copy(update={"enabled": False})})  # type: ignore[union-attr]
    assert [e.kind for t in play(off, busy_large_scenario(True), START, seed=3) for e in t.events][:2] == [
        "scale_in",
        "draining",
    ]
    assert not [e for t in play(off, busy_large_scenario(), START, seed=3) for e in t.events]
    bundled = load_spec(ROOT / "fleet.yaml", ROOT).model_copy(update={"autoscale": None})  # no section
    with pytest.raises(FleetError, match="no autoscale section"):
        next(play(bundled, busy_large_scenario(True), START))
