"""Benchmark: request-log ingest through OTLP into ClickHouse — spans per second per core.

vLLM's ``llm_request`` spans (the attributes vLLM 0.32 sets, 512 spans per export as its
BatchSpanProcessor sends them) are posted as OTLP/HTTP protobuf by a client process to the
real collector (``collector.service``: HTTP receiver -> OTLP decoder -> sampler -> writer)
running in this process and writing to a temporary chDB store, request-log rollup views
included. The figure is spans per CPU-second of the collector process (collector and chDB
both run in it), measured until every row is in ClickHouse and counted there.

Seven runs. Six with the collector: the bodies decoded by ClickHouse (``collector.otlp_native``: the collector checks and
counts each body, chDB parses it with its Protobuf input format and a view flattens it) or by
the collector in Python (``collector.otlp_decode: python``, the path before), each

- into the in-process chDB store with its rollups (collector and store share the process:
  the figure counts both);
- into a Null sink in the same process (``requests`` a Null table: the collector's work and
  ClickHouse's parsing and flattening stay, nothing is stored);
- into a Null sink in **another process**, as when ClickHouse runs on other hosts (the anchors'
  set-up): a real chDB owns the store there and the collector's client hands it each insert
  through a pipe (``RemoteStore``, named as such: it stands in for a ClickHouse server, which
  cannot run here; a pipe write costs the collector about what an HTTP POST of the same bytes
  does). The figure is the collector's own CPU; the store's is printed beside it.

The seventh is chDB alone: the same bodies inserted straight into the same store (raw +
rollups), no HTTP and no collector, which is what the in-process store costs anyway; the
collector's overhead is its run's CPU per span above that one's.

The reference beside them, on the same bodies in the same run, is a generic exporter path
written the obvious way: protobuf -> ``json_format.MessageToDict`` -> one dict per span ->
``client.insert`` of row tuples (what a hand-rolled OTLP-to-ClickHouse bridge does). The
OpenTelemetry Collector with the ClickHouse exporter (~137k spans/s per core) and Rotel
(~462k) are named beside them from ClickHouse's published benchmark: they cannot run here.
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def make_bodies(count: int, spans: int, seed: int = 1) -> list[bytes]:
    """OTLP export requests shaped like vLLM's: one resource per engine, ``llm_request`` spans."""
    import random

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    rng = random.Random(seed)

    def kv(key: str, value: object) -> KeyValue:
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        if isinstance(value, float):
            return KeyValue(key=key, value=AnyValue(double_value=value))
        return KeyValue(key=key, value=AnyValue(string_value=str(value)))

    bodies = []
    now = time.time()
    for b in range(count):
        replica = f"small-{b % 8}"
        out = []
        for _ in range(spans):
            ttft, e2e = rng.uniform(0.02, 0.8), rng.uniform(0.5, 12.0)
            prompt, completion = rng.randint(20, 4000), rng.randint(1, 512)
            start = now - rng.uniform(0, 3600)
            attrs = [
                kv("gen_ai.response.model", "llama-3.1-8b"),
                kv("gen_ai.request.id", f"cmpl-{secrets.token_hex(16)}"),
                kv("gen_ai.request.temperature", 0.7),
                kv("gen_ai.request.top_p", 0.95),
                kv("gen_ai.request.max_tokens", 1024),
                kv("gen_ai.request.n", 1),
                kv("gen_ai.usage.prompt_tokens", prompt),
                kv("gen_ai.usage.completion_tokens", completion),
                kv("gen_ai.latency.time_in_queue", rng.uniform(0, 0.2)),
                kv("gen_ai.latency.time_to_first_token", ttft),
                kv("gen_ai.latency.e2e", e2e),
                kv("gen_ai.latency.time_in_scheduler", 0.001),
                kv("gen_ai.latency.time_in_model_forward", e2e * 0.8),
                kv("gen_ai.latency.time_in_model_execute", e2e * 0.85),
                kv("gen_ai.latency.time_in_model_prefill", ttft * 0.7),
                kv("gen_ai.latency.time_in_model_decode", e2e - ttft),
                kv("gen_ai.latency.time_in_model_inference", e2e * 0.95),
            ]
            out.append(
                Span(
                    name="llm_request",
                    trace_id=secrets.token_bytes(16),
                    span_id=secrets.token_bytes(8),
                    kind=2,
                    start_time_unix_nano=int(start * 1e9),
                    end_time_unix_nano=int((start + e2e) * 1e9),
                    attributes=attrs,
                )
            )
        resource_attrs = [
            kv("service.name", "vllm"),
            kv("service.instance.id", replica),
            kv("fleetscope.replica", replica),
            kv("fleetscope.model", "llama-3.1-8b"),
        ]
        request = ExportTraceServiceRequest(
            resource_spans=[ResourceSpans(resource={"attributes": resource_attrs}, scope_spans=[ScopeSpans(spans=out)])]
        )
        bodies.append(request.SerializeToString())
    return bodies


