"""Benchmark: analytics computed in ClickHouse against the obvious Python way, on the same store.

1. Seeds a temporary chDB store: ``fleetscope.history`` (simulated engines, ``--replicas``
   replicas, 2 days, the last hour raw, a sampled request log), then a long-context rollout on
   the bundled fleet (``fleetscope.replay``) in a second database.
2. Times, side by side on the same data (median of ``--repeats`` runs after a warm-up):
   - **drift** (the last 6 hours vs the day before, all features): ``analytics.drift`` (weighted
     quantile grid and shares in SQL) vs fetching the rows into pandas and running scipy's
     ``wasserstein_distance`` / ``jensenshannon`` per feature;
   - **p99 TTFT over time** (the raw hour by model, 30 s steps): ``latency_over_time`` (one query,
     vectorised interpolation) vs a loop of ``histogram_quantile`` per step;
   - **saturation over time** (the raw hour by replica, 30 s steps): ``saturation_over_time`` vs a
     loop of ``saturation`` per step;
   - **explain** on the 15-minute rollout: one call (no reference: what a page waits for).
Not a test: nothing is asserted. Scores of our drift and scipy's are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analytics.drift import drift  # noqa: E402
from analytics.explain import explain  # noqa: E402
from analytics.latency import latency_over_time  # noqa: E402
from analytics.metrics import histogram_quantile  # noqa: E402
from analytics.saturation import saturation, saturation_over_time  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, object]:
    result = fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, result


def naive_drift(client, current, reference) -> dict[str, float]:
    from scipy.spatial.distance import jensenshannon
    from scipy.stats import wasserstein_distance

    sql = (
        "SELECT ts, tenant, model, route, finish_reason, prompt_tokens, completion_tokens, max_tokens, cached_tokens, "
        "weight FROM requests WHERE source = 'gateway' AND ts >= {a:DateTime64(3)} AND ts < {b:DateTime64(3)}"
    )
    frames = [client.query_df(sql, parameters={"a": w[0], "b": w[1]}) for w in (reference, current)]
    out = {}
    for name, column in (
        ("prompt_tokens", "prompt_tokens"),
        ("output_tokens", "completion_tokens"),
        ("max_tokens", "max_tokens"),
    ):
        ref, cur = frames[0], frames[1]
        std = np.sqrt(np.cov(ref[column].astype(float), aweights=ref["weight"])) or 1e-3
        out[name] = wasserstein_distance(ref[column], cur[column], ref["weight"], cur["weight"]) / std
    for name in ("tenant", "model", "route", "finish_reason"):
        shares = [f.groupby(name)["weight"].sum() / f["weight"].sum() for f in frames]
        keys = sorted(set(shares[0].index) | set(shares[1].index))
        out[name] = jensenshannon(shares[0].reindex(keys, fill_value=0), shares[1].reindex(keys, fill_value=0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=50)
    parser.add_argument("--sample-rate", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from fleet.spec import load_spec
    from fleet.traffic import load_scenario
    from fleetscope.history import seed
    from fleetscope.replay import replay
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        client = connect(f"chdb:{tmp}/ch", database="hist", create_database=True)
        clickhouse_runner.apply(client)
        end = datetime.now(UTC).replace(second=0, microsecond=0)
        t0 = time.perf_counter()
        report = seed(
            client,
            replicas=args.replicas,
            days=2,
            raw_hours=1,
            minute_hours=12,
            interval_s=5,
            request_sample_rate=args.sample_rate,
            end=end,
        )
        rows = int(client.command("SELECT count() FROM requests"))
        print(
            f"seeded {args.replicas} replicas x 2 days in {time.perf_counter() - t0:.0f}s: "
            f"{report.raw_samples:,} raw samples, {rows:,} request-log rows"
        )

        current, reference = (end - timedelta(hours=6), end), (end - timedelta(hours=30), end - timedelta(hours=6))
        ours_ms, ours = timed(lambda: drift(client, current, reference), args.repeats)
        naive_ms, theirs = timed(lambda: naive_drift(client, current, reference), args.repeats)
        scores = ours.set_index("feature")["score"]
        print(f"\ndrift, 6 h vs the 24 h before ({len(ours)} features; {rows:,} rows in the store)")
        print(f"   analytics.drift (SQL)            {ours_ms:8.0f} ms")
        print(f"   rows -> pandas -> scipy          {naive_ms:8.0f} ms   ({naive_ms / ours_ms:.1f}x ours)")
        print("   scores ours / scipy: " + ", ".join(f"{k} {scores[k]:.3f}/{v:.3f}" for k, v in theirs.items()))
        results["drift"] = {
            "ours_ms": ours_ms,
            "naive_ms": naive_ms,
            "ratio": naive_ms / ours_ms,
            "scores": {k: [float(scores[k]), float(v)] for k, v in theirs.items()},
        }

        hour = (report.raw_start + timedelta(minutes=1), end)
        step = 30
        steps = [
            (hour[0] + timedelta(seconds=i * step), hour[0] + timedelta(seconds=(i + 1) * step))
            for i in range(int((hour[1] - hour[0]).total_seconds() // step))
        ]
        ours_ms, _ = timed(
            lambda: latency_over_time(
                client, "ttft", *hour, levels=(0.99,), step=step, sources=("engine histograms",), tier="raw"
            ),
            args.repeats,
        )
        loop_ms, _ = timed(
            lambda: [
                histogram_quantile(client, "vllm:time_to_first_token_seconds", 0.99, a, b, "model", tier="raw")
                for a, b in steps
            ],
            1,
        )
        print(f"\np99 TTFT over the raw hour by model, {len(steps)} steps of {step}s")
        print(f"   latency_over_time (one query)    {ours_ms:8.0f} ms")
        print(f"   histogram_quantile per step      {loop_ms:8.0f} ms   ({loop_ms / ours_ms:.1f}x ours)")
        results["latency_over_time"] = {"ours_ms": ours_ms, "loop_ms": loop_ms, "ratio": loop_ms / ours_ms}

        ours_ms, _ = timed(lambda: saturation_over_time(client, *hour, "replica", step=step, tier="raw"), args.repeats)
        loop_ms, _ = timed(lambda: [saturation(client, a, b, "replica", tier="raw") for a, b in steps[:20]], 1)
        loop_ms *= len(steps) / 20  # 20 steps timed, scaled to all
        print(f"\nsaturation over the raw hour by replica, {len(steps)} steps")
        print(f"   saturation_over_time             {ours_ms:8.0f} ms")
        print(f"   saturation per step (est.)       {loop_ms:8.0f} ms   ({loop_ms / ours_ms:.1f}x ours)")
        results["saturation_over_time"] = {"ours_ms": ours_ms, "loop_ms": loop_ms, "ratio": loop_ms / ours_ms}

        run = connect(f"chdb:{tmp}/ch", database="rollout", create_database=True)
        clickhouse_runner.apply(run)
        start = end - timedelta(minutes=30)
        played = replay(run, load_spec(ROOT / "fleet.yaml"), load_scenario("long-context-rollout"), start)
        ms, ex = timed(lambda: explain(run, start, played.end, prices={"cpu-demo": 0.1}), args.repeats)
        print(
            f"\nexplain on a 15-minute long-context rollout ({played.requests:,} requests, {played.scrapes:,} scrapes)"
        )
        print(
            f"   one call                         {ms:8.0f} ms   top evidence: {', '.join(ex.evidence['signal'].head(2))}"
        )
        results["explain"] = {"ms": ms, "top": list(ex.evidence["signal"].head(3))}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
