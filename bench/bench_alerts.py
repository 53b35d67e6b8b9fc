"""Benchmark: 500 alert rules evaluated per 15 s cycle on a 200-replica fleet (issue 9: <= 1 s).

1. Seeds a temporary chDB store with ``fleetscope.history`` (``--replicas`` simulated engines,
   2 days, the last hour raw at 5 s, a sampled request log), or reads the one ``--seeded DIR``
   names (``make bench``: the warehouse bench's 30 days, the last 15 minutes raw), and a SQLite
   metadata DB with a TTFT and an ITL SLO per model.
2. Builds rules in groups: the built-in pack, then the rules teams add on top of it, up to
   ``--rules`` rules evaluated every 15 s: per model (p99 TTFT and ITL above 1 / 2 / 5 s, p90/p95 TTFT, error ratio, cost per 1M
   tokens) and per replica (KV cache, queue, preemptions), each with its own matcher and
   threshold, as a rule file would have them.
3. Times a 15 s cycle (every 15 s group at one evaluation time: signals, the state machine,
   states saved to the metadata DB, history to ClickHouse, grouping into the outbox), and the
   worst cycle (the built-in pack's 1 min and 5 min groups due as well), median of
   ``--repeats`` cycles after a warm-up, side by side with the reference: the same evaluator with
   one query per rule (``Context(shared=False)``, what an evaluator that does not share answers
   between rules does).
Prints the time per cycle, the ratio to the reference and to the 15 s interval.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from alerts.config import AlertsSettings  # noqa: E402
from alerts.evaluator import Evaluator  # noqa: E402
from alerts.reading import Context  # noqa: E402
from alerts.rules import PACK, RuleFile, load_rules, merge  # noqa: E402

INTERVAL = 15.0


def rule_file(models: list[str], replicas: list[str], total: int) -> RuleFile:
    pack = load_rules(PACK)
    rules: list[dict] = []
    for m in models:
        for metric in ("ttft", "itl"):
            for limit in (1, 2, 5):
                rules.append(
                    {
                        "name": f"{metric}_p99_over_{limit}s_{m}",
                        "expr": f'{metric}_p99{{model="{m}"}}',
                        "threshold": limit,
                        "for": "5m",
                        "labels": {"severity": "page"},
                    }
                )
        for q in (0.9, 0.95):
            rules.append(
                {
                    "name": f"ttft_p{q * 100:g}_{m}",
                    "expr": f'latency_quantile{{q="{q}", model="{m}"}}',
                    "threshold": 1.0,
                    "for": "5m",
                }
            )
        rules.append({"name": f"errors_{m}", "expr": f'error_ratio{{model="{m}"}}', "threshold": 0.02, "for": "5m"})
        rules.append({"name": f"cost_{m}", "expr": f'cost_per_mtok{{model="{m}"}}', "threshold": 5.0, "for": "30m"})
    signals = [("kv_cache_usage_max", ">=", 0.9), ("requests_waiting", ">", 5), ("preemption_rate", ">", 0.5)]
    i = 0
    fast = sum(len(g.rules) for g in pack.groups if g.interval_s == INTERVAL)
    while len(rules) + fast < total:
        signal, op, threshold = signals[i % len(signals)]
        replica = replicas[(i // len(signals)) % len(replicas)]
        rules.append(
            {
                "name": f"{signal}_{replica}_{i}",
                "expr": f'{signal}{{replica="{replica}"}}',
                "op": op,
                "threshold": threshold,
                "for": "5m",
                "labels": {"team": f"team-{i % 7}"},
            }
        )
        i += 1
    per = -(-len(rules) // 9)
    groups = [
        {"name": f"team-{n}", "interval": "15s", "rules": rules[n * per : (n + 1) * per]}
        for n in range(9)
        if rules[n * per : (n + 1) * per]
    ]
    extra = RuleFile.model_validate({"groups": groups})
    return RuleFile(groups=[*pack.groups, *extra.groups])


def cycle(evaluator: Evaluator, at: datetime, every: bool) -> float:
    """One cycle: the 15 s groups (``every``: all groups, as when the 1 min and 5 min ones are due too)."""
    t0 = time.perf_counter()
    for g in evaluator.groups:
        if every or g.interval_s == INTERVAL:
            evaluator.evaluate_group(g, at)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=200)
    parser.add_argument("--rules", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--store", type=Path, help="seed into this directory and keep it; reuse it when it holds a store"
    )
    parser.add_argument(
        "--seeded",
        type=Path,
        help="read DIR/ch, a store bench_warehouse.py --keep DIR seeded (30 days; make bench), instead of seeding "
        "2 days; the rules are evaluated at its last sample",
    )
    parser.add_argument("--profile", action="store_true", help="print the time of each distinct signal query")
    args = parser.parse_args()

    from fleetscope.history import seed
    from migrations import clickhouse_runner, metadata_runner
    from storage.catalog import SloTarget, set_slo
    from storage.clickhouse import connect
    from storage.metadata import make_engine, make_sessionmaker

    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.store or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        reuse = (tmp / "seeded").exists()
        if args.seeded is not None:  # the warehouse bench's store, as it seeded it
            client = connect(f"chdb:{args.seeded.resolve()}/ch")
        else:
            client = connect(f"chdb:{tmp}/ch", database="hist", create_database=True)
        clickhouse_runner.apply(client)
        if args.seeded is not None:
            last = client.query("SELECT max(ts) FROM samples").result_rows[0][0]
            end = last.replace(tzinfo=UTC, second=0, microsecond=0) + timedelta(minutes=1)
            print(f"reading the store in {args.seeded} (30 days), evaluated at {end:%Y-%m-%d %H:%M} UTC")
        elif reuse:
            end = datetime.fromisoformat((tmp / "seeded").read_text().strip())
            print(f"reusing the store in {tmp}, seeded up to {end:%Y-%m-%d %H:%M} UTC")
        else:
            end = datetime.now(UTC).replace(second=0, microsecond=0)
            t0 = time.perf_counter()
            report = seed(
                client,
                replicas=args.replicas,
                days=2,
                raw_hours=1,
                minute_hours=12,
                interval_s=5,
                request_sample_rate=0.01,
                end=end,
            )
            (tmp / "seeded").write_text(end.isoformat())
            print(
                f"seeded {args.replicas} replicas x 2 days in {time.perf_counter() - t0:.0f}s: "
                f"{report.raw_samples:,} raw samples"
            )
        models = sorted(r[0] for r in client.query("SELECT DISTINCT model FROM series WHERE model != ''").result_rows)
        replicas = sorted(
            r[0] for r in client.query("SELECT DISTINCT replica FROM series WHERE replica != ''").result_rows
        )

        url = f"sqlite:///{scratch}/metadata.db"
        list(metadata_runner.upgrade(url))
        sessions = make_sessionmaker(make_engine(url))
        for m in models:
            set_slo(sessions, SloTarget(m, "ttft", 2.0, 0.99))
            set_slo(sessions, SloTarget(m, "itl", 0.2, 0.99))
        groups = merge([rule_file(models, replicas, args.rules)])
        count = sum(len(g.rules) for g in groups)
        settings = AlertsSettings.model_validate(
            {"receivers": [{"name": "ops", "type": "webhook", "url": "http://127.0.0.1:9/alerts"}]}
        )

        if args.profile:
            from alerts.expr import evaluate

            ctx, seen = Context(client, sessions), set()
            for g in groups:
                for r in g.rules:
                    if r.parsed.signal is None or (r.parsed.signal, r.parsed.params) in seen:
                        continue
                    seen.add((r.parsed.signal, r.parsed.params))
                    t0 = time.perf_counter()
                    evaluate(ctx, r.parsed, end)
                    print(f"   {time.perf_counter() - t0:7.3f} s  {r.parsed.signal}{dict(r.parsed.params)}  ({g.name})")
        results = {}
        fast = sum(len(g.rules) for g in groups if g.interval_s == INTERVAL)
        for label, shared in (("shared answers (ours)", True), ("one query per rule (reference)", False)):
            evaluator = Evaluator(groups, Context(client, sessions, shared=shared), sessions, settings)
            at = end
            cycle(evaluator, at, True)  # warm-up: states created, caches of the store filled
            row = {}
            for kind, every in (("cycle", False), ("worst", True)):
                times = []
                for _ in range(args.repeats):
                    at += timedelta(seconds=INTERVAL)
                    times.append(cycle(evaluator, at, every))
                row[kind] = statistics.median(times)
                row[f"{kind}_all"] = times
            reports = evaluator.last.values()
            row.update(
                firing=sum(r.firing for r in reports),
                pending=sum(r.pending for r in reports),
                errors=sum(len(r.errors) for r in reports),
            )
            results[label] = row
        ours, ref = results["shared answers (ours)"], results["one query per rule (reference)"]
        print(
            f"\n{count} rules in {len(groups)} groups ({fast} every 15 s, the rest every 1 or 5 min), {len(models)} "
            f"models, {len(replicas)} replicas; median of {args.repeats} cycles"
        )
        for label, r in results.items():
            print(
                f"   {label:<32} 15 s cycle ({fast} rules) {r['cycle'] * 1000:6.0f} ms;  every group due "
                f"({count} rules) {r['worst'] * 1000:6.0f} ms   ({r['firing']} firing, {r['pending']} pending, "
                f"{r['errors']} errors)"
            )
        print(
            f"   reference / ours: {ref['cycle'] / ours['cycle']:.1f}x (15 s cycle), {ref['worst'] / ours['worst']:.1f}x "
            f"(every group); ours uses {ours['cycle'] / INTERVAL:.1%} of the 15 s interval (goal: <= 1 s per cycle)"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {
                        "rules": fast,
                        "rules_all": count,
                        "groups": len(groups),
                        "replicas": len(replicas),
                        "models": len(models),
                        "ours_s": ours["cycle"],
                        "reference_s": ref["cycle"],
                        "ratio": ref["cycle"] / ours["cycle"],
                        "worst_s": ours["worst"],
                        "variants": results,
                    },
                    indent=1,
                )
            )


if __name__ == "__main__":
    main()
