"""Load generator: a ``Scenario`` -> OpenAI completion requests sent to the fleet, with stats.

In:  a scenario, where to send (per-model replica URLs, or one gateway URL), a speed factor
     for the timeline, a rate multiplier, and an optional event handler (kill/restart replica).
Out: HTTP requests (streaming SSE and not) with a W3C ``traceparent``, ``x-tenant`` and
     ``x-model`` header each (and the gateway's own, e.g. LiteLLM's key); a progress line every
     few seconds; ``LoadStats`` at the end; optionally one JSON line per request (``--log``).
     It writes nothing to ClickHouse: what the fleet did is observed by the collector, like any
     other client's traffic.

Arrivals are open-loop (Poisson): they keep their schedule whatever the answers, as real clients
keep arriving. With a mix's ``max_in_flight`` set, a request whose turn comes while that many are
outstanding is not sent (counted as ``not_sent``, never delayed); with it null (the overload
scenario) nothing caps them, so an overloaded fleet meets the whole offered load. A 429 answer
(the gateway shed the request, or its tenant was over its rate) is counted as ``shed``, with its
``Retry-After`` in the request's log line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import httpx

from fleet.traffic import ANSWER_TOKENS_ARG, Event, RequestPlan, Scenario, next_gap, plan_request

__all__ = [
    "LoadStats",
    "RequestResult",
    "Targets",
    "discover_max_model_len",
    "percentile",
    "run_scenario",
    "send_request",
]


@dataclass(frozen=True)
class RequestResult:
    trace_id: str
    tenant: str
    model: str
    url: str
    stream: bool
    prompt_tokens: int
    max_tokens: int
    long_context: bool
    ok: bool
    status: int | None
    error: str
    ttft_s: float | None
    e2e_s: float
    completion_tokens: int | None
    started_at: float
    phase: str
    retry_after_s: float | None = None  # a 429's or 503's Retry-After


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` by nearest rank; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]


@dataclass
class LoadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    shed: int = 0  # answered 429 (part of failed)
    not_sent: int = 0  # arrivals while max_in_flight were outstanding
    errors: Counter[str] = field(default_factory=Counter)
    ttft: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    e2e: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, result: RequestResult) -> None:
        if result.ok:
            self.ok += 1
            self.e2e.append(result.e2e_s)
            if result.ttft_s is not None:
                self.ttft.append(result.ttft_s)
            self.prompt_tokens += result.prompt_tokens
            self.completion_tokens += result.completion_tokens or 0
        else:
            self.failed += 1
            self.errors[result.error] += 1
            self.shed += result.status == 429

    def line(self, elapsed: float, phase: str, in_flight: int) -> str:
        ttft = list(self.ttft)[-200:]
        p50, p99 = percentile(ttft, 0.5), percentile(ttft, 0.99)
        lat = f"TTFT p50 {p50:.3f}s p99 {p99:.3f}s" if p50 is not None and p99 is not None else "TTFT n/a"
        shed = f" (shed {self.shed})" if self.shed else ""
        capped = f" not sent {self.not_sent}" if self.not_sent else ""
        return (
            f"[+{elapsed:5.0f}s {phase}] sent {self.sent} ok {self.ok} failed {self.failed}{shed}{capped} "
            f"in-flight {in_flight} | client {lat} (streaming, last 200)"
        )

    def summary(self) -> dict[str, Any]:
        ttft, e2e = list(self.ttft), list(self.e2e)
        return {
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "shed": self.shed,
            "not_sent": self.not_sent,
            "errors": dict(self.errors),
            "ttft_p50_s": percentile(ttft, 0.5),
            "ttft_p99_s": percentile(ttft, 0.99),
            "e2e_p50_s": percentile(e2e, 0.5),
            "e2e_p99_s": percentile(e2e, 0.99),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


class Targets:
    """Where a model's requests go: round-robin over its replicas, or one gateway URL."""

    def __init__(
        self,
        by_model: dict[str, list[str]] | None = None,
        gateway: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not by_model and not gateway:
            raise ValueError("no targets: give replica URLs per model or a gateway URL")
        self.gateway = gateway.rstrip("/") if gateway else None
        self.headers = dict(headers or {})  # sent with every request (e.g. a gateway's key)
        self.by_model = {m: [u.rstrip("/") for u in urls] for m, urls in (by_model or {}).items()}
        self._cycles = {m: itertools.cycle(urls) for m, urls in self.by_model.items()}

    def url_for(self, model: str) -> str:
        if self.gateway:
            return self.gateway
        cycle = self._cycles.get(model)
        if cycle is None:
            raise KeyError(model)
        return next(cycle)

    def check(self, scenario: Scenario) -> None:
        if self.gateway:
            return
        wanted = {m for _t, _n, mix in scenario.mixes() for m in mix.models}
        wanted |= {m for _t, _n, mix in scenario.mixes() for t in mix.tenants for m in (t.models or {})}
        missing = sorted(wanted - set(self.by_model))
        if missing:
            raise ValueError(
                f"scenario {scenario.name!r} sends to models {', '.join(missing)}, which no replica "
                f"serves (fleet models: {', '.join(sorted(self.by_model))})"
            )


async def discover_max_model_len(client: httpx.AsyncClient, targets: Targets) -> dict[str, int]:
    """Ask each model's first replica (``/v1/models``) for its max_model_len."""
    limits: dict[str, int] = {}
    urls = [targets.gateway] if targets.gateway else [urls[0] for urls in targets.by_model.values()]
    for url in urls:
        try:
            response = await client.get(f"{url}/v1/models", timeout=5, headers=targets.headers)
            for item in response.json().get("data", []):
                if isinstance(item.get("max_model_len"), int):
                    limits[item["id"]] = item["max_model_len"]
        except (httpx.HTTPError, ValueError):
            continue
    return limits


async def _run_event(
    handler: Callable[[str, str], None], action: str, replica: str, progress: Callable[[str], None] | None
) -> None:
    try:
        await asyncio.to_thread(handler, action, replica)
    except Exception as exc:  # noqa: BLE001 - an event failing must not stop the traffic
        if progress:
            progress(f"event {action} {replica} failed: {exc}")


def _traceparent(rng: random.Random) -> tuple[str, str]:
    trace_id = f"{rng.getrandbits(128):032x}"
    span_id = f"{rng.getrandbits(64) or 1:016x}"
    return trace_id, f"00-{trace_id}-{span_id}-01"


async def send_request(
    client: httpx.AsyncClient,
    url: str,
    plan: RequestPlan,
    trace_id: str,
    traceparent: str,
    phase: str,
    headers: dict[str, str] | None = None,
) -> RequestResult:
    """Send ``plan`` to ``url`` (``/v1/completions``, streamed or not) and time it; never raises
    for the server's or the network's failures: they are the result's ``error``."""
    body = _body(plan)
    # x-model: what a gateway that routes before reading the body (Envoy) routes on
    headers = {**(headers or {}), "traceparent": traceparent, "x-tenant": plan.tenant, "x-model": plan.model}
    started = time.time()
    t0 = time.perf_counter()
    ttft: float | None = None
    completion_tokens: int | None = None
    status: int | None = None
    error = ""
    retry_after: float | None = None
    try:
        if plan.stream:
            async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as response:
                status = response.status_code
                if status != 200:
                    await response.aread()
                    error, retry_after = _refusal(response), _retry_after(response)
                else:
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if ttft is None and any(c.get("text") for c in chunk.get("choices", [])):
                            ttft = time.perf_counter() - t0
                        usage = chunk.get("usage")
                        if usage:
                            completion_tokens = usage.get("completion_tokens")
        else:
            response = await client.post(f"{url}/v1/completions", json=body, headers=headers)
            status = response.status_code
            if status == 200:
                completion_tokens = response.json().get("usage", {}).get("completion_tokens")
            else:
                error, retry_after = _refusal(response), _retry_after(response)
    except httpx.TimeoutException:
        error = "timeout"
    except httpx.TransportError as exc:
        error = f"connection: {type(exc).__name__}"
    except (ValueError, KeyError) as exc:
        error = f"bad response: {type(exc).__name__}"
    return RequestResult(
        trace_id=trace_id,
        tenant=plan.tenant,
        model=plan.model,
        url=url,
        stream=plan.stream,
        prompt_tokens=len(plan.prompt),
        max_tokens=plan.max_tokens,
        long_context=plan.long_context,
        ok=not error,
        status=status,
        error=error,
        ttft_s=ttft,
        e2e_s=time.perf_counter() - t0,
        completion_tokens=completion_tokens,
        started_at=started,
        phase=phase,
        retry_after_s=retry_after,
    )


def _body(plan: RequestPlan) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": plan.model,
        "prompt": plan.prompt,
        "max_tokens": plan.max_tokens,
        "temperature": 0.8,
        "ignore_eos": True,  # vLLM extension: exact output lengths from a random-weight model
        "stream": plan.stream,
    }
    if plan.answer_tokens:  # the simulator ends the answer there (finish reason stop); vLLM ignores it
        body["vllm_xargs"] = {ANSWER_TOKENS_ARG: plan.answer_tokens}
    if plan.stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _refusal(response: httpx.Response) -> str:
    """``http STATUS``, and the error's type where the body says it (the gateway's ``shed_queue_time``)."""
    try:
        kind = response.json()["error"]["type"]
    except (ValueError, KeyError, TypeError):
        return f"http {response.status_code}"
    return (
        f"http {response.status_code} {kind}"
        if isinstance(kind, str) and kind.isidentifier()
        else f"http {response.status_code}"
    )


