"""Evaluators of one answer: its text and how it ended -> ``Scores`` (pure, no I/O).

In:  the answer's text (assembled by the caller: the gateway joins a stream's pieces), its finish
     reason, the request's ``max_tokens``, the completion tokens the engine reported, whether JSON
     was asked (``response_format``), and the refusal patterns (default ``DEFAULT_REFUSALS``).
Out: ``Scores``: truncated, empty_answer, refusal, repetition, json_valid, answer_chars and
     answer_hash; ``Scores.record()`` gives them under the names of the request log and of the
     ``requests`` table (migration 0014).

The text is normalised to NFC first, so one answer written with composed or with decomposed
characters (``é`` or ``e`` + U+0301) gets the same hash and the same scores. It stays fast on very
long answers: the hash and ``answer_chars`` cover the whole text and JSON validity parses the
whole text (linear, in C), but the refusal patterns, the repetition measure and the emptiness
check look at the first ``EXAMINED_CHARS`` (65,536) characters only.

What each one measures, and what it misses (docs/quality.md says the same):
- truncated: the engine stopped at ``max_tokens`` (finish reason ``length``; with no finish
  reason, completion tokens >= max_tokens). Not whether the answer was complete in substance.
- empty_answer: no letter, digit or symbol in the text (``MIN_CONTENT_CHARS``): nothing,
  whitespace, punctuation only, invisible characters (zero-width space, BOM). A one-character
  answer (``7``, ``👍``) is an answer.
- refusal: one of a list of case-insensitive regular expressions matches. A pattern list: it
  misses paraphrases and languages it does not list, and can match a refusal that is quoted.
- repetition: the share of repeated word 3-grams among the answer's 3-grams (lexical
  degeneration: ``the the the ...`` is near 1, ordinary prose near 0; 0 under 3 words). Words are
  runs of letters/digits, lower-cased; each CJK ideograph or kana is a word of its own. It does
  not see a repeated idea said in other words.
- agreement (of two answers, the router audit's text measure): the F1 of their word multisets.
  Lexical: a paraphrase scores low, the same words in another sense high.
- json_valid: ``None`` when JSON was not asked; else whether the text (without a Markdown
  ```` ```json ```` fence) parses as strict JSON (no ``NaN``/``Infinity``). Syntax only: not the
  schema, not the content.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT_REFUSALS",
    "EXAMINED_CHARS",
    "MIN_CONTENT_CHARS",
    "NGRAM",
    "Patterns",
    "Scores",
    "agreement",
    "compile_patterns",
    "evaluate",
]

EXAMINED_CHARS = 65_536  # refusal, repetition and emptiness look at this many characters at most
MIN_CONTENT_CHARS = 1  # fewer letters/digits/symbols than this: an empty answer
NGRAM = 3  # repetition: word n-grams of this length
_APOS = "['\u2019]"  # a straight or a typographic apostrophe

DEFAULT_REFUSALS: tuple[str, ...] = (
    # English
    rf"\bI(?:{_APOS}m| am) sorry,? but I (?:can{_APOS}?t|cannot|can not|won{_APOS}t|am unable|{_APOS}m unable)",
    rf"\bI (?:can{_APOS}?t|cannot|can not|won{_APOS}t) help (?:you )?with\b",
    rf"\bI(?: can{_APOS}?t| cannot| can not| won{_APOS}t| am unable to|{_APOS}m unable to) assist\b",
    rf"\bI(?:{_APOS}m| am) not able to (?:help|assist)\b",
    r"\bas an AI(?: language model| assistant)?,",
    # French, German, Spanish, Italian, Portuguese, Russian
    r"\bje ne peux pas (?:vous |t['\u2019])?aider\b",
    r"\bje suis désolée?,? mais je ne peux pas\b",
    r"\bich kann (?:Ihnen |dir )?(?:dabei |damit |hierbei )?nicht helfen\b",
    r"\bes tut mir leid,? aber ich kann\b",
    r"\bno puedo ayudar(?:te|le)?\b",
    r"\blo siento,? pero no puedo\b",
    r"\bnon posso aiutar(?:ti|la|vi)?\b",
    r"\bnão posso ajudar\b",
    r"\bя не могу (?:помочь|с этим помочь)\b",
    # Chinese, Japanese
    r"抱歉[，,]?\s*我(?:无法|不能)",
    r"我(?:无法|不能)(?:帮助|协助|提供)",
    r"申し訳(?:ありません|ございません)が.{0,30}?(?:できません|お手伝いできません)",
)

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+")
_FENCE = re.compile(r"\A\s*```[ \t]*(?:json)?[ \t]*\r?\n(.*?)\r?\n?[ \t]*```\s*\Z", re.DOTALL | re.IGNORECASE)
_CONTENT_CATEGORIES = ("L", "N", "S")  # letters, digits, symbols (emoji); not punctuation, space, format


@dataclass(frozen=True)
class Scores:
    """One answer's scores (the names of the request log and of the ``requests`` columns)."""

    truncated: bool
    empty_answer: bool
    refusal: bool
    repetition: float
    json_valid: bool | None
    answer_chars: int
    answer_hash: str

    def record(self) -> dict[str, Any]:
        """The request-log fields, with ``evaluated`` set."""
        return {
            "evaluated": True,
            "answer_hash": self.answer_hash,
            "answer_chars": self.answer_chars,
            "truncated": self.truncated,
            "empty_answer": self.empty_answer,
            "refusal": self.refusal,
            "repetition": round(self.repetition, 4),
            "json_valid": self.json_valid,
        }


