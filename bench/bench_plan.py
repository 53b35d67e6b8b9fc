"""Benchmark: ``fleetscope plan`` on a 30-minute window of a 12-replica fleet — how long the
replay of the recorded fleet takes, in requests replayed per second, beside the window's own
length (how much faster than real time), and a sweep of variants.

1. A 12-replica fleet (8 ``tiny-small`` on L4, 4 ``tiny-large`` on H100; the simulator's engines)
   plays 30 minutes of the ``steady`` mix at 12 requests/s through the gateway's router into a
   temporary chDB store, as the collector writes it (``fleetscope.replay``).
2. ``planner.plan.plan`` over the window: the recorded fleet read back, calibrated, replayed
   (the backtest), then a sweep (small replicas 6/8/10, ``--sweep-replicas``, x least_loaded/affinity). Each is timed;
   the budget is the recorded replay in <= 30 s.

Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetscope.plan_cli import replica_counts  # noqa: E402

PRICES = {"L4": 0.80, "H100": 2.49}
BUDGET_S = 30.0
FLEET = """
host: 127.0.0.1
models:
  tiny-small: {path: data/models/tiny-small}
  tiny-large: {path: data/models/tiny-large}
replicas:
%s
gateway: {policy: least_loaded}
"""


def spec_text() -> str:
    lines = []
    for i in range(12):
        small = i < 8
        lines.append(
            f"  - {{name: {'small' if small else 'large'}-{i}, model: {'tiny-small' if small else 'tiny-large'}, "
            f"port: {19000 + i}, gpu_type: {'L4' if small else 'H100'}, "
            "engine_args: {max_model_len: 4096, num_gpu_blocks_override: 1025}}"
        )
    return FLEET % "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="the window replayed (default 30)")
    parser.add_argument("--rate", type=float, default=12.0, help="requests per second recorded (default 12)")
    parser.add_argument(
        "--sweep-replicas",
        default="6,8,10",
        help="tiny-small replica counts swept, each with both policies, as `fleetscope plan --replicas` takes "
        "them (2,4 or 1..4; default 6,8,10: 6 variants)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    try:
        sweep = replica_counts(args.sweep_replicas, "--sweep-replicas")  # the plan command's parser and its errors
    except typer.Exit as exc:
        sys.exit(exc.exit_code)

    from fleet.spec import load_spec
    from fleet.traffic import Scenario, load_scenario
    from fleetscope.replay import replay
    from migrations import clickhouse_runner
    from planner.plan import Changes, plan
    from storage.clickhouse import connect

    with tempfile.TemporaryDirectory(prefix="fleetscope-bench-plan-") as tmp:
        work = Path(tmp)
        (work / "fleet.yaml").write_text(spec_text())
        client = connect(f"chdb:{work / 'chdb'}", database="bench", create_database=True)
        clickhouse_runner.apply(client)
        data = load_scenario("steady").model_dump()
        data["duration_s"], data["mix"]["rate"] = args.minutes * 60, args.rate
        scenario = Scenario.model_validate(data)  # validated anew: a copy would keep the old rate's timeline
        end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
        start = end - timedelta(minutes=args.minutes)
        t0 = time.perf_counter()
        report = replay(client, load_spec(work / "fleet.yaml"), scenario, start, seed=5)
        recorded_s = time.perf_counter() - t0
        print(f"recorded: {report.requests:,} requests over {args.minutes:g} min on 12 replicas ({recorded_s:.1f} s)")

        t0 = time.perf_counter()
        base = plan(client, start, end, prices=PRICES)
        base_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        swept = plan(
            client,
            start,
            end,
            prices=PRICES,
            changes=Changes(replicas={"tiny-small": sweep}, policies=["least_loaded", "affinity"]),
        )
        sweep_s = time.perf_counter() - t0
        requests = float(base.table.loc[base.table["fleet"] == "recorded (replayed)", "requests"].iloc[0])
        replay_s = requests / base.requests_per_s
        window_s = args.minutes * 60
        figures = {
            "window_minutes": args.minutes,
            "replicas": 12,
            "requests_replayed": requests,
            "replay_s": round(replay_s, 2),
            "replay_requests_per_s": round(base.requests_per_s),
            "faster_than_real_time": round(window_s / replay_s, 1),
            "plan_s": round(base_s, 2),
            "sweep_variants": len(swept.table) - 2,
            "sweep_s": round(sweep_s, 2),
            "budget_s": BUDGET_S,
            "within_budget": base_s <= BUDGET_S,
            "backtest": base.backtest.to_dict("records"),
        }
        print(
            f"replay of the recorded fleet: {requests:,.0f} requests in {replay_s:.1f} s "
            f"({base.requests_per_s:,.0f} requests/s, {window_s / replay_s:.0f}x real time)"
        )
        print(
            f"plan (read, calibrate, replay): {base_s:.1f} s against a budget of {BUDGET_S:g} s "
            f"({'within' if base_s <= BUDGET_S else 'OVER'}); a sweep of {figures['sweep_variants']} variants "
            f"{sweep_s:.1f} s"
        )
        print(base.backtest.to_string(index=False))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2, default=str))


if __name__ == "__main__":
    main()