def post_all(port: int, count: int, spans: int, concurrency: int, done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import aiohttp

    bodies = make_bodies(count, spans)

    async def go() -> None:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        for body in bodies:
            queue.put_nowait(body)
        async with aiohttp.ClientSession() as session:

            async def worker() -> None:
                while not queue.empty():
                    body = queue.get_nowait()
                    async with session.post(
                        f"http://127.0.0.1:{port}/v1/traces",
                        data=body,
                        headers={"Content-Type": "application/x-protobuf"},
                    ) as r:
                        if r.status != 200:
                            raise RuntimeError(f"collector answered {r.status}: {await r.text()}")

            done.put(time.time())  # ready
            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(go())
    done.put(time.time())


def null_sink(client) -> None:
    """Turn ``requests`` into a Null table (its rollup views dropped): the collector's work and
    ClickHouse's parsing of the bodies stay, nothing is stored (as when the store is elsewhere)."""
    for view in ("requests_1m_mv", "requests_1h_mv"):
        client.command(f"DROP VIEW IF EXISTS {view}")
    client.command("CREATE TABLE requests_null AS requests ENGINE = Null")
    client.command("DROP TABLE requests_joined")  # a view over requests
    client.command("DROP TABLE requests")
    client.command("RENAME TABLE requests_null TO requests")


async def ours(
    bodies_count: int, spans: int, concurrency: int, tmp: str, decode: str, sink: str, settled: bool = False
) -> dict:
    from collector.service import Collector, CollectorConfig
    from collector.writer import Writer, WriterConfig
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    path = f"{tmp}/{decode}-{sink}"
    if sink == "remote":
        from bench.remote_store import RemoteStore

        client = RemoteStore(path, null_sink)
    else:
        client = connect(f"chdb:{path}")
        clickhouse_runner.apply(client)
    if sink == "null":
        null_sink(client)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    writer = Writer(client, WriterConfig(spool_dir=Path(path) / "spool", batch_rows=100_000))
    collector = Collector(CollectorConfig(http_port=port, grpc_port=0, otlp_decode=decode), writer)
    await collector.start()
    if collector.native_otlp != (decode == "clickhouse"):
        raise RuntimeError(f"asked for {decode} decoding, the collector chose otherwise")
    done: multiprocessing.Queue = multiprocessing.Queue()
    poster = multiprocessing.Process(target=post_all, args=(port, bodies_count, spans, concurrency, done))
    poster.start()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, done.get)  # bodies built, posting starts
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    await loop.run_in_executor(None, done.get)  # all posted and answered
    expected = bodies_count * spans
    # until every row is in: the writer's own counters watched, the store counted only when they are quiet (a
    # query of the store every 20 ms, ~50 chDB queries a second, was in the collector's clock and not in chDB
    # alone's, which counts once); a batch being cut is in neither counter for a moment, so the count decides
    deadline = time.monotonic() + 120
    stored = -1
    while time.monotonic() < deadline:
        if writer.pending_rows() or writer.spool_size()[0]:
            await asyncio.sleep(0.02)
            continue
        if sink in ("null", "remote"):  # nothing to count: handed over once the counters stay quiet
            await asyncio.sleep(0.2)
            if not (writer.pending_rows() or writer.spool_size()[0]):
                stored = rolled = expected
                break
            continue
        if (stored := int(client.command("SELECT count() FROM requests"))) >= expected:
            break
        await asyncio.sleep(0.1)
    if settled and sink == "chdb":
        settle(client)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    if sink == "chdb":
        rolled = client.command("SELECT sum(rows) FROM requests_1m")
    poster.join()
    await collector.stop()
    store_cpu = client.close()  # the other process's CPU when the store is there
    if stored != expected or rolled != expected:
        raise RuntimeError(f"expected {expected} rows, found {stored} raw / {rolled} in requests_1m")
    return {
        "decode": decode,
        "sink": sink,
        "spans": expected,
        "wall_s": wall,
        "cpu_s": cpu,
        "spans_per_s": expected / wall,
        "spans_per_cpu_s": expected / cpu,
        "store_cpu_s": store_cpu,
    }


