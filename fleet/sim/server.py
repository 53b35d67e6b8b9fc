"""Simulated vLLM servers: many ``SimEngine``s in one process, each on its own port, speaking
vLLM's HTTP API and metrics and sending its ``llm_request`` spans.

In:  ``SimReplica`` definitions (name, model, port, engine config); OpenAI requests.
Out: per port the same endpoints as ``vllm.entrypoints.openai.api_server`` that fleetscope
     uses — ``POST /v1/completions`` and ``/v1/chat/completions`` (streaming or not),
     ``GET /v1/models`` (with ``max_model_len``), ``GET /health``, ``GET /metrics`` — plus
     ``POST /sim/restart`` (a simulated engine restart: counters start again from zero),
     ``POST /sim/stall`` (a test hook: ``{"stalled": true}`` freezes the engine with its requests
     running, ``false`` resumes it) and ``GET /sim/status`` (how far its step loop fell behind
     real time, and whether it is stalled).
     Finished requests become OTLP ``llm_request`` spans (HTTP protobuf, every second) with the
     same attributes vLLM sets, and the ``traceparent``'s trace id.

Answers are text by rule (``fleet.sim.answers``): pseudo-words, or the refusal sentence for an
adapter that refuses; an answer ends at its own length when the request carries one
(``vllm_xargs.fleetscope_answer_tokens``: finish reason ``stop``), else at ``max_tokens`` (``length``).

An engine's step loop runs only while it has work, in real time (``asyncio.sleep`` for each
step's modelled duration), so hundreds of idle or lightly loaded engines cost little.
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

from fleet.sim.answers import REFUSAL_PIECES, answer_key, choose, fidelity, piece
from fleet.sim.engine import EngineConfig, RequestRejected, SimEngine, SimRequest, engine_config, prompt_acceptance
from fleet.sim.metrics import Exposition
from fleet.traffic import ANSWER_TOKENS_ARG

__all__ = ["SimFleet", "SimReplica", "engine_config"]

log = logging.getLogger("fleetscope.sim")


@dataclass
class SimReplica:
    name: str
    model: str
    port: int
    config: EngineConfig = field(default_factory=EngineConfig)
    gpu_type: str = "sim"
    gpu_count: int = 1
    adapters: tuple[str, ...] = ()  # LoRA adapters it serves, each asked for by its own name
    refusing: tuple[str, ...] = ()  # those of them that refuse every prompt (fleet.sim.answers)
    engine: SimEngine = field(init=False)
    exposition: Exposition = field(init=False)
    wake: asyncio.Event = field(init=False)
    waiters: dict[str, asyncio.Queue[Any]] = field(init=False, default_factory=dict)
    # request id -> what its answer's text is drawn from (fleet.sim.answers): key, agreement, refusal, choice
    answers: dict[str, tuple[str, float, bool, str]] = field(init=False, default_factory=dict)
    lag_s: float = 0.0  # how far the step loop fell behind its modelled schedule (max seen)

    def __post_init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A simulated engine restart: in-flight requests fail, counters start from zero."""
        self.fail_in_flight("engine restarted")
        self.answers = {}
        self.engine = SimEngine(self.config)
        # the step loop runs on the event loop's monotonic clock; vLLM reports adapter states in epoch time
        self.engine.wall_offset = time.time() - time.monotonic()
        self.exposition = Exposition(self.engine, self.model, started=time.time())

    def fail_in_flight(self, reason: str) -> None:
        """Answer every request in flight with an error (500) now, as vLLM aborts them."""
        for queue in getattr(self, "waiters", {}).values():
            queue.put_nowait(RuntimeError(reason))
        self.waiters = {}

    def resource(self) -> dict[str, str]:
        return {
            "service.name": self.name,
            "service.instance.id": self.name,
            "fleetscope.replica": self.name,
            "fleetscope.model": self.model,
            "fleetscope.gpu_type": self.gpu_type,
            "fleetscope.gpu_count": str(self.gpu_count),
            "fleetscope.simulated": "true",
        }


