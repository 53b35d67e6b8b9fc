"""The collector process: scraper + OTLP/gateway receiver -> converter/sampler -> writer.

In:  targets (static and ``file_sd``; with ``CollectorConfig.shard`` only this collector's
     hashmod share of them), OTLP trace exports (HTTP ``POST /v1/traces`` protobuf or
     JSON, gRPC ``TraceService/Export``), fleetscope's gateway request log (``POST /v1/requests``,
     JSON lines), other gateways' request telemetry: their GenAI spans (in the trace exports),
     OTLP logs (``POST /v1/logs``: Envoy's access log) and LiteLLM's ``generic_api`` records
     (``POST /v1/litellm``), made rows by ``collector.mapping``; Prometheus remote-write 1.0
     (``POST /api/v1/write``, from Prometheus, vmagent ...: ``collector.remote_write``).
Out: rows handed to the ``Writer`` (``samples``, ``series``, ``scrapes``, ``requests``; OTLP protobuf
     bodies as they came, for ClickHouse to decode into ``requests``, where it can: ``otlp_native``); the
     collector's own Prometheus metrics at ``GET /metrics`` and ``GET /healthz`` on the same
     HTTP port as the OTLP receiver.

Bad input gets a clear answer and a counted error, never a crash: an undecodable OTLP body
is 400 with the reason; a request-log body returns which lines were refused and why; a gateway
record no mapping knows is counted (``fleetscope_collector_gateway_records_total{result="unmapped"}``)
and its shape logged once; one a mapping matched but cannot make a row of is refused with the
reason (OTLP ``partial_success``, or the answer's ``rejected`` list). A remote-write body that
will never be good is 4xx with the reason (the sender drops it); while the writer's spool is
nearly full it is 503 (the sender keeps the samples and retries).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from collector import otlp_native
from collector.config import GRPC_PORT, HTTP_PORT, LISTEN_HOST, MAX_BODY_BYTES
from collector.convert import Batch, SeriesConverter
from collector.mapping import DEFAULT_MAPPINGS, Backends, MappingError, Record, RequestMapping, map_record
from collector.otlp import OtlpError, SpanRecord, decode_json, request_columns, request_row
from collector.own_metrics import CollectorMetrics
from collector.records import (
    GENAI_MARK,
    litellm_records,
    log_records,
    log_records_json,
    span_records,
    spans_to_records,
)
from collector.remote_intake import RemoteWriteReceiver
from collector.remote_write import RemoteWriteConfig, RemoteWriteConverter
from collector.request_columns import REQUEST_COLUMNS, fill_columns, fill_row
from collector.requestlog import parse_request_log
from collector.sampling import Sampler, SamplingPolicy
from collector.scrape import Scraper, ScrapeResult
from collector.targets import FileDiscovery, Shard, Target
from collector.writer import Writer

__all__ = ["REQUEST_COLUMNS", "Collector", "CollectorConfig"]

log = logging.getLogger("fleetscope.collector")

MAX_OTLP_BODY = 32 * 1024 * 1024  # also the limit after gzip/deflate decoding
RECENT_REQUESTS = 200_000  # gateway request ids remembered: a batch a sender retries is not stored twice


@dataclass
class CollectorConfig:
    host: str = LISTEN_HOST
    http_port: int = HTTP_PORT
    grpc_port: int = GRPC_PORT  # 0: no gRPC receiver
    static_targets: list[Target] = field(default_factory=list)
    file_sd: list[FileDiscovery] = field(default_factory=list)
    file_sd_poll_s: float = 5.0
    shard: Shard = field(default_factory=Shard)  # scrape only this share of the targets
    max_body_bytes: int = MAX_BODY_BYTES
    sampling: SamplingPolicy = field(default_factory=SamplingPolicy)
    # who decodes OTLP protobuf bodies: ClickHouse (collector.otlp_native, where the store can) or Python
    otlp_decode: str = "clickhouse"
    # fingerprint -> last stored value: the previous sample for the first reset check after a restart
    prior: dict[int, float] = field(default_factory=dict)
    # other gateways' request telemetry: the user's mappings, tried before the shipped ones named here
    request_mappings: list[RequestMapping] = field(default_factory=list)
    shipped_mappings: tuple[str, ...] = ("litellm", "envoy", "genai")
    # Prometheus remote-write in: which labels name a replica, the largest decoded body
    remote_write: RemoteWriteConfig = field(default_factory=RemoteWriteConfig)


@dataclass
class GatewayIntake:
    """What became of one body's gateway records."""

    kept: int = 0
    unmapped: int = 0
    duplicates: int = 0  # a gateway's request id seen again (a batch sent twice)
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (record number, reason)

    def answer(self) -> dict[str, Any]:
        return {
            "kept": self.kept,
            "unmapped": self.unmapped,
            "duplicates": self.duplicates,
            "rejected": [{"record": n, "error": e} for n, e in self.rejected[:100]],
        }


