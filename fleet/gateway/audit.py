"""The model router audited: a sample of its decisions replayed in shadow on the other model.

In:  ``AuditSpec`` (``gateway.router_audit``), the model router's small and large models, the
     gateway's router (to choose the shadow's replica) and HTTP session; per request, its record
     once routed (``wants``: is it sampled?) and, once answered, its answer (``after``).
Out: for a sampled request whose answer came back well, a shadow request to the other model
     (sent small: replayed on the large model; sent large: on the small one), off the user's
     path: after the user's answer is finished, non-streamed, billed to the audit's tenant
     (``router-audit``), its own request-log line with ``route`` ``shadow``, the route reason of
     the request it shadows, and ``audit_of`` (that request's trace id), ``audit_direction``,
     ``agreement`` (``fleet.quality.evaluators.agreement``: the two answers' word F1) and, with a
     judge, ``judge_routed`` / ``judge_shadow`` (the judge's scores of the two answers, 0-1).
     Counters by result: ``fleetscope_gateway_router_audits_total{result}`` (shadowed,
     over_share, failed) and the judge's calls (``..._judge_calls_total{result}``).

Bounds: the sample is a hash of the request's key (``x-request-id``, else its trace id), so a
retry is sampled alike; a shadow is sent only while the shadows' tokens (prompt + completion) in
the last ``window_s`` are below ``max_share`` of the tokens the gateway served users in that
window (else it is not replayed: ``over_share``), so the extra load is that share of the traffic
at most (over by one request at a time), whatever the sample rate. A sampled request is replayed
whatever its size while the share is not reached, so long requests (the router's "hard" ones)
are audited as often as short ones, not crowded out by them. Shadows skip admission (they are bounded
by the share) but count in their replica's requests in flight, as any request does.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from fleet.gateway.config import AuditSpec, GatewaySpec, QualitySpec
from fleet.gateway.quality import AnswerCapture, Quality
from fleet.gateway.routing import NoReplica, Router
from fleet.quality.evaluators import agreement
from fleet.quality.judge import Judge

__all__ = ["RouterAudit", "request_text"]


def request_text(body: dict[str, Any], chat: bool) -> str:
    """The request as the judge reads it: the chat's messages, the prompt, or what a token-id
    prompt is (its text is not known to the gateway)."""
    if chat:
        return "\n".join(str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict))
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return f"(a prompt of {len(prompt)} tokens, sent as token ids)"
    return prompt if isinstance(prompt, str) else "".join(p for p in prompt if isinstance(p, str))


def _answer(shadow: dict[str, Any], payload: Any) -> str:
    """The text of a shadow's answer, its record filled in; ``ValueError`` for a body that is not
    an OpenAI completion."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices")
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    choice = choices[0]
    shadow.update(
        outcome="ok",
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_tokens=int(usage.get("prompt_tokens") or shadow["prompt_tokens"]),
        finish_reason=str(choice.get("finish_reason") or ""),
    )
    message = choice.get("message")
    return str((message.get("content") if isinstance(message, dict) else choice.get("text")) or "")


