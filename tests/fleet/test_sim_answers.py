"""Controllable answers in the bundled fleet: a client's max_tokens below the answer's own length
cuts it (finish reason length), an answer that fits ends on its own (stop), a refusing adapter
answers with the refusal; the virtual fleet scores the answers the gateway would sample."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import httpx

from fleet.quality.evaluators import compile_patterns, evaluate
from fleet.sim.answers import REFUSAL_PIECES, REFUSAL_TEXT, answer_key, answer_text, fidelity, piece
from fleet.sim.engine import EngineConfig, SimEngine, SimRequest
from fleet.sim.replay import play
from fleet.sim.server import SimFleet, SimReplica
from fleet.spec import load_spec
from fleet.traffic import ANSWER_TOKENS_ARG, load_scenario, plan_request
from tests.promtools import free_ports

ROOT = Path(__file__).resolve().parents[2]


def finish(answer_tokens: int, max_tokens: int) -> tuple[str, int]:
    engine = SimEngine(EngineConfig(num_blocks=200, max_model_len=2048))
    engine.submit(SimRequest("r", list(range(3, 40)), max_tokens, 0.0, answer_tokens=answer_tokens))
    now, done = 0.0, []
    while engine.has_work():
        duration, _produced, finished = engine.step(now)
        now += duration
        done += finished
    (request,) = done
    return request.finish_reason, request.generated


def test_an_answer_ends_on_its_own_unless_max_tokens_cuts_it() -> None:
    assert finish(answer_tokens=30, max_tokens=64) == ("stop", 30)
    assert finish(answer_tokens=30, max_tokens=30) == ("stop", 30)  # EOS is checked before the length
    assert finish(answer_tokens=80, max_tokens=64) == ("length", 64)
    assert finish(answer_tokens=0, max_tokens=64) == ("length", 64)  # no length given: as ignore_eos


def test_a_client_max_tokens_caps_what_is_asked_and_keeps_the_answer_length() -> None:
    scenario = load_scenario("max-tokens-release")
    rng = random.Random(3)
    before = [plan_request(scenario.mix_at(0)[1], rng) for _ in range(400)]
    after = [plan_request(scenario.mix_at(700)[1], rng) for _ in range(400)]
    assert not any(p.truncated for p in before) and all(p.max_tokens == p.answer_tokens for p in before)
    globex = [p for p in after if p.tenant == "globex"]
    assert all(p.max_tokens == min(40, p.answer_tokens) for p in globex)
    assert 0.6 < sum(p.truncated for p in globex) / len(globex) < 0.95  # median answer 64 > 40
    assert not any(p.truncated for p in after if p.tenant != "globex")


def test_piece_by_piece_is_the_whole_answer_and_reads_as_words() -> None:
    key = answer_key(list(range(3, 300)))
    whole = answer_text(key, 50, agree=0.7)
    assert "".join(piece(key, i, 5, agree=0.7) for i in range(0, 50, 5)) == whole
    assert len(whole.split()) == 50 and answer_text(answer_key([5, 6]), 50) != whole
    scores = evaluate(whole, finish_reason="stop", max_tokens=64, completion_tokens=50, asked_json=False)
    assert not scores.refusal and not scores.empty_answer and scores.repetition < 0.05
    refusal = answer_text(key, len(REFUSAL_PIECES), refuse=True)
    assert refusal == REFUSAL_TEXT
    assert evaluate(refusal, finish_reason="stop", max_tokens=64, completion_tokens=9, asked_json=False).refusal


def test_the_simulated_server_ends_answers_by_rule_and_refuses_for_a_refusing_adapter() -> None:
    async def go() -> list[dict]:
        (port,) = free_ports(1)
        replica = SimReplica(
            "sim-0",
            "tiny-small",
            port,
            EngineConfig(num_blocks=200, max_model_len=2048, max_loras=1),
            adapters=("guard-bot",),
            refusing=("guard-bot",),
        )
        fleet = SimFleet([replica])
        await fleet.start()
        url = f"http://127.0.0.1:{port}/v1/completions"
        bodies = [
            {"model": "tiny-small", "max_tokens": 64, "vllm_xargs": {ANSWER_TOKENS_ARG: 20}},
            {"model": "tiny-small", "max_tokens": 16, "vllm_xargs": {ANSWER_TOKENS_ARG: 20}},
            {"model": "tiny-small", "max_tokens": 16},
            {"model": "guard-bot", "max_tokens": 64, "vllm_xargs": {ANSWER_TOKENS_ARG: 50}},
        ]
        out = []
        async with httpx.AsyncClient(timeout=30) as client:
            for body in bodies:
                r = await client.post(url, json={"prompt": list(range(3, 60)), **body})
                assert r.status_code == 200, r.text
                out.append(r.json())
        await fleet.stop()
        return out

    answers = asyncio.run(go())
    got = [(a["choices"][0]["finish_reason"], a["usage"]["completion_tokens"]) for a in answers]
    assert got == [("stop", 20), ("length", 16), ("length", 16), ("stop", len(REFUSAL_PIECES))]
    assert answers[3]["choices"][0]["text"] == REFUSAL_TEXT
    assert len(answers[0]["choices"][0]["text"].split()) == 20


def test_the_virtual_fleet_scores_the_sampled_answers_and_truncations_follow_the_release() -> None:
    spec = load_spec(ROOT / "fleet.yaml")
    scenario = load_scenario("max-tokens-release")
    start = 1_700_000_000.0
    records = [r for tick in play(spec, scenario, start, seed=1) for r in tick.records]
    evaluated = [r for r in records if r.get("evaluated")]
    share = len(evaluated) / len(records)
    rate = spec.gateway.quality.sample_rate
    assert abs(share - rate) < 0.05, (share, rate)  # the gateway's sample, not every answer
    assert not any("answer_text" in r for r in records)  # scores and a hash, never the text
    counts = Counter(
        (r["tenant"] == "globex", r["ts"] >= start + 600, r["truncated"]) for r in evaluated if r["outcome"] == "ok"
    )

    def truncation(globex: bool, after: bool) -> float:
        return counts[(globex, after, True)] / max(1, counts[(globex, after, True)] + counts[(globex, after, False)])

    assert truncation(True, False) == 0 and truncation(False, False) == 0 and truncation(False, True) == 0
    assert truncation(True, True) > 0.6  # most of globex's answers are longer than its new max_tokens
    patterns = compile_patterns(spec.gateway.quality.refusal_patterns)
    assert not patterns.search(answer_text(answer_key([7]), 2000))  # the words never read as a refusal


def test_a_small_model_agrees_with_the_large_one_less_on_long_prompts() -> None:
    def overlap(prompt_tokens: int) -> float:
        shared = total = 0
        for seed in range(40):
            prompt = [random.Random(seed).randint(3, 999) for _ in range(prompt_tokens)]
            key = answer_key(prompt)
            large = answer_text(key, 60, agree=fidelity("tiny-large", prompt_tokens)).split()
            small = answer_text(key, 60, agree=fidelity("tiny-small", prompt_tokens)).split()
            shared += sum(a == b for a, b in zip(large, small, strict=True))
            total += 60
        return shared / total

    assert fidelity("tiny-large", 100) == 1.0
    assert abs(overlap(100) - fidelity("tiny-small", 100)) < 0.05
    assert abs(overlap(2000) - fidelity("tiny-small", 2000)) < 0.05 and overlap(2000) < overlap(100) - 0.3
