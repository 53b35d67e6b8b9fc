"""The gateway: OpenAI-compatible proxy in front of the replicas, with routing, admission and a
request log.

In:  ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming SSE or not) with
     headers ``x-tenant``, ``x-session-id`` and ``traceparent`` (created when missing);
     ``GET /v1/models``, ``GET /health``, ``GET /metrics``; from loopback only, the admin API
     (``fleet.gateway.admin``: replicas added, drained and removed at runtime).
Out: the replica's answer, streamed through event by event; one request-log record per request
     shipped to the collector (``RequestLogShipper``), a sampled answer's scores in it
     (``fleet.gateway.quality``: no text unless ``quality.keep_text``), a sample of the model
     router's decisions replayed in shadow on the other model (``fleet.gateway.audit``: each
     shadow a logged request of the audit's tenant); its own metrics under
     ``fleetscope_gateway_``. Rejections are honest: 429 with ``Retry-After`` (tenant over its
     rate, queue full, no slot in time), 503 when no healthy replica serves the model, 504 when
     the replica sends no byte within ``upstream_first_byte_timeout_s`` (or falls silent that
     long inside a stream) or does not finish within ``upstream_timeout_s``: its slot is freed
     (a wedged engine cannot hold the gateway's slots). Each is a logged request too, its
     ``error`` saying why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from fleet.gateway.admission import Admission, Rejected
from fleet.gateway.audit import RouterAudit
from fleet.gateway.config import GatewaySpec
from fleet.gateway.quality import AnswerCapture, Quality
from fleet.gateway.queue_time import QueueTime
from fleet.gateway.requestlog import RequestLogShipper
from fleet.gateway.routing import NoReplica, ReplicaState, Router, prefix_hash

__all__ = ["Gateway"]

log = logging.getLogger("fleetscope.gateway")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)


def _traceparent(header: str | None) -> tuple[str, str]:
    """(trace id, traceparent to forward): keep a valid incoming one, else start a trace."""
    if header:
        parts = header.strip().split("-")
        if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
            try:
                int(parts[1], 16)
                return parts[1].lower(), header.strip()
            except ValueError:
                pass
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{secrets.token_hex(8)}-01"


def _prompt_info(body: dict[str, Any], chat: bool, prefix_tokens: int) -> tuple[int, str]:
    """(estimated prompt tokens, affinity/prefix key). Token-id prompts are exact; text is
    estimated at 4 bytes per token (the gateway does not tokenize)."""
    if chat:
        text = "".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
        return max(1, len(text.encode()) // 4), text[: prefix_tokens * 4]
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt), ",".join(map(str, prompt[:prefix_tokens]))
    if isinstance(prompt, list):
        prompt = "".join(p if isinstance(p, str) else "" for p in prompt)
    text = str(prompt)
    return max(1, len(text.encode()) // 4), text[: prefix_tokens * 4]


@dataclass
class _Record:
    ts: float
    trace_id: str
    tenant: str
    session: str
    stream: bool
    prompt_tokens: int
    max_tokens: int
    prefix_hash: int
    model: str = ""
    replica: str = ""
    route: str = ""
    route_reason: str = ""
    status_code: int = 200
    outcome: str = "ok"
    error: str = ""
    finish_reason: str = ""
    request_id: str = ""
    completion_tokens: int = 0
    cached_tokens: int = 0
    queue_seconds: float = 0.0
    ttft_seconds: float = 0.0
    itl_seconds: float = 0.0
    e2e_seconds: float = 0.0
    token_times: list[float] = field(default_factory=list)
    waiting: bool = False  # admitted and without its first token yet (the pool's queue, fleet.gateway.queue_time)
    capture: AnswerCapture | None = None  # a sampled request's answer, scored when it finished well
    audit: tuple[AnswerCapture, dict[str, Any], bool] | None = None  # the router audit's: answer, body, chat

    def finish(self, t0: float) -> dict[str, Any]:
        self.e2e_seconds = time.perf_counter() - t0
        times = self.token_times
        if times:
            self.ttft_seconds = times[0] - t0
            # per token: a chunk can carry several (speculative decoding's accepted drafts come
            # with the step's own token), so the gaps are shared by the tokens, not the chunks
            tokens = max(len(times), self.completion_tokens)
            if tokens > 1 and len(times) > 1:
                self.itl_seconds = (times[-1] - times[0]) / (tokens - 1)
        data = {k: v for k, v in self.__dict__.items() if k not in ("token_times", "capture", "audit", "waiting")}
        data["prefix_hash"] = f"{self.prefix_hash:016x}"
        if self.capture is not None and self.outcome == "ok":
            data.update(self.capture.fields(self.finish_reason, self.max_tokens, self.completion_tokens))
        return data


class _Limits:
    """The upstream's two deadlines: its first byte (and the longest silence in a stream) and
    its whole answer; ``why`` names the one that ran out."""

    def __init__(self, first_byte_s: float, total_s: float, replica: str) -> None:
        self.first_byte_s, self.total_s, self.replica = first_byte_s, total_s, replica
        self.start = time.monotonic()
        self.started = False  # a byte came

    def _wait(self) -> float:
        return max(0.0, min(self.first_byte_s, self.total_s - (time.monotonic() - self.start)))

    async def first(self, awaitable: Any) -> Any:
        """The response's start (status line and headers)."""
        return await asyncio.wait_for(awaitable, self._wait())

    async def next(self, awaitable: Any) -> Any:
        """The next piece of the body (a stream's line, or a whole non-streamed answer)."""
        value = await asyncio.wait_for(awaitable, self._wait())
        self.started = True
        return value

    def why(self) -> str:
        spent = time.monotonic() - self.start
        if spent >= self.total_s - 0.05:
            return f"replica {self.replica} did not finish its answer within {self.total_s:g} s (upstream timeout)"
        if self.started:
            return (
                f"replica {self.replica} sent nothing for {self.first_byte_s:g} s in the middle of its answer "
                "(upstream first-byte timeout: an engine that stopped producing)"
            )
        return (
            f"replica {self.replica} sent no byte within {self.first_byte_s:g} s "
            "(upstream first-byte timeout: a stalled or overloaded engine)"
        )


