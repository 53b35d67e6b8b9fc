"""The gateway's sampling of answers: a request -> whether it is sampled; a sampled answer's
pieces -> its text (capped) -> the quality fields of its request-log record.

In:  the request (its ``x-request-id`` header, else its trace id; its ``response_format``), then
     the answer as it passes through: each streamed event (``choices[].delta.content`` or
     ``choices[].text``), or the whole non-streamed answer (``choices[0].message.content`` or
     ``choices[0].text``; the first choice only, where ``n`` > 1), and at the end the record's
     finish reason, ``max_tokens`` and completion tokens.
Out: for a sampled request only, the fields of ``fleet.quality.evaluators.Scores.record`` to put
     in the record (``evaluated``, ``answer_hash``, ``answer_chars``, ``truncated``,
     ``empty_answer``, ``refusal``, ``repetition``, ``json_valid``), and ``answer_text`` only with
     ``quality.keep_text`` (every ``quality.redact`` match replaced by ``[redacted]``). An
     unsampled request gets no field and costs nothing.

The decision is a hash of the request's key, not a random draw: a retry that carries the same
``x-request-id`` (or ``traceparent``) is sampled alike. At most ``quality.max_chars`` characters
of an answer are kept to score; ``answer_chars`` still counts the whole answer.
"""

from __future__ import annotations

import hashlib
from typing import Any

from fleet.gateway.config import QualitySpec
from fleet.quality.evaluators import compile_patterns, evaluate

__all__ = ["JSON_FORMATS", "REDACTED", "AnswerCapture", "Quality"]

REDACTED = "[redacted]"
JSON_FORMATS = ("json_object", "json_schema")


class AnswerCapture:
    """One sampled answer's text, gathered as it passes, up to ``max_chars`` characters."""

    def __init__(self, quality: Quality, asked_json: bool) -> None:
        self.quality = quality
        self.asked_json = asked_json
        self.pieces: list[str] = []
        self.kept = 0  # characters in pieces
        self.seen = 0  # characters of the whole answer
        self.answered = False  # a successful answer came (only those are scored)

    def add(self, piece: Any) -> None:
        if not isinstance(piece, str) or not piece:
            return
        self.seen += len(piece)
        room = self.quality.spec.max_chars - self.kept
        if room > 0:
            self.pieces.append(piece[:room])
            self.kept += min(room, len(piece))

    def add_event(self, chunk: dict[str, Any]) -> None:
        """A streamed event: its choices' delta content (chat) or text (completions)."""
        self.answered = True
        for choice in chunk.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                delta = choice.get("delta")
                self.add(delta.get("content") if isinstance(delta, dict) else choice.get("text"))

    def add_answer(self, payload: dict[str, Any]) -> None:
        """A whole non-streamed answer: its first choice's message content or text."""
        self.answered = True
        choices = payload.get("choices") or []
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        message = first.get("message")
        self.add(message.get("content") if isinstance(message, dict) else first.get("text"))

    def fields(self, finish_reason: str, max_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """The record's quality fields; none when no answer came (an error: nothing to score)."""
        if not self.answered:
            return {}
        text = "".join(self.pieces)
        scores = evaluate(
            text,
            finish_reason=finish_reason,
            max_tokens=max_tokens,
            completion_tokens=completion_tokens,
            asked_json=self.asked_json,
            patterns=self.quality.refusals,
        )
        fields = scores.record()
        fields["answer_chars"] = max(scores.answer_chars, self.seen)  # beyond max_chars: counted as received
        if self.quality.spec.keep_text:
            fields["answer_text"] = self.quality.redact(text)
        return fields


class Quality:
    """The ``quality`` settings compiled once: the sampling decision and the patterns."""

    def __init__(self, spec: QualitySpec) -> None:
        self.spec = spec
        self.refusals = compile_patterns(spec.refusal_patterns)
        self._redact = compile_patterns(spec.redact, "redact pattern", flags=0) if spec.redact else None
        self._threshold = int(spec.sample_rate * 2**64)

    def sampled(self, key: str) -> bool:
        """Whether the request with this key is sampled (the same key: the same answer)."""
        if self._threshold <= 0:
            return False
        digest = int.from_bytes(hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()[:8], "big")
        return digest < self._threshold

    def capture(self, headers: Any, body: dict[str, Any], trace_id: str) -> AnswerCapture | None:
        """A capture for a sampled request, else None. ``headers``: the request's (a mapping)."""
        key = str(headers.get("x-request-id") or "").strip()[:256] or trace_id
        if not self.sampled(key):
            return None
        response_format = body.get("response_format")
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        return AnswerCapture(self, asked_json=kind in JSON_FORMATS)

    def redact(self, text: str) -> str:
        return self._redact.sub(REDACTED, text) if self._redact is not None else text
