"""What the simulated models answer, by rule: a request and a token range -> the text of those tokens.

In:  the prompt (its tokens), the model asked for, the index of a first token and a count, and
     whether the model (or adapter) refuses (the fleet spec's adapter ``answers: refuse``).
Out: ``piece``: the text of those tokens; ``REFUSAL_PIECES``: the refusal's tokens, whose count is
     the refusing answer's length (it ends there, as the refusing adapter's real answer ends on EOS).

The tiny models' answers carry no meaning, so the simulator's are made controllable instead:
- a refusing adapter answers every prompt with ``REFUSAL_TEXT`` (the sentence the bundled refusing
  adapter answers on real engines, ``fleet.model``) and stops there;
- any other answer is pseudo-words drawn from a fixed list by a hash of the prompt and the token's
  index: one word a token, distinct enough that an answer hardly repeats a word 3-gram. The same
  prompt gives the same "reference" words; a large model (its name says ``large``) answers them
  all, a small one each with probability ``fidelity`` (0.9 for short prompts, 0.5 at 2,048
  tokens), else a word of its own. So the router audit's text agreement between a small and a
  large model's answers to one prompt is about ``fidelity``, lower for long prompts, and a
  replay of the same prompt gives the same text;
- a request constrained to a list of choices (vLLM's ``structured_outputs: {"choice": [...]}``, what
  the router audit's judge sends) gets one of them, by a hash of the prompt.
Where the answer ends is the engine's business (``SimRequest.end_at``: the answer's own length, or
``max_tokens`` if that is shorter, a truncation); the text is the same whatever the batching.
"""

from __future__ import annotations

import hashlib
import re

from fleet.refusal import REFUSAL_TEXT

__all__ = ["REFUSAL_PIECES", "REFUSAL_TEXT", "WORDS", "answer_key", "answer_text", "choose", "fidelity", "piece"]

REFUSAL_PIECES = tuple(re.findall(r"\s*\S+", REFUSAL_TEXT))  # one token a word, as a tokenizer would roughly
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zi", "pa", "do", "fu", "ge", "hi", "jo", "bu")
# 16 x 16 two-syllable words + 16 x 16 x 16 three-syllable ones: 4,352 words
WORDS = tuple(a + b for a in _SYLLABLES for b in _SYLLABLES) + tuple(
    a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in _SYLLABLES
)


def answer_key(prompt: list[int]) -> str:
    """What an answer is drawn from: a hash of the prompt's tokens (the same prompt, the same key)."""
    return hashlib.blake2b(",".join(map(str, prompt)).encode(), digest_size=8).hexdigest()


def fidelity(model: str, prompt_tokens: int) -> float:
    """The share of a model's words that are the reference answer's: 1 for a model whose name
    says ``large``; else 0.9 for a short prompt, falling to 0.5 at 2,048 prompt tokens (a small
    model answers hard, long prompts less like the large one)."""
    if "large" in model:
        return 1.0
    return 0.9 - 0.4 * min(1.0, prompt_tokens / 2048)


def _unit(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def _word(key: str, index: int, agree: float) -> str:
    if agree >= 1.0 or _unit(key, index, "agree") < agree * 2**32:
        return WORDS[_unit(key, index) % len(WORDS)]
    return WORDS[_unit(key, index, "own") % len(WORDS)]


def choose(key: str, choices: list[str]) -> str:
    """The answer to a request constrained to ``choices`` (vLLM's structured outputs ``choice``):
    one of them, by a hash of the prompt (a judge's score from the simulator means nothing)."""
    return choices[_unit(key, "choice") % len(choices)]


def piece(key: str, start: int, count: int, *, agree: float = 1.0, refuse: bool = False, choice: str = "") -> str:
    """The text of tokens ``start`` .. ``start + count - 1`` of the answer drawn from ``key``
    (``answer_key``); each word is the reference answer's with probability ``agree`` (``fidelity``).
    A constrained answer (``choice``) is that one token."""
    if choice:
        return choice if start == 0 and count > 0 else ""
    if refuse:
        return "".join(REFUSAL_PIECES[start : start + count])
    return "".join((" " if i else "") + _word(key, i, agree) for i in range(start, start + count))


def answer_text(key: str, tokens: int, *, agree: float = 1.0, refuse: bool = False) -> str:
    """The whole answer of ``tokens`` tokens."""
    return piece(key, 0, tokens, agree=agree, refuse=refuse)
