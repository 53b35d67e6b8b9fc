"""The evaluators on hand-written answers: every class (truncated, empty, refusal in several
phrasings and languages, repetition high and low, JSON valid, invalid, fenced and not asked),
unicode (emoji, CJK, combining marks: NFC and NFD alike), a 1 MB answer and an empty one."""

from __future__ import annotations

import hashlib
import json
import unicodedata

import pytest

from fleet.quality.evaluators import DEFAULT_REFUSALS, EXAMINED_CHARS, Scores, compile_patterns, evaluate


def score(text: str | None, **kw: object) -> Scores:
    args: dict[str, object] = {
        "finish_reason": "stop",
        "max_tokens": 256,
        "completion_tokens": 20,
        "asked_json": False,
    }
    args.update(kw)
    return evaluate(text, **args)  # type: ignore[arg-type]


PROSE = (
    "The capital of France is Paris. It sits on the Seine, has about two million inhabitants "
    "and is known for its museums, its cafés and the Eiffel Tower, built for the 1889 fair."
)


def test_an_ordinary_answer_has_no_flag() -> None:
    s = score(PROSE)
    assert (s.truncated, s.empty_answer, s.refusal, s.json_valid) == (False, False, False, None)
    assert s.repetition == 0.0
    assert s.answer_chars == len(PROSE)
    assert s.answer_hash == hashlib.sha256(PROSE.encode()).hexdigest()[:16]


@pytest.mark.parametrize(
    ("finish_reason", "completion_tokens", "truncated"),
    [
        ("length", 64, True),  # the engine says it stopped at max_tokens
        ("length", 3, True),  # the finish reason wins over the count
        ("stop", 64, False),  # a natural stop at exactly max_tokens is not a truncation
        (None, 64, True),  # no finish reason: the count decides
        ("", 63, False),
    ],
)
def test_truncated_by_finish_reason_or_by_the_count(
    finish_reason: str | None, completion_tokens: int, truncated: bool
) -> None:
    s = score(PROSE, finish_reason=finish_reason, max_tokens=64, completion_tokens=completion_tokens)
    assert s.truncated is truncated


@pytest.mark.parametrize("text", [None, "", "   \n\t ", "...", " . ", "\u200b\u200b\ufeff", "？！"])
def test_no_text_or_only_space_punctuation_or_invisible_characters_is_empty(text: str | None) -> None:
    assert score(text).empty_answer


@pytest.mark.parametrize("text", ["7", "No", "👍", "是", "  ok  "])
def test_a_short_real_answer_is_not_empty(text: str) -> None:
    assert not score(text).empty_answer


@pytest.mark.parametrize(
    "text",
    [
        "I can't help with that request.",
        "I can\u2019t help with that.",  # typographic apostrophe
        "Sorry — I cannot assist with creating malware.",
        "I'm sorry, but I can't provide that information.",
        "i am sorry but i cannot do that",  # case and a missing comma
        "As an AI language model, I do not have opinions.",
        "Here is my answer. However, I'm unable to assist with the second part.",  # not at the start
        "Je suis désolé, mais je ne peux pas répondre à cela.",
        "Ich kann Ihnen dabei nicht helfen.",
        "Lo siento, pero no puedo hacer eso.",
        "Non posso aiutarti con questa richiesta.",
        "Я не могу помочь с этим запросом.",
        "抱歉，我无法回答这个问题。",
        "申し訳ありませんが、そのご依頼にはお応えできません。",
    ],
)
def test_refusals_in_several_phrasings_and_languages(text: str) -> None:
    assert score(text).refusal


@pytest.mark.parametrize(
    "text",
    [
        PROSE,
        "Yes, I can help with that: here are the steps.",
        "As an AI researcher put it, models are tools.",  # "as an AI" not followed by a comma
        # a paraphrase the list does not know: the documented blind spot
        "That is not something I am going to write for you.",
    ],
)
def test_answers_the_patterns_do_not_call_refusals(text: str) -> None:
    assert not score(text).refusal