def _upstream_message(payload: bytes, status: int) -> str:
    """The replica's own error message (vLLM's ``{"error": {"message": ...}}``), or its status."""
    try:
        message = json.loads(payload).get("error", {}).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message)[:500] if message else f"replica answered HTTP {status}"


async def _end_stream(response: web.StreamResponse, message: str) -> None:
    """Tell a streaming client why its answer stops (vLLM's error event), then end the stream."""
    try:
        await response.write(
            f"data: {json.dumps({'error': {'message': message, 'type': 'timeout', 'code': 504}})}\n\n".encode()
        )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except (ConnectionResetError, RuntimeError):
        pass  # the client left meanwhile


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "replica", "tenant", "outcome"]
        self.requests = Counter("fleetscope_gateway_requests_total", "Requests by outcome", labels, registry=registry)
        self.routes = Counter(
            "fleetscope_gateway_route_decisions_total", "Routing decisions", ["route", "reason"], registry=registry
        )
        self.rejected = Counter("fleetscope_gateway_rejected_total", "Requests refused", ["reason"], registry=registry)
        self.e2e = Histogram(
            "fleetscope_gateway_request_duration_seconds",
            "End-to-end latency seen by the gateway",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "fleetscope_gateway_time_to_first_token_seconds",
            "Client-side TTFT (streaming)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "fleetscope_gateway_in_flight", "Requests forwarded and not finished", ["replica"], registry=registry
        )
        self.queue = Gauge("fleetscope_gateway_queue_depth", "Requests waiting for a slot", registry=registry)
        self.healthy = Gauge(
            "fleetscope_gateway_replica_healthy", "1 when the replica answers /health", ["replica"], registry=registry
        )


def _queue_time(spec: GatewaySpec, replicas: list[ReplicaState], targets: dict[str, float]) -> QueueTime:
    """The queue-time admission of ``spec.queue_time``: a budget for each model with a TTFT target
    (or the default budget); none at all when it is off."""
    qt = spec.queue_time
    budgets = (
        {}
        if not qt.enabled
        else {
            model: target
            for model in {r.model for r in replicas} | set(targets)
            if (target := targets.get(model, qt.default_budget_s)) is not None
        }
    )
    limits = spec.tenant_limits
    return QueueTime(
        budgets,
        budget_factor=qt.budget_factor,
        window_s=qt.window_s,
        min_events=qt.min_events,
        fair_share_at=qt.fair_share_at,
        weights={t: lim.weight for t, lim in limits.items()},
        priorities={t: lim.priority for t, lim in limits.items()},
        default_weight=spec.default_limits.weight,
        default_priority=spec.default_limits.priority,
    )