class Patterns:
    """A list of regular expressions compiled once; each is compiled on its own, so any Python
    regular expression works (a global flag such as ``(?i)`` at its start included)."""

    def __init__(self, patterns: Iterable[str], what: str = "refusal pattern", flags: int = re.IGNORECASE) -> None:
        self.compiled: list[re.Pattern[str]] = []
        for pattern in patterns:
            try:
                self.compiled.append(re.compile(pattern, flags))
            except re.error as exc:
                raise ValueError(f"{what} {pattern!r} is not a regular expression: {exc}") from None

    def search(self, text: str) -> bool:
        """Whether any pattern matches somewhere in ``text``."""
        return any(p.search(text) for p in self.compiled)

    def sub(self, replacement: str, text: str) -> str:
        """``text`` with every match of every pattern (in order) replaced."""
        for pattern in self.compiled:
            text = pattern.sub(replacement, text)
        return text


def compile_patterns(patterns: Iterable[str], what: str = "refusal pattern", flags: int = re.IGNORECASE) -> Patterns:
    """``patterns`` compiled (case-insensitive by default); a bad one is a ``ValueError`` naming it."""
    return Patterns(patterns, what, flags)


_DEFAULT = compile_patterns(DEFAULT_REFUSALS)


def evaluate(
    text: str | None,
    *,
    finish_reason: str | None,
    max_tokens: int,
    completion_tokens: int,
    asked_json: bool,
    patterns: Iterable[str] | Patterns = DEFAULT_REFUSALS,
) -> Scores:
    """Score one answer (see the module docstring for what each score is and misses).

    ``patterns``: regular expressions (searched case-insensitively), or ``Patterns`` (the gateway
    compiles its list once). ``text`` None is an answer with no text."""
    whole = unicodedata.normalize("NFC", text or "")
    examined = whole[:EXAMINED_CHARS]
    if isinstance(patterns, Patterns):
        refusals = patterns
    else:
        refusals = _DEFAULT if patterns is DEFAULT_REFUSALS else compile_patterns(patterns)
    return Scores(
        truncated=finish_reason == "length" or (not finish_reason and 0 < max_tokens <= completion_tokens),
        empty_answer=_content_chars(examined, MIN_CONTENT_CHARS) < MIN_CONTENT_CHARS,
        refusal=refusals.search(examined),
        repetition=repetition(examined),
        json_valid=_json_valid(whole) if asked_json else None,
        answer_chars=len(whole),
        answer_hash=answer_hash(whole),
    )


def answer_hash(text: str) -> str:
    """sha256 of the NFC text's UTF-8, its first 16 hex digits."""
    return hashlib.sha256(unicodedata.normalize("NFC", text).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def repetition(text: str, n: int = NGRAM) -> float:
    """Share of the word n-grams of ``text`` that repeat an earlier one (0 under ``n`` words)."""
    words = [w.casefold() for w in _WORD.findall(text)]
    total = len(words) - n + 1
    if total <= 0:
        return 0.0
    grams = {tuple(words[i : i + n]) for i in range(total)}
    return (total - len(grams)) / total


def agreement(a: str, b: str) -> float:
    """How far two answers use the same words: the F1 of their word multisets (unigrams, the
    words of ``repetition``, case-folded, NFC, the first ``EXAMINED_CHARS`` characters): 1 for
    the same words in any order, 0 for none in common; two empty answers agree (1). Lexical, not
    semantic: a paraphrase scores low, the same words saying the opposite score high."""
    words = [
        Counter(w.casefold() for w in _WORD.findall(unicodedata.normalize("NFC", t[:EXAMINED_CHARS]))) for t in (a, b)
    ]
    total = sum(words[0].values()) + sum(words[1].values())
    if total == 0:
        return 1.0
    common = sum((words[0] & words[1]).values())
    return 2 * common / total


def _content_chars(text: str, enough: int) -> int:
    """Letters, digits and symbols in ``text``, counted up to ``enough``."""
    count = 0
    for char in text:
        if unicodedata.category(char)[0] in _CONTENT_CATEGORIES:
            count += 1
            if count >= enough:
                break
    return count


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_valid(text: str) -> bool:
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    try:
        json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return False
    return True
