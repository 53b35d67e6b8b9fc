"""The judge: an LLM that grades answers, behind an OpenAI-compatible endpoint, on a bounded budget.

In:  ``JudgeSpec`` (endpoint or, without one, a function that finds a replica of the fleet serving
     its model; model, rubric, budget: calls per minute and in all, timeout), an aiohttp session,
     and per call the request (as text) and one answer.
Out: ``Judge.grade``: the score 0-1 (the judge's 1-5, as (s - 1) / 4), or None when the judge was
     not asked (over its budget), failed (an error, a timeout) or answered no score; ``counts``
     says how often each happened (the gateway exports them).

The judge is asked with ``temperature`` 0 for a few tokens (``/v1/chat/completions``: the rubric as
the system message, the request and the answer as the user's), and its first digit 1-5 is the
score. With ``constrained`` the request also carries vLLM's structured outputs
(``structured_outputs: {"choice": ["1", ..., "5"]}``), so even a small model answers with a score.
The budget is checked before a call, so a judge never gets more than ``max_calls_per_minute``
calls in any 60 s nor more than ``max_calls`` in all (the audit spends it in pairs, so each is at
least 2); the audit goes on without the judge's
score (text agreement only) when the budget is spent.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import aiohttp

from fleet.gateway.config import JudgeSpec

__all__ = ["SCORES", "Judge", "judge_messages", "parse_score"]

SCORES = ("1", "2", "3", "4", "5")
_SCORE = re.compile(r"[1-5]")


def parse_score(text: str) -> float | None:
    """The first digit 1-5 of the judge's answer as 0-1, else None."""
    found = _SCORE.search(text or "")
    return (int(found.group()) - 1) / 4 if found else None


def judge_messages(spec: JudgeSpec, request: str, answer: str) -> list[dict[str, str]]:
    """The chat the judge is given: the rubric, then the request and the answer (each capped)."""
    cap = spec.max_answer_chars
    return [
        {"role": "system", "content": spec.rubric},
        {"role": "user", "content": f"Request:\n{request[:cap]}\n\nAnswer:\n{answer[:cap]}\n\nScore (1-5):"},
    ]


class Judge:
    """One judge endpoint and its budget."""

    def __init__(
        self,
        spec: JudgeSpec,
        locate: Callable[[], str | None] | None = None,
        on_count: Callable[[str, int], None] | None = None,
    ) -> None:
        self.spec = spec
        self.locate = locate  # the URL of a replica serving spec.model, where spec.url is not set
        self.on_count = on_count  # told of each result as it is counted (the gateway's metric)
        self.recent: deque[float] = deque()  # monotonic times of the calls in the last 60 s
        self.calls = 0
        self.counts: Counter[str] = Counter()  # scored, no_score, failed, over_budget

    def _count(self, result: str, n: int = 1) -> None:
        self.counts[result] += n
        if self.on_count is not None:
            self.on_count(result, n)

    def _take(self, n: int = 1) -> bool:
        """Spend ``n`` calls of the budget at once, or none and False when they do not fit."""
        now = time.monotonic()
        while self.recent and now - self.recent[0] >= 60.0:
            self.recent.popleft()
        if len(self.recent) + n > self.spec.max_calls_per_minute:
            return False
        if self.spec.max_calls is not None and self.calls + n > self.spec.max_calls:
            return False
        self.recent.extend([now] * n)
        self.calls += n
        return True

    def body(self, request: str, answer: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.spec.model,
            "messages": judge_messages(self.spec, request, answer),
            "max_tokens": 4,
            "temperature": 0,
        }
        if self.spec.constrained:
            body["structured_outputs"] = {"choice": list(SCORES)}
        return body

    def base_url(self) -> str | None:
        """Where the judge is asked: its ``url``, else ``self.locate()`` (a replica of the fleet)."""
        return self.spec.url or (self.locate() if self.locate is not None else None)

    async def grade_pair(
        self, session: aiohttp.ClientSession, request: str, first: str, second: str
    ) -> tuple[float | None, float | None]:
        """Both answers graded, or neither (two calls taken from the budget together: a pair half
        graded says nothing about the gap between them)."""
        if not self._take(2):
            self._count("over_budget", 2)
            return None, None
        scores = await asyncio.gather(self._ask(session, request, first), self._ask(session, request, second))
        return scores[0], scores[1]

    async def grade(self, session: aiohttp.ClientSession, request: str, answer: str) -> float | None:
        """The judge's score of ``answer`` to ``request`` (0-1), or None (see the module doc)."""
        if not self._take():
            self._count("over_budget")
            return None
        return await self._ask(session, request, answer)

    async def _ask(self, session: aiohttp.ClientSession, request: str, answer: str) -> float | None:
        headers = {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}
        base = self.base_url()
        if base is None:  # no replica serves the judge's model now
            self._count("failed")
            return None
        url = f"{base.rstrip('/')}/v1/chat/completions"
        try:
            async with session.post(
                url,
                json=self.body(request, answer),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.spec.timeout_s),
            ) as response:
                payload = await response.json(content_type=None)
                if response.status != 200:
                    raise ValueError(f"HTTP {response.status}")
            choices = payload.get("choices") or [{}]
            text = str((choices[0].get("message") or {}).get("content") or "")
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, AttributeError):
            self._count("failed")
            return None
        score = parse_score(text)
        self._count("scored" if score is not None else "no_score")
        return score