class Collector:
    def __init__(self, config: CollectorConfig, writer: Writer, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        self.writer = writer
        self.registry = registry if registry is not None else CollectorRegistry()
        self.scraper: Scraper | None = None
        self.metrics = CollectorMetrics(self.registry, lambda: len(self.scraper.targets) if self.scraper else 0)
        self.sampler = Sampler(config.sampling)
        self.native_otlp = False  # decided at start: config.otlp_decode and what the store can
        self._otlp_settings: dict[str, str] = {}
        self._converters: dict[str, SeriesConverter] = {}
        self._runner: web.AppRunner | None = None
        self._grpc: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self.renamed: dict[str, str] = {}
        self.remote_write = RemoteWriteReceiver(
            RemoteWriteConverter(config.remote_write, config.prior), writer, self.metrics, self._body, self.renamed
        )
        self._up: dict[str, bool] = {}
        self.mappings: tuple[RequestMapping, ...] = (
            *config.request_mappings,
            *(m for m in DEFAULT_MAPPINGS if m.name in config.shipped_mappings),
        )
        self.backends = Backends()  # a gateway's backend address -> (replica, model), from the targets
        self._shapes: set[frozenset[str]] = set()  # unmapped record shapes already logged
        self._recent: OrderedDict[tuple[str, str], None] = OrderedDict()  # (gateway, request id) kept lately
        # more routes on the same HTTP server (e.g. the read-only SQL endpoint of adhoc.endpoint)
        self.mounts: list[Callable[[web.Application], None]] = []

    # ------------------------------------------------------------------ scrapes
    def on_scrape(self, result: ScrapeResult) -> None:
        try:
            self._on_scrape(result)
        except Exception:
            log.exception("could not store the scrape of %s", result.target.url)

    def _on_scrape(self, result: ScrapeResult) -> None:
        converter = self._converters.get(result.target.key)
        if converter is None:
            converter = self._converters[result.target.key] = SeriesConverter(self.config.prior)
        batch = Batch()
        converter.convert(result, batch)
        self.renamed.update(converter.renamed)
        self.writer.add_tables(batch.tables)  # one scrape's rows are spooled together
        self.metrics.scrapes.labels(result.target.job, "ok" if result.up else "failed").inc()
        self.metrics.samples.inc(result.samples)
        was_up = self._up.get(result.target.key)
        if was_up is not result.up:  # log changes, not every failed scrape
            self._up[result.target.key] = result.up
            if not result.up:
                log.warning("target %s is down: %s", result.target.url, result.error)
            elif was_up is False:
                log.info("target %s is up again", result.target.url)

    def all_targets(self) -> list[Target]:
        """Every known target (static and ``file_sd``), whichever shard scrapes it."""
        found = list(self.config.static_targets)
        for discovery in self.config.file_sd:
            found.extend(discovery.targets)
        unique = {t.key: t for t in found}
        return list(unique.values())

    def targets(self) -> list[Target]:
        """The targets this collector scrapes: its shard of ``all_targets()``."""
        return self.config.shard.select(self.all_targets())

    def _set_targets(self) -> None:
        known = self.all_targets()
        self.backends.update(
            (t.instance, t.replica, dict(t.labels).get("model", "")) for t in known if dict(t.labels).get("replica")
        )
        mine = self.config.shard.select(known)
        log.info("%s: scraping %d of %d targets", self.config.shard, len(mine), len(known))
        if self.scraper is not None:
            self.scraper.set_targets(mine)

    async def _watch_file_sd(self) -> None:
        while True:
            changed = False
            for discovery in self.config.file_sd:
                if discovery.poll():
                    changed = True
                    log.info("file_sd %s: %d targets", discovery.path, len(discovery.targets))
                elif discovery.error:
                    log.error("file_sd %s: %s (keeping the last good targets)", discovery.path, discovery.error)
            if changed:
                self._set_targets()
            await asyncio.sleep(self.config.file_sd_poll_s)

    # ------------------------------------------------------------------ requests
    def add_requests(self, rows: list[dict[str, Any]], source: str) -> int:
        kept: dict[str, list[Any]] = {name: [] for name in REQUEST_COLUMNS}
        count = 0
        for row in rows:
            weight = self.sampler.weight(row)
            if weight is None:
                self.metrics.requests.labels(source, "sampled_out").inc()
                continue
            row["weight"] = weight
            fill_row(row)  # a source without the quality fields: not evaluated
            for name in REQUEST_COLUMNS:
                kept[name].append(row[name])
            count += 1
        if count:
            self.writer.add("requests", kept)
            self.metrics.requests.labels(source, "kept").inc(count)
        return count

    def add_request_columns(self, columns: dict[str, list[Any]], source: str) -> int:
        """Rows as columns (``REQUEST_COLUMNS`` but ``weight``; the quality ones may be left out: not
        evaluated); sampled like ``add_requests``."""
        n = len(columns["ts"])
        if not n:
            return 0
        fill_columns(columns, n)
        if not self.sampler.keeps_everything:  # per-row decisions (shared with the gateway's rows)
            return self.add_requests(
                [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)], source
            )
        columns["weight"] = [1.0] * n
        self.writer.add("requests", {name: columns[name] for name in REQUEST_COLUMNS})
        self.metrics.requests.labels(source, "kept").inc(n)
        return n

    def add_gateway_records(self, records: list[Record], endpoint: str, first: int = 1) -> GatewayIntake:
        """Other gateways' records -> request rows by the mappings (``source = 'gateway'``), their
        backend resolved to a replica and its model by the scrape targets."""
        intake = GatewayIntake()
        rows: list[dict[str, Any]] = []
        for number, record in enumerate(records, first):
            try:
                row = map_record(record, self.mappings)
                if row is not None:
                    replica, model = self.backends.resolve(row["replica"])
                    row["replica"] = replica
                    if model and row["model"].endswith("/" + model):  # e.g. LiteLLM's hosted_vllm/tiny-small
                        row["model"] = model
            except MappingError as exc:
                intake.rejected.append((number, str(exc)))
                continue
            except Exception as exc:
                log.exception("%s: record %d could not be mapped", endpoint, number)
                intake.rejected.append((number, f"could not be mapped ({type(exc).__name__}); see the collector's log"))
                continue
            if row is None:
                intake.unmapped += 1
                self._log_shape(record, endpoint)
                continue
            key = (row["gateway"], row["request_id"])
            if row["request_id"] and key in self._recent:  # the same record again (a sender's retry)
                intake.duplicates += 1
                continue
            if row["request_id"]:
                self._recent[key] = None
                if len(self._recent) > RECENT_REQUESTS:
                    self._recent.popitem(last=False)
            rows.append(row)
        intake.kept = self.add_requests(rows, "gateway") if rows else 0
        for result, n in (
            ("mapped", len(rows)),
            ("unmapped", intake.unmapped),
            ("rejected", len(intake.rejected)),
            ("duplicate", intake.duplicates),
        ):
            if n:
                self.metrics.gateway_records.labels(endpoint, result).inc(n)
        if intake.rejected:
            number, reason = intake.rejected[0]
            log.warning("%s: %d records refused, e.g. record %d: %s", endpoint, len(intake.rejected), number, reason)
        return intake

    def _log_shape(self, record: Record, endpoint: str) -> None:
        keys = frozenset(k for k in record.attrs if not k.startswith(("resource.", "span.", "log.")))
        if keys in self._shapes or len(self._shapes) >= 50:
            return
        self._shapes.add(keys)
        log.warning(
            "%s: a %s record no request mapping knows (collector.request_mappings; docs/gateways.md), keys: %s",
            endpoint,
            record.carrier,
            ", ".join(sorted(keys)[:30]) or "(none)",
        )

    def _request_span(self, record: Record) -> bool:
        """A span that tells of a request: it has a GenAI attribute, or a user's mapping knows it
        (any other span, e.g. an HTTP server's, is only counted)."""
        if record.attrs.get("resource.fleetscope.request_rows") == "off":  # e.g. LiteLLM's, whose rows come otherwise
            return False
        return any(key.startswith("gen_ai.") for key in record.attrs) or any(
            m.matches(record.carrier, record.attrs) for m in self.config.request_mappings
        )

    def on_gateway_spans(self, message: ExportTraceServiceRequest) -> GatewayIntake:
        """The GenAI spans of a decoded export (not ``llm_request``) -> gateway rows."""
        records = [r for r in span_records(message) if self._request_span(r)]
        return self.add_gateway_records(records, "traces") if records else GatewayIntake()

    def on_protobuf(self, body: bytes) -> GatewayIntake:
        """An OTLP protobuf export body -> request rows: its ``llm_request`` spans handed to
        ClickHouse to decode where it can and nothing is sampled out (``collector.otlp_native``),
        else decoded here; its GenAI spans made gateway rows. Raises ``OtlpError`` for a body
        that is not an export. Returns what became of the gateway spans."""
        if self.native_otlp and self.sampler.keeps_everything:
            llm, other = otlp_native.check(body)
            self.metrics.spans.labels("other").inc(other)
            self.metrics.spans.labels("llm_request").inc(llm)
            if llm:
                self.writer.add_raw(
                    otlp_native.TABLE, (otlp_native.prefix(body), body), llm, otlp_native.FORMAT, self._otlp_settings
                )
                self.metrics.requests.labels("otlp", "kept").inc(llm)
            return self._gateway_spans_of(body, other)
        columns, other = request_columns(body)
        self.metrics.spans.labels("other").inc(other)
        self.metrics.spans.labels("llm_request").inc(len(columns["ts"]))
        self.add_request_columns(columns, "otlp")
        return self._gateway_spans_of(body, other)

    def _gateway_spans_of(self, body: bytes, other: int) -> GatewayIntake:
        # the body is read again only when it has spans besides llm_request and a GenAI attribute
        if not other or (GENAI_MARK not in body and not self.config.request_mappings):
            return GatewayIntake()
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)  # already parsed once: cannot fail here
        return self.on_gateway_spans(message)

    def on_spans(self, spans: list[SpanRecord]) -> GatewayIntake:
        """Decoded spans (OTLP/JSON, gRPC) -> engine rows and gateway rows."""
        rows = []
        for span in spans:
            row = request_row(span)
            if row is None:
                self.metrics.spans.labels("other").inc()
            else:
                self.metrics.spans.labels("llm_request").inc()
                rows.append(row)
        self.add_requests(rows, "otlp")
        records = [r for r in spans_to_records(spans) if self._request_span(r)]
        return self.add_gateway_records(records, "traces") if records else GatewayIntake()

    # ------------------------------------------------------------------ HTTP
    async def _body(self, request: web.Request) -> bytes:
        """The request body, decoded (aiohttp inflates gzip/deflate and enforces the size cap
        on the inflated size, so a compression bomb is refused)."""
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise OtlpError(f"body larger than {MAX_OTLP_BODY} bytes (after decompression)") from None
        except (RequestPayloadError, HttpProcessingError) as exc:  # e.g. a gzip body that is no gzip
            raise OtlpError(f"the body cannot be read as its Content-Encoding says: {exc}") from None

    async def handle_traces(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            if request.content_type == "application/json":
                intake = self.on_spans(decode_json(body))
            else:
                intake = self.on_protobuf(body)
        except (OtlpError, OSError, RecursionError, OverflowError) as exc:
            self.metrics.bad_bodies.labels("traces").inc()
            return web.json_response({"error": str(exc)}, status=400)
        response = ExportTraceServiceResponse()
        if intake.rejected:  # OTLP's partial success: the sender logs how many and why
            response.partial_success.rejected_spans = len(intake.rejected)
            response.partial_success.error_message = _why(intake)
        return _otlp_answer(request, response)

    async def handle_logs(self, request: web.Request) -> web.Response:
        """OTLP logs (Envoy's OpenTelemetry access log): each record a gateway row by the mappings."""
        try:
            body = await self._body(request)
            json_body = request.content_type == "application/json"
            records = log_records_json(body) if json_body else log_records(body)
        except (OtlpError, OSError, RecursionError, OverflowError) as exc:
            self.metrics.bad_bodies.labels("logs").inc()
            return web.json_response({"error": str(exc)}, status=400)
        intake = self.add_gateway_records(records, "logs")
        response = ExportLogsServiceResponse()
        if intake.rejected or intake.unmapped:
            response.partial_success.rejected_log_records = len(intake.rejected) + intake.unmapped
            response.partial_success.error_message = _why(intake)
        return _otlp_answer(request, response)

    async def handle_litellm(self, request: web.Request) -> web.Response:
        """LiteLLM's ``generic_api`` callback: StandardLoggingPayload records (JSON array or NDJSON)."""
        try:
            body = await self._body(request)
        except (OtlpError, OSError) as exc:
            self.metrics.bad_bodies.labels("litellm").inc()
            return web.json_response({"error": str(exc)}, status=400)
        records, errors = litellm_records(body)
        intake = self.add_gateway_records(records, "litellm")
        if errors:
            self.metrics.bad_bodies.labels("litellm").inc()
        answer = intake.answer()
        answer["accepted"] = len(records)
        answer["rejected"] = [{"record": n, "error": e} for n, e in errors[:100]] + answer["rejected"]
        return web.json_response(answer, status=400 if errors and not records else 200)

    async def handle_request_log(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
        except (OtlpError, OSError) as exc:
            self.metrics.bad_bodies.labels("requests").inc()
            return web.json_response({"error": str(exc)}, status=400)
        rows, errors = parse_request_log(body)
        kept = self.add_requests(rows, "gateway")
        if errors:
            self.metrics.bad_bodies.labels("requests").inc()
        status = 400 if errors and not rows else 200
        return web.json_response(
            {"accepted": len(rows), "kept": kept, "rejected": [{"line": n, "error": e} for n, e in errors[:100]]},
            status=status,
        )

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_health(self, _request: web.Request) -> web.Response:
        count, size = self.writer.spool_size()
        return web.json_response(
            {
                "status": "ok",
                "targets": len(self.scraper.targets) if self.scraper else 0,
                "spool_batches": count,
                "spool_bytes": size,
            }
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_OTLP_BODY)
        app.router.add_post("/v1/traces", self.handle_traces)
        app.router.add_post("/v1/requests", self.handle_request_log)
        app.router.add_post("/v1/logs", self.handle_logs)
        app.router.add_post("/v1/litellm", self.handle_litellm)
        app.router.add_post("/api/v1/write", self.remote_write.handle)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/healthz", self.handle_health)
        for mount in self.mounts:
            mount(app)
        return app

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        for discovery in self.config.file_sd:
            discovery.poll()
            if discovery.error:
                log.error("file_sd %s: %s", discovery.path, discovery.error)
        if self.config.otlp_decode == "clickhouse":
            self.native_otlp = await asyncio.to_thread(otlp_native.supported, self.writer.client)
            self._otlp_settings = otlp_native.settings_for(self.writer.client)
            if not self.native_otlp:
                log.warning(
                    "the store cannot decode OTLP bodies (it needs format_schema_source, ClickHouse 25.8+, and "
                    "migration 0010): the collector decodes them (slower; collector.otlp_decode: python says so)"
                )
        self.scraper = Scraper(self.on_scrape, max_body_bytes=self.config.max_body_bytes)
        self._set_targets()
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.host, self.config.http_port).start()
        if self.config.grpc_port:
            self._grpc = await _start_grpc(self, self.config.host, self.config.grpc_port)
        if self.config.file_sd:
            self._tasks.append(asyncio.create_task(self._watch_file_sd()))
        self.writer.start()

    async def stop_scraping(self) -> None:
        """Stop scraping (and watching ``file_sd``) but keep receiving: before a fleet this process
        started is stopped, so its last request logs still arrive and its gone targets are not reported down."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        if self.scraper is not None:
            await self.scraper.close()
            self.scraper = None

    async def stop(self) -> bool:
        """Stop receiving and scraping, then flush the writer. True when nothing is left over."""
        await self.stop_scraping()
        if self._grpc is not None:
            await self._grpc.stop(grace=1)
        if self._runner is not None:
            await self._runner.cleanup()
        return await asyncio.to_thread(self.writer.close)


def _why(intake: GatewayIntake) -> str:
    parts = []
    if intake.rejected:
        number, reason = intake.rejected[0]
        parts.append(f"{len(intake.rejected)} records could not be made request rows, e.g. record {number}: {reason}")
    if intake.unmapped:
        parts.append(f"{intake.unmapped} records no request mapping knows (collector.request_mappings)")
    return "; ".join(parts)


def _otlp_answer(request: web.Request, response: Any) -> web.Response:
    """An OTLP export response in the request's encoding (protobuf, or OTLP/JSON)."""
    if request.content_type == "application/json":
        from google.protobuf.json_format import MessageToDict

        return web.json_response(MessageToDict(response))
    return web.Response(body=response.SerializeToString(), content_type="application/x-protobuf")


async def _start_grpc(collector: Collector, host: str, port: int) -> Any:
    """OTLP/gRPC ``TraceService/Export`` on ``port`` (needs grpcio)."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    from collector.otlp import spans_from_message

    class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
        async def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's own name
            if collector.native_otlp:  # the same path as an HTTP body: C++ serialises it back in microseconds
                collector.on_protobuf(request.SerializeToString())
            else:
                collector.on_spans(spans_from_message(request))
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)  # type: ignore[no-untyped-call]
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    await server.start()
    return server
