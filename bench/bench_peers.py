"""Benchmark: the collector beside Prometheus and vmagent + VictoriaMetrics on the same simulated
targets — targets sustained at a 5 s interval, CPU per sample, and bytes per sample on disk.

One run, one target server (bench_scrape_ingest's: one aiohttp process, one path per simulated
vLLM target, 432 samples each, about a tenth of the values changing per scrape), three systems
run one after the other so that each has the machine to itself:

- fleetscope: bench_scrape_ingest's pipeline (Scraper -> parser -> SeriesConverter -> Writer ->
  an in-process chDB with the rollup views), in this process; its CPU is this process's
  (utime + stime of all its threads: the collector, the writer, chDB's inserts and merges);
- Prometheus 2.42 (Debian's ``prometheus``): scrape + TSDB (head, WAL); its CPU is its process's;
- vmagent scraping and remote-writing to a single-node victoria-metrics 1.79 (Debian's
  ``victoria-metrics``); the CPU of both processes is counted.

Each system runs the levels (``--levels`` targets, ascending) in one process, its targets changed
between levels (Prometheus and vmagent by a config reload). A level warms up (fleetscope: until
an interval passes without a missed scrape, at most 6; the others: at least 2 intervals, more
while an interval does fewer scrapes than targets, at most 6), then measures ``--measure-s``
(whole intervals): samples scraped, CPU-seconds (/proc/PID/stat utime + stime, children
included) and missed scrapes. fleetscope counts its own missed intervals (a scrape loop that
fell behind); for the others the ``up`` series of every target in the window is read back
(Prometheus's query API, VictoriaMetrics's export API) and every gap of more than one interval
between two scrapes of a target (or at the window's edges) counts as missed; ``up == 0`` is a
failed scrape. Sustained = the largest level with no missed or failed scrape; a system stops at
its first level with one.

Then bytes per sample on disk, each store on what it ingested in this run: fleetscope after
``OPTIMIZE TABLE samples FINAL`` (active parts' bytes_on_disk / rows of ``samples``; with the
``series`` table as "total"); Prometheus from a TSDB snapshot (admin API: the head written as a
block, as head compaction writes one; chunks / numSamples, and the whole block as "total");
VictoriaMetrics after ``/internal/force_flush`` and ``/internal/force_merge`` (data/ / the
storage rows of ``vm_rows``; with indexdb/ as "total"). Samples per series is printed beside:
each store divides by its own rows, and fewer samples per series weigh its per-series overheads
more.

What it is not: a long-run figure. A series here spans a few minutes, not the 2 h of a
Prometheus block (a chunk holds up to 120 samples) or VictoriaMetrics's monthly partitions, so
per-series overheads weigh more in every store's bytes per sample than they would over a day. The
target server's CPU is counted for none of them, and the machine's other work (2 shared cores)
shows in the scrape-miss figures. The defaults (4 levels, 25 s measured) take about 8 minutes.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_scrape_ingest import run_level, start_targets
from tests import promtools

# tests/promtools starts Prometheus and vmagent; the single-node store is Debian's
# victoria-metrics (the same package as vmagent, installed by scripts/ensure-prometheus.sh)
promtools.BINARIES.setdefault("victoria-metrics", "victoria-metrics")

JOB = "bench"
SYSTEMS = {
    "fleetscope": "fleetscope (in-process chDB)",
    "prometheus": "Prometheus 2.42",
    "victoriametrics": "vmagent + VictoriaMetrics 1.79",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` from /proc/PID/stat, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / CLK_TCK  # fields 14-17 of the file


def http(url: str, data: bytes | None = None, timeout: float = 60) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout) as response:
        body: bytes = response.read()
        return body


def metric_sum(url: str, name: str, label: str = "") -> float:
    """The sum of ``name``'s values (lines carrying ``label`` when given) on a /metrics page."""
    total = 0.0
    for line in http(f"{url}/metrics").decode().splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " ") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def scrape_config(n: int, port: int, interval: float) -> dict[str, Any]:
    """The same ``n`` targets fleetscope scrapes: one path each on the target server, same timeout."""
    return {
        "job_name": JOB,
        "scrape_interval": f"{interval:g}s",
        "scrape_timeout": f"{interval * 0.8:g}s",
        "static_configs": [
            {
                "targets": [f"127.0.0.1:{port}"],
                "labels": {"__metrics_path__": f"/t/{i}/metrics", "replica": f"sim-{i}"},
            }
            for i in range(n)
        ],
    }