class Gateway:
    def __init__(
        self,
        spec: GatewaySpec,
        replicas: list[ReplicaState],
        registry: CollectorRegistry | None = None,
        budgets: dict[str, float] | None = None,
    ) -> None:
        """``budgets``: each model's TTFT target in seconds (the fleet spec's ``slo.ttft``), the
        base of its queue-time budget (``spec.queue_time``)."""
        self.spec = spec
        self.router = Router(spec, replicas)
        self.admission = Admission(spec)
        self.queue_time = _queue_time(spec, replicas, budgets or {})
        self.quality = Quality(spec.quality)
        self.registry = registry or CollectorRegistry()
        self.metrics = _Metrics(self.registry)
        self.metrics.queue.set_function(lambda: self.admission.waiting)
        self.shipper = RequestLogShipper(
            spec.request_log_url, spec.request_log_flush_s, spec.request_log_max_buffer, self.registry
        )
        self._session: aiohttp.ClientSession | None = None
        self.audit = RouterAudit(spec, self.router, lambda: self._session, self.shipper.add, self.registry)
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ app
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.handle_completions)
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        from fleet.gateway.admin import mount

        mount(self, app)
        return app

    async def start(self, host: str, port: int) -> None:
        self._session = aiohttp.ClientSession(  # the upstream limits are the gateway's own (_forward)
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
        )
        await self._check_health()
        self._tasks = [asyncio.create_task(self._health_loop()), asyncio.create_task(self.shipper.run(self._session))]
        # on stop, requests still in flight get a few seconds, then are cancelled (logged as client_abort)
        # and the request log is flushed: a gateway that waits out a saturated fleet gets killed and loses it
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=3.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.audit.drain()  # the shadows in flight finish (a while) and are logged
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self.shipper.flush(self._session)
            await self._session.close()

    # ------------------------------------------------------------------ health
    async def probe(self, replica: ReplicaState) -> None:
        """One health probe of ``replica``: taken out (or back in) on its answer."""
        if self._session is None:  # not started: probed when it starts
            return
        try:
            async with self._session.get(f"{replica.url}/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                healthy = r.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            healthy = False
        if healthy != replica.healthy:
            log.warning("replica %s is %s", replica.name, "healthy: taken in" if healthy else "unhealthy: taken out")
        # in the pool from the probe that took it in: requests may reach it at once
        replica.healthy_since = (replica.healthy_since or time.time()) if healthy else None
        replica.healthy = healthy
        if replica in self.router.replicas:  # not one removed while probed
            self.metrics.healthy.labels(replica.name).set(1 if healthy else 0)

    async def _check_health(self) -> None:
        await asyncio.gather(*(self.probe(r) for r in self.router.replicas))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.spec.health_interval_s)
            await self._check_health()

    async def handle_health(self, _request: web.Request) -> web.Response:
        healthy = [r.name for r in self.router.replicas if r.healthy]
        return web.json_response({"healthy_replicas": healthy}, status=200 if healthy else 503)

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_models(self, _request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "owned_by": "fleetscope"} for m in self.router.models()]
        if self.spec.model_router is not None:
            data.insert(0, {"id": self.spec.auto_model, "object": "model", "owned_by": "fleetscope-router"})
        assert self._session is not None
        for model in self.router.models():  # pass max_model_len through from a replica of each model
            replica = next((r for r in self.router.replicas if r.model == model and r.healthy), None)
            if replica is None:
                continue
            try:
                async with self._session.get(f"{replica.url}/v1/models", timeout=aiohttp.ClientTimeout(total=3)) as r:
                    for item in (await r.json()).get("data", []):
                        for entry in data:
                            if entry["id"] == item.get("id") and "max_model_len" in item:
                                entry["max_model_len"] = item["max_model_len"]
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                continue
        return web.json_response({"object": "list", "data": data})

    # ------------------------------------------------------------------ proxy
    def _error(
        self, record: _Record, t0: float, status: int, message: str, outcome: str, retry_after: int | None = None
    ) -> web.Response:
        record.status_code, record.outcome, record.error = status, outcome, message
        self._log(record, t0)
        headers = {"Retry-After": str(retry_after)} if retry_after else None
        body = {"error": {"message": message, "type": outcome, "code": status}}
        return web.json_response(body, status=status, headers=headers)

    def _log(self, record: _Record, t0: float) -> None:
        row = record.finish(t0)
        self.metrics.requests.labels(record.model, record.replica, record.tenant, record.outcome).inc()
        if record.outcome == "ok":
            self.metrics.e2e.labels(record.model).observe(record.e2e_seconds)
            if record.stream and record.token_times:
                self.metrics.ttft.labels(record.model).observe(record.ttft_seconds)
        self.shipper.add(row)
        if record.audit is not None:  # before its own tokens count: a long request does not make room for itself
            self.audit.after(row, record.audit[1], record.audit[2], record.audit[0])
        if record.outcome == "ok":
            self.audit.served(record.prompt_tokens + record.completion_tokens)

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, chat=False)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self.handle(request, chat=True)

    async def handle(self, request: web.Request, chat: bool) -> web.StreamResponse:
        t0 = time.perf_counter()
        trace_id, traceparent = _traceparent(request.headers.get("traceparent"))
        tenant = request.headers.get("x-tenant", "anonymous")[:128] or "anonymous"
        session = request.headers.get("x-session-id", "")[:256]
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except (ValueError, json.JSONDecodeError) as exc:
            return web.json_response({"error": {"message": f"invalid JSON body: {exc}", "code": 400}}, status=400)
        stream = bool(body.get("stream"))
        prompt_tokens, prefix_key = _prompt_info(body, chat, self.spec.affinity_prefix_tokens)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        record = _Record(
            time.time(), trace_id, tenant, session, stream, prompt_tokens, max_tokens, prefix_hash(prefix_key)
        )
        record.model = str(body.get("model", self.spec.auto_model))[:128]  # the model asked for, until routed
        record.capture = self.quality.capture(request.headers, body, trace_id)
        try:
            decision = self.router.decide(record.model, tenant, prompt_tokens, max_tokens, session or prefix_key)
        except NoReplica as exc:
            self.metrics.rejected.labels("no_replica").inc()
            return self._error(record, t0, 503, str(exc), "no_replica", retry_after=5)
        record.model, record.replica, record.route, record.route_reason = (
            decision.model,
            decision.replica.name,
            decision.route,
            decision.reason,
        )
        self.metrics.routes.labels(decision.route, decision.reason.split(" (")[0]).inc()
        audit_key = str(request.headers.get("x-request-id") or "").strip()[:256] or trace_id
        audited = self.audit.wants(decision.route, decision.model, audit_key)
        record.audit = (audited, body, chat) if audited is not None else None
        try:
            self.admission.check_rate(tenant, prompt_tokens + max_tokens)
        except Rejected as exc:
            self.metrics.rejected.labels("rate_limit").inc()
            return self._error(record, t0, 429, exc.reason, "rejected", retry_after=exc.retry_after_s)
        verdict = self.queue_time.decide(record.model, tenant)
        if not verdict.admitted:  # shed now, not answered late: outcome shed_queue_time / shed_tenant_share
            self.metrics.rejected.labels(verdict.reason).inc()
            return self._error(record, t0, 429, verdict.message, f"shed_{verdict.reason}", verdict.retry_after_s)
        self.queue_time.sent(record.model, tenant)
        record.waiting = True
        try:
            await self.admission.acquire()
        except Rejected as exc:
            self._left_queue(record)
            self.metrics.rejected.labels("saturated").inc()
            return self._error(record, t0, 429, exc.reason, "rejected", retry_after=exc.retry_after_s)
        record.queue_seconds = time.perf_counter() - t0
        replica = decision.replica
        replica.in_flight += 1
        self.metrics.in_flight.labels(replica.name).inc()
        try:
            return await self._forward(request, body, chat, stream, record, traceparent, t0, replica)
        finally:
            replica.in_flight -= 1
            self.metrics.in_flight.labels(replica.name).dec()
            self.admission.release()
            self._left_queue(record)

    def _first_token(self, record: _Record) -> None:
        """The request's first token (or its whole answer): it leaves its pool's queue, at the pool's pace."""
        if record.waiting:
            record.waiting = False
            self.queue_time.first_token(record.model, record.tenant)

    def _left_queue(self, record: _Record) -> None:
        """It ended without a first token (an error, a timeout, the client gone): out of the queue."""
        if record.waiting:
            record.waiting = False
            self.queue_time.done(record.model, record.tenant, waited=True)

    async def _forward(
        self,
        request: web.Request,
        body: dict[str, Any],
        chat: bool,
        stream: bool,
        record: _Record,
        traceparent: str,
        t0: float,
        replica: ReplicaState,
    ) -> web.StreamResponse:
        assert self._session is not None
        upstream_body = dict(body, model=record.model)
        hide_usage = False
        if stream and not (body.get("stream_options") or {}).get("include_usage"):
            upstream_body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            hide_usage = True  # the usage-only chunk is for the log, not for this client
        path = "/v1/chat/completions" if chat else "/v1/completions"
        headers = {"traceparent": traceparent, "x-tenant": record.tenant}
        url = replica.url  # carried on the decision: the replica may leave the router meanwhile
        response: web.StreamResponse | None = None
        limits = _Limits(self.spec.upstream_first_byte_timeout_s, self.spec.upstream_timeout_s, record.replica)
        try:
            async with await limits.first(
                self._session.post(f"{url}{path}", json=upstream_body, headers=headers)
            ) as upstream:
                record.status_code = upstream.status
                if upstream.status != 200 or not stream:
                    payload = await limits.next(upstream.read())
                    if upstream.status == 200:
                        self._first_token(record)
                        self._usage(record, json.loads(payload), final=True)
                        replica.first_token_at = replica.first_token_at or time.time()
                        record.token_times = []
                    else:
                        record.outcome = "upstream_error"
                        record.error = _upstream_message(payload, upstream.status)
                    self._log(record, t0)
                    return web.Response(
                        body=payload, status=upstream.status, content_type=upstream.content_type or "application/json"
                    )
                response = web.StreamResponse(
                    status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                )
                await response.prepare(request)
                while line := await limits.next(upstream.content.readline()):
                    if self._stream_line(line, record, replica, hide_usage):
                        await response.write(line)
                await response.write_eof()
                self._log(record, t0)
                return response
        except TimeoutError:
            if response is None:
                return self._error(record, t0, 504, limits.why(), "timeout")
            record.outcome, record.error = "timeout", limits.why()
            await _end_stream(response, record.error)
        except (ConnectionResetError, asyncio.CancelledError):
            record.outcome = "client_abort"
            self._log(record, t0)
            raise
        except aiohttp.ClientError as exc:
            if response is None:
                return self._error(record, t0, 502, f"replica {record.replica} failed: {exc}", "upstream_error")
            record.outcome, record.error = "upstream_error", f"replica {record.replica} failed mid-stream: {exc}"
        self._log(record, t0)
        return response

    def _stream_line(self, line: bytes, record: _Record, replica: ReplicaState, hide_usage: bool) -> bool:
        """Note a streamed event's tokens, finish reason and usage; False for one not to forward."""
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            return True
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            chunk = {}
        if record.capture is not None and isinstance(chunk, dict):
            record.capture.add_event(chunk)
        if record.audit is not None and isinstance(chunk, dict):
            record.audit[0].add_event(chunk)
        forward = True
        if chunk.get("choices"):
            if any(c.get("text") or (c.get("delta") or {}).get("content") for c in chunk["choices"]):
                record.token_times.append(time.perf_counter())
                replica.first_token_at = replica.first_token_at or time.time()  # its first token, ever
                self._first_token(record)
            for c in chunk["choices"]:
                if c.get("finish_reason"):
                    record.finish_reason = str(c["finish_reason"])
        if chunk.get("usage"):
            self._usage(record, chunk, final=False)
            forward = not (hide_usage and not chunk.get("choices"))
        record.request_id = record.request_id or str(chunk.get("id", ""))
        return forward

    @staticmethod
    def _usage(record: _Record, payload: dict[str, Any], final: bool) -> None:
        usage = payload.get("usage") or {}
        record.completion_tokens = int(usage.get("completion_tokens") or record.completion_tokens)
        record.prompt_tokens = int(usage.get("prompt_tokens") or record.prompt_tokens)
        details = usage.get("prompt_tokens_details") or {}
        record.cached_tokens = int(details.get("cached_tokens") or 0)
        record.request_id = record.request_id or str(payload.get("id", ""))
        if final and record.capture is not None:
            record.capture.add_answer(payload)
        if final and record.audit is not None:
            record.audit[0].add_answer(payload)
        if final:
            for choice in payload.get("choices") or []:
                if choice.get("finish_reason"):
                    record.finish_reason = str(choice["finish_reason"])
