"""Scenarios played on the simulated fleet in virtual time: the gateway's router decides, events
kill and restart replicas, every record is one the collector accepts, and a seed replays exactly."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from collector.requestlog import parse_request_log
from fleet.sim.replay import play
from fleet.spec import load_spec
from fleet.traffic import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "fleet.yaml")
START = 1_800_000_000.0


def records(name: str, seed: int = 0) -> list[dict]:
    return [r for tick in play(SPEC, load_scenario(name), START, seed=seed) for r in tick.records]


def test_the_router_sends_the_new_tenant_to_the_large_model() -> None:
    rows = records("tenant-shift")
    bigcorp = [r for r in rows if r["tenant"] == "bigcorp"]
    assert bigcorp and all(r["ts"] >= START + 180 for r in bigcorp)
    assert {(r["model"], r["route"]) for r in bigcorp} == {("tiny-large", "model-router:large/least_loaded")}
    assert all(r["route_reason"].startswith("long prompt") for r in bigcorp)
    others = Counter(r["replica"] for r in rows if r["model"] == "tiny-small")
    assert set(others) == {"small-0", "small-1"}  # least-loaded spreads the small model's traffic
    _rows, errors = parse_request_log("\n".join(__import__("json").dumps(r) for r in rows))
    assert errors == []


def test_a_killed_replica_is_not_scraped_and_its_requests_fail_until_restarted() -> None:
    ticks = list(play(SPEC, load_scenario("replica-crash"), START, seed=2))  # a request is in flight at the kill
    scraped = {t.ts - START: {s.replica for s in t.scrapes} for t in ticks}
    assert "small-1" in scraped[115] and "small-1" not in scraped[125] and "small-1" not in scraped[295]
    assert "small-1" in scraped[305]  # back from the first scrape after the restart
    failed = [r for t in ticks for r in t.records if r["outcome"] == "upstream_error"]
    assert failed and all(r["replica"] == "small-1" and r["status_code"] == 502 for r in failed)
    served = [r for t in ticks for r in t.records if r["outcome"] == "ok" and START + 125 <= r["ts"] < START + 295]
    assert served and not any(r["replica"] == "small-1" for r in served)


def test_a_seed_replays_exactly_and_another_differs() -> None:
    assert records("steady", seed=3) == records("steady", seed=3)
    assert records("steady", seed=3) != records("steady", seed=4)