def tally(
    series: dict[str, dict[str, list[tuple[float, float]]]], n: int, t0: float, t1: float, interval: float
) -> dict[str, Any]:
    """Scrapes, missed and failed scrapes, samples in [t0, t1] from each target's ``up`` and
    ``scrape_samples_scraped`` (replica -> name -> [(ts, value)])."""
    scrapes = missed = failed = 0
    samples = 0.0
    for i in range(n):
        points = series.get(f"sim-{i}", {})
        up = sorted(points.get("up", []))
        samples += sum(v for _, v in points.get("scrape_samples_scraped", []))
        if not up:
            missed += round((t1 - t0) / interval)
            continue
        scrapes += len(up)
        failed += sum(1 for _, v in up if v == 0)
        stamps = [t for t, _ in up]
        missed += sum(max(0, round((b - a) / interval) - 1) for a, b in zip(stamps, stamps[1:], strict=False))
        for edge in (stamps[0] - t0, t1 - stamps[-1]):  # a regular target's edges are under an interval
            if edge > 1.5 * interval:
                missed += round(edge / interval - 0.5)
    return {"scrapes": scrapes, "missed": missed, "failed": failed, "samples": int(samples)}


class Peer:
    """A scraping system run as binaries: targets set by a config reload, its processes' CPU,
    its scrapes read back from its store."""

    name = ""

    def __init__(self, workdir: Path, port: int, interval: float) -> None:
        self.workdir, self.port, self.interval = workdir, port, interval
        self.procs: list[promtools.Proc] = []
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self, stack: ExitStack) -> None:
        raise NotImplementedError

    def write_config(self, n: int) -> None:
        raise NotImplementedError

    def set_targets(self, n: int) -> None:
        self.write_config(n)
        self.procs[0].process.send_signal(signal.SIGHUP)

    def cpu(self) -> float:
        return sum(proc_cpu_seconds(p.process.pid) for p in self.procs)

    def scrapes_done(self) -> float:
        raise NotImplementedError

    def record(self, t0: float, t1: float) -> dict[str, dict[str, list[tuple[float, float]]]]:
        raise NotImplementedError

    def storage(self) -> dict[str, Any]:
        raise NotImplementedError


