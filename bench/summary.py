"""The headline figures of `make bench`, from the JSON results of this run.

In:  bench/results/*.json written by the benchmarks of one `make bench`, and its steps' wall
     times (bench/results/steps.tsv, from bench/step.sh).
Out: one block on stdout: each figure, its comparison measured in the same run, and the goal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(directory: Path, name: str) -> dict | None:
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "results")
    print("\n==================== fleetscope benchmark summary ====================")
    if exposition := load(directory, "exposition"):
        variants = exposition["variants"]
        ref = variants["prometheus_client (reference)"]["samples_per_s"]
        warm = variants["ours, warm (per-target cache), columnar"]
        print(
            f"1. parser: {warm['samples_per_s']:,.0f} samples/s vs prometheus_client {ref:,.0f} "
            f"= {warm['ratio']:.1f}x (goal >= 25x)"
        )
    if ingest := load(directory, "scrape_ingest"):
        for sink, label, goal in (
            ("chdb", "with the in-process store", "2,000"),
            ("remote", "collector alone (store in another process)", "3,000 at <= 1 core"),
            ("null", "with an in-process Null sink", "3,000"),
        ):
            if sink in ingest["sinks"]:
                r = ingest["sinks"][sink]
                print(
                    f"2. scrape ingest {label}: {r['sustained']} targets at {ingest['interval_s']:g}s, zero missed = "
                    f"{r['samples_per_s']:,.0f} samples/s (goal {goal} targets; Azure's managed "
                    "Prometheus pod ~50-58k/s)"
                )
    if (peers := load(directory, "peers")) and peers.get("summary"):
        s = peers["summary"]
        names = {"fleetscope": "fleetscope", "prometheus": "Prometheus", "victoriametrics": "vmagent+VM"}

        def each(values: dict, spec: str) -> str:
            return ", ".join(f"{names[k]} {'-' if v is None else format(v, spec)}" for k, v in values.items())

        def vs(values: dict) -> str:
            return ", ".join(
                f"vs {names[k]} {'-' if v is None else f'{v:.2f}x'}" for k, v in values.items() if k in names
            )

        print(
            f"2b. side by side at {peers['interval_s']:g}s: targets sustained {each(s['sustained'], 'd')}; "
            f"CPU-s per 1M samples at {s['common_level']} targets {each(s['cpu_s_per_m_at_common'], '.2f')} "
            f"(fleetscope {vs(s['ratios']['cpu_at_common'])}); bytes per sample {each(s['bytes_per_sample'], '.2f')} "
            f"(fleetscope {vs(s['ratios']['bytes_per_sample'])}; a run of minutes, not a 2 h block)"
        )
    if warehouse := load(directory, "warehouse"):
        b = warehouse["seed"]["bytes_per_sample"]
        print(
            f"3. bytes per raw sample after merges: {b['ours']:.2f} B (same rows: ClickHouse default "
            f"{b['clickhouse_default'] / b['ours_subset']:.1f}x more, naive log table "
            f"{b['naive_log_table'] / b['ours_subset']:.1f}x more; goal <= 1.0 B; Prometheus TSDB 1.3-1.8 B)"
        )
    if otlp := load(directory, "otlp_ingest"):
        o, r = otlp["ours"], otlp["reference"]
        runs = otlp.get("runs", {})
        null = runs.get("clickhouse-remote", runs.get("clickhouse-null", {})).get("spans_per_cpu_s")
        python = runs.get("python-chdb", {}).get("spans_per_cpu_s")
        extra = ""
        if null and python:
            extra = f"; collector alone (store in another process) {null:,.0f} (goal >= 150k); Python decoding into chDB {python:,.0f}"
        if (overhead := otlp.get("collector_overhead_over_store")) is not None:
            alone = otlp["store_alone"]["spans_per_cpu_s"]
            extra += (
                f"; chDB alone on the same bodies {alone:,.0f}: the collector's overhead {overhead:+.1%} (goal <= +15%)"
            )
        print(
            f"4. OTLP request-log ingest into chDB: {o['spans_per_cpu_s']:,.0f} spans per CPU-second "
            f"(goal >= 100k; {o['spans_per_s']:,.0f}/s wall) vs a generic exporter {r['spans_per_cpu_s']:,.0f} = "
            f"{o['spans_per_cpu_s'] / r['spans_per_cpu_s']:.1f}x{extra}; OTel Collector ~137k/core, Rotel ~462k/core"
        )
    if remote := load(directory, "remote_write"):
        print(
            f"4b. remote-write ingest: {remote['remote_write_samples_per_cpu_s']:,.0f} samples per CPU-second vs the "
            f"scrape path on the same samples {remote['scrape_samples_per_cpu_s']:,.0f} = {remote['ratio']:.2f}x "
            f"(requests of {remote['per_request']} samples)"
        )
    if warehouse:
        print(
            "5. dashboard panels over 30 days x "
            f"{warehouse['seed']['seed']['replicas']} replicas (p95, goal <= 100 ms; raw/rollup on the same window):"
        )
        for name, p in warehouse["panels"].items():
            ratio = p["raw_window"]["p95_ms"] / p["rollup_window"]["p95_ms"]
            how = "measured" if p.get("raw_30d_measured") else "extrapolated"
            each = p["month"].get("queries_p95_ms", [])
            label = f"{name} ({len(each)} queries, each {max(each):.0f} ms or less)" if len(each) > 1 else name
            print(
                f"   {label:<30} {p['month']['p95_ms']:6.0f} ms, peak {p['month']['peak_mib']:4.0f} MiB; same query on "
                f"raw rows over 30 d {p['raw_30d_ms'] / 1000:.1f} s ({how}) = {p['raw_30d_ms'] / p['month']['p95_ms']:,.0f}x; "
                f"on a short window raw {p['raw_window']['p95_ms']:.0f} ms vs rollup {p['rollup_window']['p95_ms']:.0f} ms "
                f"({ratio:.1f}x)"
            )
    if analytics := load(directory, "analytics"):
        d, lat, sat, ex = (
            analytics["drift"],
            analytics["latency_over_time"],
            analytics["saturation_over_time"],
            analytics["explain"],
        )
        print(
            f"6. analytics in ClickHouse vs the obvious Python way, same data: drift {d['ours_ms']:.0f} ms vs rows+scipy "
            f"{d['naive_ms']:.0f} ms ({d['ratio']:.1f}x); p99 TTFT over time {lat['ours_ms']:.0f} ms vs a query per step "
            f"({lat['ratio']:.0f}x); saturation over time {sat['ours_ms']:.0f} ms ({sat['ratio']:.0f}x); "
            f"explain on a 15-min incident {ex['ms']:.0f} ms"
        )
    if dash := load(directory, "dashboard"):
        pages, budget = dash["pages"], dash["budget"]

        def spread(key: str) -> str:
            found = {name: p[key] for name, p in pages.items() if p[key] == p[key]}  # not NaN
            if not found:
                return "-"
            worst = max(found, key=found.__getitem__)
            over = sorted(name for name, value in found.items() if value > budget[key])
            return f"{min(found.values()):.2f}-{found[worst]:.2f} s (slowest {worst}; budget {budget[key]} s" + (
                f"; over: {', '.join(over)})" if over else "; all within)"
            )

        print(
            f"7. dashboard in headless Chromium, range=30d over {dash['days']:g} days x {dash['replicas']} replicas: "
            f"first render less Streamlit's floor ({dash['streamlit_floor_s']:.2f} s) {spread('over_floor_s')}; "
            f"refresh within the grain {spread('refresh_within_s')}, across it {spread('refresh_crossing_s')}"
        )
    if alerts := load(directory, "alerts"):
        print(
            f"8. alerts: {alerts['rules']} rules on {alerts['replicas']} replicas, {alerts['ours_s'] * 1000:.0f} ms per "
            f"15 s cycle vs {alerts['reference_s'] * 1000:.0f} ms with one query per rule ({alerts['ratio']:.1f}x; goal <= 1 s)"
        )
    if planned := load(directory, "plan"):
        print(
            f"9. plan: a {planned['window_minutes']:g}-min window of {planned['replicas']} replicas replayed in "
            f"{planned['replay_s']:.1f} s ({planned['replay_requests_per_s']:,} requests/s, "
            f"{planned['faster_than_real_time']:g}x real time); read + calibrate + replay {planned['plan_s']:.1f} s "
            f"(budget {planned['budget_s']:g} s); a sweep of {planned['sweep_variants']} variants {planned['sweep_s']:.1f} s"
        )
    steps(directory / "steps.tsv")
    print("=======================================================================")


def steps(path: Path) -> None:
    """The wall time of each step of this `make bench` (bench/step.sh), the longest first, and the total."""
    if not path.exists():
        return
    rows = [line.split("\t") for line in path.read_text().splitlines() if line.count("\t") == 2]
    took = sorted(((int(seconds), title) for title, seconds, _rc in rows), reverse=True)
    total = sum(seconds for seconds, _title in took)
    longest = ", ".join(f"{title.split('. ', 1)[-1][:40]} {seconds / 60:.1f}" for seconds, title in took[:4])
    print(f"make bench: {total / 60:.1f} min in {len(took)} steps (goal < 35 min; the longest, min: {longest})")


if __name__ == "__main__":
    main()