class _Window:
    """Tokens over the last ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.items: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, tokens: int, now: float) -> None:
        self.items.append((now, tokens))
        self.total += tokens

    def sum(self, now: float) -> int:
        while self.items and now - self.items[0][0] >= self.seconds:
            self.total -= self.items.popleft()[1]
        return self.total


class RouterAudit:
    def __init__(
        self,
        spec: GatewaySpec,
        router: Router,
        session: Callable[[], aiohttp.ClientSession | None],
        ship: Callable[[dict[str, Any]], None],
        registry: CollectorRegistry,
    ) -> None:
        self.spec: AuditSpec = spec.router_audit
        self.models = (spec.model_router.small_model, spec.model_router.large_model) if spec.model_router else None
        self.router = router
        self.session = session
        self.ship = ship
        self.quality = Quality(QualitySpec(sample_rate=0.0))  # a capture's text cap only
        self.judge = Judge(self.spec.judge, self._judge_replica, self._judged) if self.spec.judge else None
        self.users = _Window(self.spec.window_s)
        self.shadows = _Window(self.spec.window_s)
        self.tasks: set[asyncio.Task[None]] = set()
        self._threshold = int(self.spec.sample_rate * 2**64)
        self.audits = Counter(
            "fleetscope_gateway_router_audits_total",
            "Router decisions considered for a shadow replay",
            ["result"],
            registry=registry,
        )
        self.judge_calls = Counter(
            "fleetscope_gateway_judge_calls_total", "Judge calls of the router audit", ["result"], registry=registry
        )

    def _judge_replica(self) -> str | None:
        """A healthy replica of the fleet serving the judge's model (its URL), or None."""
        assert self.spec.judge is not None
        try:
            return self.router.choose_replica(self.spec.judge.model, "judge")[0].url
        except NoReplica:
            return None

    def direction(self, model: str) -> tuple[str, str] | None:
        """(direction, the shadow's model) for a request routed to ``model``, if it is audited."""
        if self.models is None:
            return None
        small, large = self.models
        pair = {small: ("small_to_large", large), large: ("large_to_small", small)}.get(model)
        return pair if pair is not None and pair[0] in self.spec.directions else None

    def wants(self, route: str, model: str, key: str) -> AnswerCapture | None:
        """A capture of the answer when this request (the router chose ``model``) is sampled."""
        if not self.spec.enabled or not route.startswith("model-router") or self.direction(model) is None:
            return None
        digest = int.from_bytes(hashlib.sha256(f"audit:{key}".encode("utf-8", "surrogatepass")).digest()[:8], "big")
        return AnswerCapture(self.quality, asked_json=False) if digest < self._threshold else None

    def served(self, tokens: int) -> None:
        """A user's request finished well with ``tokens`` (prompt + completion)."""
        self.users.add(tokens, time.monotonic())

    def after(self, row: dict[str, Any], body: dict[str, Any], chat: bool, capture: AnswerCapture) -> None:
        """The audited request's answer is finished (``row``: its log record): replay it in shadow
        if the share allows."""
        if row.get("outcome") != "ok" or not capture.answered:
            return
        now = time.monotonic()
        tokens = int(row.get("prompt_tokens", 0)) + int(row.get("completion_tokens", 0))
        if self.shadows.sum(now) >= self.spec.max_share * self.users.sum(now):
            self.audits.labels("over_share").inc()
            return
        self.shadows.add(tokens, now)
        task = asyncio.get_running_loop().create_task(self._shadow(row, body, chat, "".join(capture.pieces)))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _shadow(self, row: dict[str, Any], body: dict[str, Any], chat: bool, routed_text: str) -> None:
        pair = self.direction(row["model"])
        session = self.session()
        if pair is None or session is None:
            return
        direction, model = pair
        trace_id = secrets.token_hex(16)
        shadow: dict[str, Any] = {
            "ts": time.time(),
            "trace_id": trace_id,
            "tenant": self.spec.tenant,
            "model": model,
            "route": "shadow",
            "route_reason": row.get("route_reason", ""),
            "prompt_tokens": row.get("prompt_tokens", 0),
            "max_tokens": row.get("max_tokens", 0),
            "stream": False,
            "audit_of": row["trace_id"],
            "audit_direction": direction,
        }
        t0 = time.perf_counter()
        text = await self._send(session, shadow, body, chat, trace_id)
        shadow["e2e_seconds"] = time.perf_counter() - t0
        if text is None:
            self.audits.labels("failed").inc()
        else:
            self.audits.labels("shadowed").inc()
            shadow["agreement"] = agreement(routed_text, text)
            if self.judge is not None:
                judged = await self._grade(session, request_text(body, chat), routed_text, text)
                shadow["judge_routed"], shadow["judge_shadow"] = judged
        self.ship(shadow)

    async def _send(
        self, session: aiohttp.ClientSession, shadow: dict[str, Any], body: dict[str, Any], chat: bool, trace_id: str
    ) -> str | None:
        """The shadow's answer text (its record filled in), or None when it failed."""
        try:
            decision = self.router.decide(shadow["model"], self.spec.tenant, shadow["prompt_tokens"], 0, trace_id)
        except NoReplica as exc:
            shadow.update(status_code=503, outcome="no_replica", error=str(exc))
            return None
        replica = decision.replica
        shadow["replica"] = replica.name
        upstream = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        upstream["model"] = shadow["model"]
        headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01", "x-tenant": self.spec.tenant}
        path = "/v1/chat/completions" if chat else "/v1/completions"
        replica.in_flight += 1
        try:
            async with session.post(
                f"{replica.url}{path}",
                json=upstream,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.spec.timeout_s),
            ) as response:
                shadow["status_code"] = response.status
                if response.status != 200:
                    shadow.update(outcome="upstream_error", error=f"shadow answered HTTP {response.status}")
                    return None
                payload = await response.json(content_type=None)
            return _answer(shadow, payload)
        except (aiohttp.ClientError, OSError, TimeoutError, RuntimeError, ValueError, TypeError) as exc:
            # RuntimeError: the session closed under it (the gateway stopping); ValueError and
            # TypeError: an answer that is not the OpenAI shape
            shadow.update(status_code=502, outcome="upstream_error", error=f"shadow failed: {exc!r}"[:500])
            return None
        finally:
            replica.in_flight -= 1

    async def _grade(
        self, session: aiohttp.ClientSession, question: str, routed: str, shadow: str
    ) -> tuple[float | None, float | None]:
        assert self.judge is not None
        return await self.judge.grade_pair(session, question, routed, shadow)

    def _judged(self, result: str, n: int) -> None:
        self.judge_calls.labels(result).inc(n)

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait (a while) for the shadows in flight, before the gateway stops; the ones still
        running then are cancelled (not logged: their answers never came)."""
        if self.tasks:
            _done, pending = await asyncio.wait(list(self.tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