def group(
    rows: list[tuple[dict[str, str], list[tuple[float, float]]]],
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    out: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(dict)
    for metric, points in rows:
        out[metric.get("replica", "")].setdefault(metric["__name__"], []).extend(points)
    return out


class Prometheus(Peer):
    name = "prometheus"

    def start(self, stack: ExitStack) -> None:
        (port,) = promtools.free_ports(1)
        self.write_config(0)
        args = [
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-admin-api",
        ]
        self.procs = [stack.enter_context(promtools.started("prometheus", args, self.workdir, port=port))]

    def write_config(self, n: int) -> None:
        config: dict[str, Any] = {"global": {"scrape_interval": f"{self.interval:g}s"}, "scrape_configs": []}
        if n:
            config["scrape_configs"] = [scrape_config(n, self.port, self.interval)]
        (self.workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML

    def scrapes_done(self) -> float:
        return metric_sum(self.procs[0].url, "prometheus_target_interval_length_seconds_count")

    def record(self, t0: float, t1: float) -> dict[str, dict[str, list[tuple[float, float]]]]:
        query = f'{{__name__=~"up|scrape_samples_scraped",job="{JOB}"}}[{int((t1 - t0) * 1000)}ms]'
        url = f"{self.procs[0].url}/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{t1:.3f}"})
        result = json.loads(http(url))["data"]["result"]
        return group([(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in result])

    def storage(self) -> dict[str, Any]:
        """A snapshot of the TSDB: the head written as a block, as head compaction writes one."""
        url = self.procs[0].url
        name = json.loads(http(f"{url}/api/v1/admin/tsdb/snapshot", data=b""))["data"]["name"]
        blocks = [b for b in (self.workdir / "tsdb" / "snapshots" / name).iterdir() if (b / "meta.json").exists()]
        stats = [json.loads((b / "meta.json").read_text())["stats"] for b in blocks]
        return {
            "samples": sum(s["numSamples"] for s in stats),
            "series": sum(s["numSeries"] for s in stats),
            "bytes": sum(dir_bytes(b / "chunks") for b in blocks),
            "bytes_total": sum(dir_bytes(b) for b in blocks),
            "what": "chunks/ of the snapshot block; total: the whole block (index, meta)",
        }


class VictoriaMetrics(Peer):
    name = "victoriametrics"

    def start(self, stack: ExitStack) -> None:
        store_port, agent_port = promtools.free_ports(2)
        store = stack.enter_context(
            promtools.started(
                "victoria-metrics",
                [f"-storageDataPath={self.workdir / 'vm'}", f"-httpListenAddr=127.0.0.1:{store_port}"],
                self.workdir / "store",
                port=store_port,
                ready_path="/health",
            )
        )
        self.write_config(0)
        agent = stack.enter_context(
            promtools.started(
                "vmagent",
                [
                    f"-promscrape.config={self.workdir / 'scrape.yml'}",
                    f"-remoteWrite.url={store.url}/api/v1/write",
                    f"-remoteWrite.tmpDataPath={self.workdir / 'queue'}",
                    f"-httpListenAddr=127.0.0.1:{agent_port}",
                ],
                self.workdir / "agent",
                port=agent_port,
                ready_path="/health",
            )
        )
        self.procs = [agent, store]  # the agent first: it is the one reloaded

    def write_config(self, n: int) -> None:
        configs = [scrape_config(n, self.port, self.interval)] if n else []
        (self.workdir / "scrape.yml").write_text(json.dumps({"scrape_configs": configs}))

    def scrapes_done(self) -> float:
        return metric_sum(self.procs[0].url, "vm_promscrape_scrapes_total")

    def flush(self) -> None:
        time.sleep(2)  # the agent's remote-write flush (1 s) and the store's raw-row buffer
        http(f"{self.procs[1].url}/internal/force_flush")

    def record(self, t0: float, t1: float) -> dict[str, dict[str, list[tuple[float, float]]]]:
        self.flush()
        match = f'{{__name__=~"up|scrape_samples_scraped",job="{JOB}"}}'
        url = f"{self.procs[1].url}/api/v1/export?" + urllib.parse.urlencode(
            {"match[]": match, "start": f"{t0:.3f}", "end": f"{t1:.3f}"}
        )
        rows = []
        for line in http(url).decode().splitlines():
            r = json.loads(line)
            rows.append(
                (r["metric"], [(t / 1000, float(v)) for t, v in zip(r["timestamps"], r["values"], strict=True)])
            )
        return group(rows)

    def storage(self) -> dict[str, Any]:
        """After the agent stops scraping: flush, merge every partition into one part, then sizes."""
        self.write_config(0)
        self.procs[0].process.send_signal(signal.SIGHUP)
        self.flush()
        url = self.procs[1].url
        http(f"{url}/internal/force_merge")
        deadline = time.monotonic() + 120
        time.sleep(1)
        while metric_sum(url, "vm_active_force_merges") > 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)  # the merged-away parts are removed once unreferenced
        data = dir_bytes(self.workdir / "vm" / "data")
        return {
            "samples": int(metric_sum(url, "vm_rows", 'type="storage/')),
            "series": json.loads(http(f"{url}/api/v1/series/count"))["data"][0],
            "bytes": data,
            "bytes_total": data + dir_bytes(self.workdir / "vm" / "indexdb"),
            "what": "data/ after force_merge; total: with indexdb/",
        }