def _retry_after(response: httpx.Response) -> float | None:
    """The answer's Retry-After in seconds (a number; a date is not read)."""
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


async def run_scenario(
    scenario: Scenario,
    targets: Targets,
    *,
    speed: float = 1.0,
    rate_scale: float = 1.0,
    duration_s: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = 5.0,
    on_event: Callable[[str, str], None] | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    log: IO[str] | None = None,
    stop: asyncio.Event | None = None,
    request_timeout_s: float = 120.0,
) -> LoadStats:
    """Run ``scenario`` against ``targets``; return the stats.

    ``speed`` compresses the timeline (phases and events happen ``speed`` times sooner);
    ``rate_scale`` multiplies the request rate. ``duration_s`` is wall time (default: the
    scenario's duration divided by ``speed``). Events run in a worker thread via ``on_event``.
    """
    targets.check(scenario)
    rng = random.Random(seed)
    ids = random.Random()  # trace ids must be unique across runs, not reproducible
    stats = LoadStats()
    wall_duration = duration_s if duration_s is not None else scenario.duration_s / speed
    pending_events = sorted(scenario.events, key=lambda e: e.at_s)
    tasks: set[asyncio.Task[None]] = set()
    event_tasks: list[asyncio.Task[None]] = []
    # keep-alive shorter than the engines' (uvicorn closes idle connections after 5 s): reusing a
    # connection the server is closing at that moment fails the request with a ReadError
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
    timeout = httpx.Timeout(request_timeout_s, connect=5.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        max_len = await discover_max_model_len(client, targets)
        start = time.perf_counter()
        next_progress = progress_every_s
        next_arrival = 0.0
        phase = "start"

        async def one(plan: RequestPlan, url: str, phase: str) -> None:
            trace_id, traceparent = _traceparent(ids)
            result = await send_request(client, url, plan, trace_id, traceparent, phase, targets.headers)
            stats.add(result)
            if on_result is not None:
                on_result(result)
            if log is not None:
                log.write(json.dumps(result.__dict__) + "\n")

        while True:
            elapsed = time.perf_counter() - start
            if elapsed >= wall_duration or (stop is not None and stop.is_set()):
                break
            t = elapsed * speed  # scenario time
            phase, mix = scenario.mix_at(t)
            _fire_events(pending_events, t, elapsed, phase, progress, on_event, event_tasks)
            if progress and elapsed >= next_progress:
                progress(stats.line(elapsed, phase, len(tasks)))
                next_progress += progress_every_s
            if elapsed >= next_arrival:
                if mix.max_in_flight is not None and len(tasks) >= mix.max_in_flight:
                    stats.not_sent += 1
                else:
                    plan = plan_request(mix, rng, max_len)
                    stats.sent += 1
                    task = asyncio.create_task(one(plan, targets.url_for(plan.model), phase))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                scaled = mix.model_copy(update={"rate": mix.rate * rate_scale})
                next_arrival += next_gap(scaled, t, rng)
                continue
            await asyncio.sleep(min(next_arrival - elapsed, 0.25, max(0.0, wall_duration - elapsed)))
        await _drain(tasks, event_tasks, request_timeout_s, progress)
        if progress:
            progress(stats.line(time.perf_counter() - start, phase, 0))
    return stats


def _fire_events(
    pending: list[Event],
    t: float,
    elapsed: float,
    phase: str,
    progress: Callable[[str], None] | None,
    on_event: Callable[[str, str], None] | None,
    event_tasks: list[asyncio.Task[None]],
) -> None:
    """The scenario's events due by scenario time ``t`` taken from ``pending`` (sorted), announced
    (with the wall time ``elapsed`` and the ``phase``) and run through ``on_event`` as tasks."""
    while pending and pending[0].at_s <= t:
        event = pending.pop(0)
        if progress:
            progress(f"[+{elapsed:5.0f}s {phase}] event: {event.action} {event.replica}")
        if on_event is not None:
            event_tasks.append(asyncio.create_task(_run_event(on_event, event.action, event.replica, progress)))


async def _drain(
    tasks: set[asyncio.Task[None]],
    event_tasks: list[asyncio.Task[None]],
    timeout_s: float,
    progress: Callable[[str], None] | None,
) -> None:
    """The requests still in flight waited for (at most ``timeout_s``), then the events' tasks."""
    if tasks:
        if progress:
            progress(f"waiting for {len(tasks)} in-flight request(s)")
        await asyncio.wait(tasks, timeout=timeout_s)
    for task in event_tasks:
        await task