def settle(client: Any, limit_s: float = 20.0) -> None:
    """Until the store's merges are done (at most ``limit_s``): their CPU is part of the insert's."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    while time.monotonic() < deadline and quiet < 3:
        busy = int(client.command("SELECT count() FROM system.merges"))
        quiet = 0 if busy else quiet + 1
        time.sleep(0.2)


def _into(queue: Any, fn: Any, args: tuple[Any, ...]) -> None:
    try:
        queue.put(fn(*args))
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        queue.put(exc)


def isolated(fn: Any, *args: Any) -> dict:
    """``fn(*args)`` in a fresh process (spawned): nothing of this process's stores runs in its clock."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_into, args=(queue, fn, args))
    child.start()
    result = queue.get()
    child.join()
    if isinstance(result, BaseException):
        raise result
    return result


def in_process_round(bodies_count: int, spans: int, concurrency: int, tmp: str) -> dict:
    """One in-process run (ClickHouse decodes, chDB with rollups) counting its merges (a fresh process's)."""
    return asyncio.run(ours(bodies_count, spans, concurrency, tmp, "clickhouse", "chdb", settled=True))


def store_alone(bodies_count: int, spans: int, tmp: str, batch_rows: int = 100_000, settled: bool = False) -> dict:
    """chDB's own cost of the same bodies, with no collector: the store the collector writes (raw +
    rollups, migrations applied), the bodies framed as the collector frames them and inserted
    directly (``raw_insert``, as the writer does) in batches of the writer's size; CPU-seconds of
    this process from the first insert until every row is counted, as for the collector's runs."""
    from collector.otlp_native import FORMAT, TABLE, framed, settings_for
    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    client = connect(f"chdb:{tmp}/alone")
    clickhouse_runner.apply(client)
    bodies = make_bodies(bodies_count, spans)
    per = max(1, batch_rows // spans)
    batches = [b"".join(framed(b) for b in bodies[i : i + per]) for i in range(0, len(bodies), per)]
    settings = settings_for(client)
    expected = bodies_count * spans
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    for data in batches:
        client.raw_insert(TABLE, None, insert_block=data, fmt=FORMAT, settings=settings)
    stored = int(client.command("SELECT count() FROM requests"))
    if settled:
        settle(client)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    rolled = client.command("SELECT sum(rows) FROM requests_1m")
    client.close()
    if stored != expected or rolled != expected:
        raise RuntimeError(f"expected {expected} rows, found {stored} raw / {rolled} in requests_1m")
    return {
        "spans": expected,
        "wall_s": wall,
        "cpu_s": cpu,
        "spans_per_s": expected / wall,
        "spans_per_cpu_s": expected / cpu,
    }


def reference(bodies: list[bytes], tmp: str) -> dict:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from migrations import clickhouse_runner
    from storage.clickhouse import connect

    client = connect(f"chdb:{tmp}/ref", database="ref", create_database=True)
    clickhouse_runner.apply(client)
    columns = [
        "ts",
        "source",
        "request_id",
        "trace_id",
        "replica",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "max_tokens",
        "ttft_seconds",
        "e2e_seconds",
        "queue_seconds",
        "prefill_seconds",
        "decode_seconds",
    ]
    from datetime import UTC, datetime

    cpu0, t0, total = cpu_seconds(), time.perf_counter(), 0
    for body in bodies:
        message = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
        rows = []
        for rs in message.get("resourceSpans", []):
            res = {a["key"]: next(iter(a["value"].values())) for a in rs.get("resource", {}).get("attributes", [])}
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    a = {x["key"]: next(iter(x["value"].values())) for x in span.get("attributes", [])}
                    rows.append(
                        (
                            datetime.fromtimestamp(int(span["startTimeUnixNano"]) / 1e9, UTC),
                            "otlp",
                            a.get("gen_ai.request.id", ""),
                            span["traceId"],
                            res.get("fleetscope.replica", ""),
                            res.get("fleetscope.model", ""),
                            int(a.get("gen_ai.usage.prompt_tokens", 0)),
                            int(a.get("gen_ai.usage.completion_tokens", 0)),
                            int(a.get("gen_ai.request.max_tokens", 0)),
                            float(a.get("gen_ai.latency.time_to_first_token", 0)),
                            float(a.get("gen_ai.latency.e2e", 0)),
                            float(a.get("gen_ai.latency.time_in_queue", 0)),
                            float(a.get("gen_ai.latency.time_in_model_prefill", 0)),
                            float(a.get("gen_ai.latency.time_in_model_decode", 0)),
                        )
                    )
        client.insert("requests", rows, column_names=columns)
        total += len(rows)
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    stored = client.command("SELECT count() FROM requests")
    client.close()
    assert stored == total
    return {"spans": total, "wall_s": wall, "cpu_s": cpu, "spans_per_s": total / wall, "spans_per_cpu_s": total / cpu}


RUNS = (
    ("clickhouse", "remote", "ClickHouse decodes, store in another process: collector alone"),
    ("clickhouse", "null", "ClickHouse decodes -> in-process Null sink (collector + parse)"),
    ("clickhouse", "chdb", "ClickHouse decodes -> in-process chDB (raw + rollups)"),
    ("python", "remote", "Python decodes, store in another process: collector alone"),
    ("python", "null", "Python decodes -> in-process Null sink"),
    ("python", "chdb", "Python decodes -> in-process chDB (raw + rollups)"),
)
ANCHORS = (
    "OpenTelemetry Collector + ClickHouse exporter ~137,000 spans/s per core; Rotel (Rust) ~462,000 per core "
    "(ClickHouse's published tracing-pipeline benchmark; they cannot run here)"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", type=int, default=400, help="OTLP export requests to send")
    parser.add_argument("--spans", type=int, default=512, help="spans per export request")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="in-process runs and chDB-alone runs alternated")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for decode, sink, _label in RUNS:
            results[f"{decode}-{sink}"] = asyncio.run(
                ours(args.bodies, args.spans, args.concurrency, tmp, decode, sink)
            )
        # the overhead, robust to this machine's drift: the in-process run and chDB alone alternate
        # for --rounds rounds, each in a fresh process (no merge of one run lands in the next one's
        # clock) and each counting its store's merges until they settle; medians compared
        paired = []
        for i in range(args.rounds):
            mine = isolated(in_process_round, args.bodies, args.spans, args.concurrency, f"{tmp}/r{i}")
            theirs = isolated(store_alone, args.bodies, args.spans, f"{tmp}/a{i}", 100_000, True)
            paired.append((mine["spans_per_cpu_s"], theirs))
        alone = paired[0][1] | {"spans_per_cpu_s": statistics.median(a["spans_per_cpu_s"] for _c, a in paired)}
        collector_median = statistics.median(c for c, _a in paired)
        ref_bodies = make_bodies(max(args.bodies // 4, 1), args.spans, seed=1)
        ref = reference(ref_bodies, tmp)
    print(
        f"{args.bodies} OTLP/HTTP protobuf exports x {args.spans} llm_request spans, "
        f"{args.concurrency} concurrent senders (another process)"
    )
    print(f"{'path':<66} {'spans/s':>10} {'spans/CPU-s':>12}  {'store process':>14}")
    for decode, sink, label in RUNS:
        r = results[f"{decode}-{sink}"]
        store = f"{r['spans'] / r['store_cpu_s']:>10,.0f}/CPU-s" if r["store_cpu_s"] else ""
        print(f"{label:<66} {r['spans_per_s']:>10,.0f} {r['spans_per_cpu_s']:>12,.0f}  {store:>14}")
    label = "chDB alone: the same bodies inserted directly (raw + rollups; median)"
    print(f"{label:<66} {alone['spans_per_s']:>10,.0f} {alone['spans_per_cpu_s']:>12,.0f}")
    label = "reference: protobuf -> MessageToDict -> insert row tuples"
    print(f"{label:<66} {ref['spans_per_s']:>10,.0f} {ref['spans_per_cpu_s']:>12,.0f}")
    for sink, where in (("remote", "collector alone"), ("chdb", "with the in-process store")):
        native, python = results[f"clickhouse-{sink}"], results[f"python-{sink}"]
        print(
            f"per CPU-second, {where}: ClickHouse decoding {native['spans_per_cpu_s'] / python['spans_per_cpu_s']:.1f}x "
            f"Python decoding, {native['spans_per_cpu_s'] / ref['spans_per_cpu_s']:.1f}x the generic reference"
        )
    overhead = alone["spans_per_cpu_s"] / collector_median - 1
    each = ", ".join(f"{a['spans_per_cpu_s'] / c - 1:+.1%}" for c, a in paired)
    print(
        f"the collector's overhead above chDB's own insert of the same bodies (in-process store, CPU per span; "
        f"medians of {len(paired)} alternating rounds: {collector_median:,.0f} vs {alone['spans_per_cpu_s']:,.0f}): "
        f"{overhead * 100:+.1f}% (each round: {each})"
    )
    print(ANCHORS)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "ours": native,
                    "runs": results,
                    "reference": ref,
                    "store_alone": alone,
                    "collector_overhead_over_store": overhead,
                    "overhead_rounds": [{"collector": c, "store_alone": a["spans_per_cpu_s"]} for c, a in paired],
                    "bodies": args.bodies,
                    "spans": args.spans,
                    "anchors": ANCHORS,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