class SimFleet:
    def __init__(
        self,
        replicas: list[SimReplica],
        host: str = "127.0.0.1",
        otlp_endpoint: str | None = None,
        cold_start_s: float = 0.0,
    ) -> None:
        self.replicas = replicas
        self.host = host
        self.otlp_endpoint = otlp_endpoint
        self.cold_start_s = cold_start_s  # modelled start-up: nothing listens until it has passed, as vLLM loading
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._spans: list[tuple[SimReplica, SimRequest, float]] = []
        self._session: aiohttp.ClientSession | None = None
        self._stopping = False  # set by stop(): a request that arrives then is refused, not left waiting

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.cold_start_s > 0:
            await asyncio.sleep(self.cold_start_s)  # a real engine loads its weights: connections are refused
        for replica in self.replicas:
            replica.wake = asyncio.Event()
            # a stop closes idle keep-alive connections (the gateway's) after 2 s, not aiohttp's 60
            runner = web.AppRunner(self._app(replica), access_log=None, shutdown_timeout=2.0)
            await runner.setup()
            await web.TCPSite(runner, self.host, replica.port).start()
            self._runners.append(runner)
            self._tasks.append(asyncio.create_task(self._drive(replica)))
        if self.otlp_endpoint:
            self._session = aiohttp.ClientSession()
            self._tasks.append(asyncio.create_task(self._export_loop()))

    async def stop(self) -> None:
        """Stop the step loops, answer the requests in flight with an error (their handlers
        return, none is left pending on a loop that closes) and close the listeners."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for replica in self.replicas:
            replica.fail_in_flight("engine stopped")
        if self._session is not None:
            await self._export()
            await self._session.close()
        await asyncio.gather(*(runner.cleanup() for runner in self._runners))  # each waits up to its shutdown_timeout

    # ------------------------------------------------------------------ engine loop
    async def _drive(self, replica: SimReplica) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await replica.wake.wait()
            replica.wake.clear()
            engine = replica.engine
            now = loop.time()
            while engine.has_work():
                if engine is not replica.engine:  # restarted
                    break
                duration, produced, finished = engine.step(now)
                if (
                    not produced
                    and not finished
                    and duration <= engine.config.step_overhead_s / engine.config.speed
                    and not engine.running
                ):
                    break  # waiting requests that cannot be admitted and nothing running: idle
                now += duration
                delay = now - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    replica.lag_s = max(replica.lag_s, -delay)
                    now = loop.time()
                    await asyncio.sleep(0)
                for request in produced:
                    queue = replica.waiters.get(request.request_id)
                    if queue is not None:
                        key, agree, refuse, choice = replica.answers.get(request.request_id, ("", 1.0, False, ""))
                        first = request.generated - request.step_tokens
                        text = piece(key, first, request.step_tokens, agree=agree, refuse=refuse, choice=choice)
                        queue.put_nowait(text)
                for request in finished:
                    replica.answers.pop(request.request_id, None)
                    queue = replica.waiters.pop(request.request_id, None)
                    if queue is not None:
                        queue.put_nowait(None)
                    if self.otlp_endpoint:
                        self._spans.append((replica, request, time.time()))

    # ------------------------------------------------------------------ HTTP
    def _app(self, replica: SimReplica) -> web.Application:
        async def health(_r: web.Request) -> web.Response:
            return web.Response(status=200)

        async def metrics(_r: web.Request) -> web.Response:
            return web.Response(
                text=replica.exposition.render(),
                content_type="text/plain",
                charset="utf-8",
                headers={"X-Simulated": "fleetscope"},
            )

        async def models(_r: web.Request) -> web.Response:
            return web.json_response(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": name,
                            "object": "model",
                            "owned_by": "fleetscope-sim",
                            "root": replica.model,
                            "parent": None if name == replica.model else replica.model,
                            "max_model_len": replica.config.max_model_len,
                        }
                        for name in (replica.model, *replica.adapters)
                    ],
                }
            )

        async def status(_r: web.Request) -> web.Response:
            e = replica.engine
            return web.json_response(
                {
                    "replica": replica.name,
                    "lag_s": replica.lag_s,
                    "running": len(e.running),
                    "waiting": len(e.waiting),
                    "kv_usage": e.kv_usage,
                    "stalled": e.stalled,
                }
            )

        async def restart(_r: web.Request) -> web.Response:
            replica.restart()
            return web.json_response({"restarted": replica.name})

        async def stall(request: web.Request) -> web.Response:
            try:
                body = await request.json() if request.can_read_body else {}
                stalled = bool(body.get("stalled", True)) if isinstance(body, dict) else True
            except (ValueError, json.JSONDecodeError):
                return web.json_response(
                    {"error": {"message": 'the body must be {"stalled": true|false}', "code": 400}}, status=400
                )
            replica.engine.stalled = stalled
            replica.wake.set()
            log.warning("simulated engine %s %s (test hook)", replica.name, "stalled" if stalled else "resumed")
            return web.json_response({"replica": replica.name, "stalled": stalled})

        async def completions(request: web.Request) -> web.StreamResponse:
            return await self._complete(replica, request, chat=False)

        async def chat(request: web.Request) -> web.StreamResponse:
            return await self._complete(replica, request, chat=True)

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/sim/restart", restart)
        app.router.add_post("/sim/stall", stall)
        app.router.add_get("/sim/status", status)
        return app

    async def _complete(self, replica: SimReplica, request: web.Request, chat: bool) -> web.StreamResponse:
        if self._stopping:
            return web.json_response({"error": {"message": "engine stopped", "code": 503}}, status=503)
        accepted = await _accept(replica, request, chat)
        if isinstance(accepted, web.Response):
            return accepted
        sim, body, asked = accepted
        queue: asyncio.Queue[Any] = asyncio.Queue()
        replica.waiters[sim.request_id] = queue
        replica.wake.set()
        kind = "chat.completion" if chat else "text_completion"
        head = {"id": sim.request_id, "object": kind, "created": int(time.time()), "model": asked}
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if body.get("stream"):
            return await _stream(request, queue, sim, head, chat, include_usage)
        pieces: list[str] = []
        while True:
            item = await queue.get()
            if isinstance(item, Exception):
                return web.json_response({"error": {"message": str(item), "code": 500}}, status=500)
            if item is None:
                break
            pieces.append(item)
        text = "".join(pieces)
        reason = sim.finish_reason or "length"
        choice = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
            if chat
            else {"index": 0, "text": text, "finish_reason": reason}
        )
        return web.json_response({**head, "choices": [choice], "usage": _usage(sim)})

    # ------------------------------------------------------------------ spans
    async def _export_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            await self._export()

    async def _export(self) -> None:
        if not self._spans or self._session is None or not self.otlp_endpoint:
            return
        spans, self._spans = self._spans, []
        body = _export_request(spans)
        try:
            async with self._session.post(
                self.otlp_endpoint,
                data=body,
                headers={"Content-Type": "application/x-protobuf"},
                timeout=aiohttp.ClientTimeout(total=5),
            ) as r:
                await r.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.debug("span export failed: %s", exc)  # like vLLM's exporter: spans are best effort


def _prompt_tokens(body: dict[str, Any], chat: bool) -> list[int]:
    if chat:
        text = "".join(str(m.get("content", "")) for m in body.get("messages", []))
    else:
        prompt = body.get("prompt", "")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return [int(t) for t in prompt]
        text = prompt if isinstance(prompt, str) else "".join(map(str, prompt))
    data = text.encode()
    # about 4 bytes per token, as a BPE tokenizer would give
    return [int.from_bytes(data[i : i + 4].ljust(4, b"\0"), "little") % 50_000 for i in range(0, max(len(data), 1), 4)]


def _choices(body: dict[str, Any]) -> list[str]:
    """The choices a request is constrained to (vLLM's ``structured_outputs.choice``), if any."""
    constraint = body.get("structured_outputs")
    choices = constraint.get("choice") if isinstance(constraint, dict) else None
    return [str(c) for c in choices if str(c)] if isinstance(choices, list) else []


def _answer_tokens(body: dict[str, Any], refusing: bool) -> int:
    """The answer's own length: one token for a constrained choice, the refusal's for a refusing
    adapter, else what the traffic generator sent (``vllm_xargs``), else 0 (none: the answer runs to
    ``max_tokens``, as a random-weight model with ``ignore_eos`` does)."""
    if _choices(body):
        return 1
    if refusing:
        return len(REFUSAL_PIECES)
    xargs = body.get("vllm_xargs")
    value = xargs.get(ANSWER_TOKENS_ARG) if isinstance(xargs, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _trace_id(header: str | None) -> str:
    if header:
        parts = header.split("-")
        if len(parts) == 4 and len(parts[1]) == 32:
            return parts[1].lower()
    return secrets.token_hex(16)


async def _accept(
    replica: SimReplica, request: web.Request, chat: bool
) -> web.Response | tuple[SimRequest, dict[str, Any], str]:
    """A completion request read and submitted to the replica's engine: the engine's request, the
    body and the model asked for; or the error response vLLM gives (400 unreadable or rejected,
    404 a model it does not serve)."""
    try:
        body = await request.json()
        prompt = _prompt_tokens(body, chat)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        return web.json_response({"error": {"message": f"invalid request: {exc}", "code": 400}}, status=400)
    asked = body.get("model") or replica.model
    if asked not in (replica.model, *replica.adapters):
        return web.json_response(
            {"error": {"message": f"The model `{body.get('model')}` does not exist.", "code": 404}}, status=404
        )
    trace_id = _trace_id(request.headers.get("traceparent"))
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(8)}"
    sim = SimRequest(
        request_id,
        prompt,
        max_tokens,
        asyncio.get_running_loop().time(),
        trace_id,
        acceptance=prompt_acceptance(prompt),
        lora="" if asked == replica.model else asked,
        answer_tokens=_answer_tokens(body, asked in replica.refusing),
    )
    key, choices = answer_key(prompt), _choices(body)
    choice = choose(key, choices) if choices else ""
    replica.answers[request_id] = (key, fidelity(asked, len(prompt)), asked in replica.refusing, choice)
    try:
        replica.engine.submit(sim)
    except RequestRejected as exc:  # vLLM's answer, word for word
        replica.answers.pop(request_id, None)
        return web.json_response(
            {"error": {"message": str(exc), "type": "BadRequestError", "param": exc.param, "code": 400}}, status=400
        )
    return sim, body, asked


async def _stream(
    request: web.Request,
    queue: asyncio.Queue[Any],
    sim: SimRequest,
    head: dict[str, Any],
    chat: bool,
    include_usage: bool,
) -> web.StreamResponse:
    """The engine's tokens for ``sim`` as server-sent events, as vLLM streams them: one chunk a
    piece, the finish reason, the usage if asked for, ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    kind = head["object"]
    while True:
        item = await queue.get()
        if isinstance(item, Exception) or item is None:
            break
        choice = {"index": 0, "delta": {"content": item}} if chat else {"index": 0, "text": item}
        choice["finish_reason"] = None
        chunk = {**head, "object": f"{kind}.chunk" if chat else kind, "choices": [choice]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    reason = sim.finish_reason or "length"
    last = (
        {"index": 0, "delta": {}, "finish_reason": reason}
        if chat
        else {"index": 0, "text": "", "finish_reason": reason}
    )
    await response.write(f"data: {json.dumps({**head, 'choices': [last]})}\n\n".encode())
    if include_usage:
        await response.write(f"data: {json.dumps({**head, 'choices': [], 'usage': _usage(sim)})}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _usage(sim: SimRequest) -> dict[str, Any]:
    """The OpenAI ``usage`` of a finished request, with the prompt tokens served from the prefix cache."""
    return {
        "prompt_tokens": sim.prompt_len,
        "completion_tokens": sim.generated,
        "total_tokens": sim.prompt_len + sim.generated,
        "prompt_tokens_details": {"cached_tokens": sim.cached_tokens},
    }


def _export_request(spans: list[tuple[SimReplica, SimRequest, float]]) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

    def kv(key: str, value: Any) -> KeyValue:
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        if isinstance(value, float):
            return KeyValue(key=key, value=AnyValue(double_value=value))
        return KeyValue(key=key, value=AnyValue(string_value=str(value)))

    by_replica: dict[str, tuple[SimReplica, list[Span]]] = {}
    for replica, r, wall_end in spans:
        end = r.finished_at or 0.0
        first = r.first_token_at or end
        start_wall = wall_end - (end - r.arrival)
        attrs = [
            kv("gen_ai.latency.time_to_first_token", first - r.arrival),
            kv("gen_ai.latency.e2e", end - r.arrival),
            kv("gen_ai.latency.time_in_queue", (r.first_scheduled or end) - r.arrival),
            kv("gen_ai.usage.prompt_tokens", r.prompt_len),
            kv("gen_ai.usage.completion_tokens", r.generated),
            kv("gen_ai.latency.time_in_model_prefill", r.prefill_time),
            kv("gen_ai.latency.time_in_model_decode", end - first),
            kv("gen_ai.latency.time_in_model_inference", end - (r.first_scheduled or end)),
            kv("gen_ai.request.id", r.request_id),
            kv("gen_ai.request.max_tokens", r.max_tokens),
            kv("gen_ai.request.n", 1),
        ]
        span = Span(
            name="llm_request",
            trace_id=bytes.fromhex(r.trace_id),
            span_id=secrets.token_bytes(8),
            kind=Span.SPAN_KIND_SERVER,
            start_time_unix_nano=int(start_wall * 1e9),
            end_time_unix_nano=int(wall_end * 1e9),
            attributes=attrs,
        )
        by_replica.setdefault(replica.name, (replica, []))[1].append(span)
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[kv(k, v) for k, v in replica.resource().items()]),
                scope_spans=[ScopeSpans(spans=spans_)],
            )
            for replica, spans_ in by_replica.values()
        ]
    )
    data: bytes = request.SerializeToString()  # google.protobuf has no type stubs here
    return data