def test_refusal_patterns_are_configurable_and_a_bad_one_is_named() -> None:
    custom = ["computer says no"]
    assert score("Computer says NO.", patterns=custom).refusal
    assert not score("I can't help with that.", patterns=custom).refusal  # the list replaces the default
    with pytest.raises(ValueError, match=r"refusal pattern '\(unclosed' is not a regular expression"):
        compile_patterns([*DEFAULT_REFUSALS, "(unclosed"])
    with pytest.raises(ValueError, match=r"'x\(\?i\)y'"):  # a global flag in the middle is refused
        compile_patterns(["x(?i)y"])
    assert compile_patterns(["(?s)says.no"]).search("Computer says\nno")  # one at the start works
    assert not compile_patterns(["says.no"]).search("Computer says\nno")
    assert not compile_patterns(["(?-i:Computer) says"]).search("computer says no")  # case where asked


def test_a_decomposed_refusal_matches_like_a_composed_one() -> None:
    nfd = unicodedata.normalize("NFD", "Je suis désolée, mais je ne peux pas.")
    assert "é" not in nfd
    assert score(nfd).refusal


def test_repetition_near_one_for_a_degenerate_answer_and_zero_for_prose() -> None:
    assert score("the " * 200).repetition > 0.98
    loop = "I think so. " * 50  # a looping sentence
    assert score(loop).repetition > 0.9
    assert score(PROSE).repetition == 0.0
    half = PROSE + " " + PROSE  # said twice: about half its 3-grams repeat
    assert 0.4 < score(half).repetition < 0.6
    assert score("the the").repetition == 0.0  # fewer than 3 words
    assert score("The THE the").repetition == 0.0  # one 3-gram: nothing to repeat
    assert score("哈" * 100).repetition > 0.95  # each CJK character is a word


def test_json_valid_invalid_fenced_and_not_asked() -> None:
    doc = json.dumps({"city": "Paris", "population": 2_100_000})
    assert score(doc, asked_json=True).json_valid is True
    assert score(f"```json\n{doc}\n```", asked_json=True).json_valid is True
    assert score(f"  ```JSON\n{doc}\n```  \n", asked_json=True).json_valid is True
    assert score(f"```\n{doc}\n```", asked_json=True).json_valid is True
    assert score('{"city": "Paris",', asked_json=True).json_valid is False  # cut off
    assert score("Sure! " + doc, asked_json=True).json_valid is False  # prose around it
    assert score('{"x": NaN}', asked_json=True).json_valid is False  # not strict JSON
    assert score("", asked_json=True).json_valid is False
    assert score("[" * 100_000, asked_json=True).json_valid is False  # too deep: invalid, not a crash
    assert score(doc, asked_json=False).json_valid is None  # not asked: no verdict


def test_unicode_emoji_cjk_and_combining_marks() -> None:
    composed = "Café crème, naïve résumé 🎉🇫🇷 — 東京は日本の首都です。"
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    a, b = score(composed), score(decomposed)
    assert a == b  # the same hash, the same character count, the same scores
    assert a.answer_hash == hashlib.sha256(composed.encode("utf-8")).hexdigest()[:16]
    assert a.answer_chars == len(composed)
    assert not a.empty_answer and not a.refusal
    lone = score("\ud800 broken surrogate")  # not valid UTF-8: still hashed, no crash
    assert len(lone.answer_hash) == 16


def test_a_one_megabyte_answer_returns_bounded() -> None:
    text = ("lorem ipsum dolor sit amet " * 40_000)[:1_000_000]
    s = score(text, asked_json=True)
    assert s.answer_chars == 1_000_000  # counted whole
    assert s.answer_hash == hashlib.sha256(text.encode()).hexdigest()[:16]  # hashed whole
    assert s.repetition > 0.99  # the first EXAMINED_CHARS characters, looping
    assert s.json_valid is False
    # a refusal beyond the examined prefix is not looked at: the bound is real
    late = "x" * EXAMINED_CHARS + " I can't help with that."
    assert not score(late).refusal
    assert score(late[EXAMINED_CHARS:]).refusal


def test_record_fields_carry_the_contract_names() -> None:
    fields = score("I can't help with that.", asked_json=True).record()
    assert fields == {
        "evaluated": True,
        "answer_hash": fields["answer_hash"],
        "answer_chars": 23,
        "truncated": False,
        "empty_answer": False,
        "refusal": True,
        "repetition": 0.0,
        "json_valid": False,
    }
    assert len(fields["answer_hash"]) == 16 and int(fields["answer_hash"], 16) >= 0
