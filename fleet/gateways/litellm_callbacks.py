"""fleetscope's callbacks inside LiteLLM's proxy (its own virtualenv, not fleetscope's processes):
the fleet's model router as a pre-call hook (``router``), and the request records sent to the
collector (``requests``).

``router`` —
In:  a request to the model group ``auto`` (or the name in ``FLEETSCOPE_AUTO_MODEL``) and the
     rules of the spec's ``gateway.model_router``, from the environment the launcher sets
     (``FLEETSCOPE_ROUTER``: JSON of small_model, large_model, long_prompt_tokens, high_max_tokens).
Out: the request sent to the small or the large model, and the decision recorded in the request's
     ``metadata.spend_logs_metadata`` (LiteLLM's key-value pairs for its logs): ``fleetscope_route``
     (``auto:small`` / ``auto:large``) and ``fleetscope_route_reason`` (in words, e.g. "long
     prompt (1150 > 1024 tokens)"), which its records carry to fleetscope as the request's route
     and route reason.

LiteLLM's own length check (``enable_pre_call_checks`` with ``max_input_tokens``) counts no token
of a token-id prompt, which fleetscope's traffic sends: this hook counts them.

``requests`` —
In:  each finished request's StandardLoggingPayload (success or failure).
Out: NDJSON batches POSTed every second to ``FLEETSCOPE_REQUESTS_URL`` (the collector's
     ``/v1/litellm``), the same records LiteLLM's own ``generic_api`` callback sends. That callback
     (1.106.2) clears its whole queue after each POST, so a record that finishes while a batch is
     in flight is lost (1 of 25 requests in a test here); this one removes only what it sent, keeps
     a batch the collector could not take (up to 100,000 records, 30 tries) and sends it again
     (the collector drops a request id it already has: a batch whose answer was lost counts once).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx
from litellm.integrations.custom_logger import CustomLogger
from litellm.litellm_core_utils.safe_json_dumps import safe_dumps

MAX_QUEUE = 100_000
BATCH = 1_000
MAX_BYTES = 8 * 1024 * 1024  # a batch's body (the collector takes up to 32 MiB)
MAX_TRIES = 30  # a batch the collector keeps failing on (5xx, no answer) is given up after 30 s


def _prompt_tokens(data: dict[str, Any]) -> int:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return len(prompt)
    text = (
        prompt if isinstance(prompt, str) else " ".join(str(m.get("content", "")) for m in data.get("messages") or [])
    )
    return max(1, len(str(text)) // 4)  # ~4 characters a token, for text


class FleetscopeRouter(CustomLogger):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.rules = json.loads(os.environ.get("FLEETSCOPE_ROUTER", "{}"))
        self.auto = os.environ.get("FLEETSCOPE_AUTO_MODEL", "auto")

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
    ) -> Any:
        if not self.rules or data.get("model") != self.auto:
            return data
        n, max_tokens = _prompt_tokens(data), int(data.get("max_tokens") or 0)
        if n > self.rules["long_prompt_tokens"]:
            model, tier, reason = (
                self.rules["large_model"],
                "large",
                f"long prompt ({n} > {self.rules['long_prompt_tokens']} tokens)",
            )
        elif max_tokens > self.rules["high_max_tokens"]:
            model, tier, reason = (
                self.rules["large_model"],
                "large",
                f"high max_tokens ({max_tokens} > {self.rules['high_max_tokens']})",
            )
        else:
            model, tier, reason = self.rules["small_model"], "small", "easy request"
        data["model"] = model
        # LiteLLM keeps spend_logs_metadata in its records (it strips routing_decision set by a hook)
        metadata = data.setdefault("metadata", {})
        spend = metadata.get("spend_logs_metadata")
        metadata["spend_logs_metadata"] = {
            **(spend if isinstance(spend, dict) else {}),
            "fleetscope_route": f"{self.auto}:{tier}",
            "fleetscope_route_reason": reason,
        }
        return data


class FleetscopeRequests(CustomLogger):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.url = os.environ.get("FLEETSCOPE_REQUESTS_URL", "")
        self.queue: list[Any] = []
        self.task: asyncio.Task[None] | None = None

    def _add(self, kwargs: dict[str, Any]) -> None:
        record = kwargs.get("standard_logging_object")
        if record is None or not self.url:
            return
        self.queue.append(record)
        if len(self.queue) > MAX_QUEUE:
            del self.queue[: len(self.queue) - MAX_QUEUE]
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._send_forever())

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._add(kwargs)

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self._add(kwargs)

    async def _send_forever(self) -> None:
        tries = 0
        async with httpx.AsyncClient(timeout=30) as client:
            while True:
                await asyncio.sleep(1.0)
                batch: list[tuple[Any, str]] = []
                size = 0
                for record in self.queue[:BATCH]:  # at most BATCH records and MAX_BYTES of them
                    line = safe_dumps(record)
                    if batch and size + len(line) > MAX_BYTES:
                        break
                    batch.append((record, line))
                    size += len(line) + 1
                if not batch:
                    continue
                body = "\n".join(line for _record, line in batch)
                try:
                    answer = await client.post(self.url, content=body, headers={"Content-Type": "application/x-ndjson"})
                    done = answer.status_code < 500  # taken, or refused for reasons the collector reports
                except httpx.HTTPError:
                    done = False  # away, or no answer: sent again (the collector drops a request id it has)
                tries = 0 if done else tries + 1
                if done or tries >= MAX_TRIES:
                    sent = {id(record) for record, _line in batch}  # by identity: the queue may have moved
                    self.queue[:] = [r for r in self.queue if id(r) not in sent]
                    tries = 0


router = FleetscopeRouter()
requests = FleetscopeRequests()