def run_peer(peer: Peer, levels: list[int], interval: float, intervals: int) -> list[dict[str, Any]]:
    out = []
    for n in levels:
        peer.set_targets(n)
        warmup = 0
        while True:
            before = peer.scrapes_done()
            time.sleep(interval)
            warmup += 1
            if (warmup >= 2 and peer.scrapes_done() - before >= 0.97 * n) or warmup >= 6:
                break
        cpu0, t0 = peer.cpu(), time.time()
        time.sleep(interval * intervals)
        cpu1, t1 = peer.cpu(), time.time()
        r = {"targets": n, "warmup_intervals": warmup, **tally(peer.record(t0, t1), n, t0, t1, interval)}
        r["cpu_s"] = cpu1 - cpu0
        r["wall_s"] = t1 - t0
        out.append(level_row(peer.name, r))
        if r["missed"] or r["failed"]:
            break
    return out


def run_fleetscope(
    port: int, levels: list[int], interval: float, intervals: int, tmp: Path
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from collector.writer import Writer, WriterConfig
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    client = connect(f"chdb:{tmp}/ch")
    clickhouse_runner.apply(client)
    writer = Writer(client, WriterConfig(spool_dir=tmp / "spool"))
    writer.start()
    out = []
    for n in levels:
        r = asyncio.run(run_level(n, port, interval, intervals, writer))
        wall = interval * intervals  # run_level's measured period
        row = {
            "targets": n,
            "warmup_intervals": r["warmup_intervals"],
            "scrapes": r["scrapes"],
            "missed": r["missed"],
            "failed": r["failed"],
            "samples": round(r["samples_per_s"] * wall),
            "cpu_s": r["cpu"] * wall,
            "wall_s": wall,
        }
        out.append(level_row("fleetscope", row))
        if r["missed"] or r["failed"]:
            break
    writer.close()
    client.command("OPTIMIZE TABLE samples FINAL")
    parts = dict(
        (table, (int(b), int(rows)))
        for table, b, rows in client.query(
            "SELECT table, sum(bytes_on_disk), sum(rows) FROM system.parts WHERE active "
            "AND database = currentDatabase() AND table IN ('samples', 'series') GROUP BY table"
        ).result_rows
    )
    series = int(client.query("SELECT uniqExact(fingerprint) FROM samples").result_rows[0][0])
    client.close()
    storage = {
        "samples": parts["samples"][1],
        "series": series,
        "bytes": parts["samples"][0],
        "bytes_total": parts["samples"][0] + parts.get("series", (0, 0))[0],
        "what": "samples after OPTIMIZE FINAL; total: with the series table",
    }
    return out, storage


def level_row(system: str, r: dict[str, Any]) -> dict[str, Any]:
    r["cpu_s_per_m"] = r["cpu_s"] / r["samples"] * 1e6 if r["samples"] else float("nan")
    print(
        f"{SYSTEMS[system]:<32} {r['targets']:>7} {r['warmup_intervals']:>7} {r['scrapes']:>8} {r['missed']:>6} "
        f"{r['failed']:>6} {r['samples']:>11,} {r['cpu_s']:>7.1f} {r['cpu_s'] / r['wall_s']:>6.0%} {r['cpu_s_per_m']:>8.2f}",
        flush=True,
    )
    return r


def summarize(systems: dict[str, dict[str, Any]]) -> dict[str, Any]:
    sustained = {s: r["sustained"] for s, r in systems.items()}
    common = min(sustained.values())

    def at(s: str, n: int) -> float | None:
        return next((r["cpu_s_per_m"] for r in systems[s]["levels"] if r["targets"] == n), None)

    cpu_common = {s: at(s, common) for s in systems} if common else {}
    cpu_best = {s: at(s, n) if n else None for s, n in sustained.items()}
    bps = {s: r["storage"]["bytes"] / r["storage"]["samples"] for s, r in systems.items() if r["storage"]["samples"]}
    bps_total = {
        s: r["storage"]["bytes_total"] / r["storage"]["samples"] for s, r in systems.items() if r["storage"]["samples"]
    }

    def ratios(values: dict[str, float | None]) -> dict[str, float | None]:
        ours = values.get("fleetscope")
        return {
            peer: (ours / values[peer]) if ours and values.get(peer) else None  # type: ignore[operator]
            for peer in ("prometheus", "victoriametrics")
        }

    def fmt(v: float | None, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    print(
        f"\n{'':<32} {'sustained':>9} {f'CPU-s/1M at {common}':>16} {'CPU-s/1M at sustained':>22} {'B/sample':>9} {'total':>7} {'samples/series':>14}"
    )
    for s in systems:
        print(
            f"{SYSTEMS[s]:<32} {sustained[s]:>9} {fmt(cpu_common.get(s)):>16} {fmt(cpu_best[s]):>22} "
            f"{fmt(bps.get(s)):>9} {fmt(bps_total.get(s)):>7} "
            f"{systems[s]['storage']['samples'] / max(1, systems[s]['storage']['series']):>14.1f}"
        )
    result = {
        "sustained": sustained,
        "common_level": common,
        "cpu_s_per_m_at_common": cpu_common,
        "cpu_s_per_m_at_sustained": cpu_best,
        "bytes_per_sample": bps,
        "bytes_per_sample_total": bps_total,
        "ratios": {
            "cpu_at_common": ratios(cpu_common),
            "cpu_at_sustained": ratios(cpu_best),
            "bytes_per_sample": ratios(bps),
            "bytes_per_sample_total": ratios(bps_total),
        },
    }
    for key, label in (
        ("cpu_at_common", f"CPU per sample at {common} targets"),
        ("cpu_at_sustained", "CPU per sample at each one's sustained level"),
        ("bytes_per_sample", "bytes per sample (samples only)"),
        ("bytes_per_sample_total", "bytes per sample (with the series index)"),
    ):
        r = result["ratios"][key]
        print(
            f"fleetscope / Prometheus, {label}: {fmt(r['prometheus'], '.2f')}x; "
            f"fleetscope / VictoriaMetrics: {fmt(r['victoriametrics'], '.2f')}x"
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--levels", default="200,600,1200,2000", help="target counts to try, ascending")
    parser.add_argument(
        "--measure-s", type=float, default=25.0, help="measured period per level, rounded to whole intervals"
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"which to run, of {','.join(SYSTEMS)}")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    intervals = max(1, round(args.measure_s / args.interval))
    began = time.monotonic()

    port, server = start_targets()
    systems: dict[str, dict[str, Any]] = {}
    print(
        f"interval {args.interval:g}s, warm-up then {intervals} measured intervals per level; "
        "CPU-s: the system's processes over the measured period"
    )
    print(
        f"{'system':<32} {'targets':>7} {'warm-up':>7} {'scrapes':>8} {'missed':>6} {'failed':>6} "
        f"{'samples':>11} {'CPU-s':>7} {'cpu':>6} {'CPU-s/1M':>8}"
    )
    try:
        for system in args.systems.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                if system == "fleetscope":
                    rows, storage = run_fleetscope(port, levels, args.interval, intervals, Path(tmp))
                else:
                    peer = {"prometheus": Prometheus, "victoriametrics": VictoriaMetrics}[system](
                        Path(tmp), port, args.interval
                    )
                    with ExitStack() as stack:
                        peer.start(stack)
                        rows = run_peer(peer, levels, args.interval, intervals)
                        storage = peer.storage()
            ok = [r["targets"] for r in rows if not (r["missed"] or r["failed"])]
            systems[system] = {"sustained": max(ok, default=0), "levels": rows, "storage": storage}
    finally:
        server.terminate()
    summary = summarize(systems) if systems else {}
    elapsed = time.monotonic() - began
    print(f"run time {elapsed:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "interval_s": args.interval,
                    "measured_s": intervals * args.interval,
                    "levels": levels,
                    "systems": systems,
                    "summary": summary,
                    "run_s": elapsed,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
