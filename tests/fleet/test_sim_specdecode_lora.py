"""The simulated engine's speculative decoding and LoRA adapter slots, and the families its
``/metrics`` adds for them (vLLM 0.32's names, labels and types)."""

from __future__ import annotations

from collector.exposition import Sample, parse
from fleet.sim.engine import EngineConfig, SimEngine, SimRequest
from fleet.sim.metrics import Exposition


def _run(engine: SimEngine, requests: list[SimRequest]) -> float:
    for request in requests:
        engine.submit(request)
    now = 0.0
    while engine.has_work():
        duration, _produced, _done = engine.step(now)
        now += duration
    return now


def _request(i: int, acceptance: float = 0.0, lora: str = "", tokens: int = 40) -> SimRequest:
    return SimRequest(f"r{i}", list(range(10 + i, 110 + i)), tokens, 0.0, acceptance=acceptance, lora=lora)


def _families(text: str) -> dict[str, list[Sample]]:
    """Samples by name, ``_total`` dropped (the collector's parser reads the text)."""
    out: dict[str, list[Sample]] = {}
    for sample in parse(text).samples:
        out.setdefault(sample.name.removesuffix("_total"), []).append(sample)
    return out


def test_accepted_drafts_bring_several_tokens_a_step_and_are_counted_as_vllm_counts_them() -> None:
    sure, never = SimEngine(EngineConfig(spec_tokens=3)), SimEngine(EngineConfig(spec_tokens=3))
    t_sure = _run(sure, [_request(0, acceptance=1.0)])
    t_never = _run(never, [_request(0, acceptance=0.0)])
    s = sure.stats
    # every draft accepted: 4 tokens a step after the prefill's first; 39 tokens in 10 drafts
    assert s.generation_tokens == 40
    assert s.spec_drafts == 10 and s.spec_draft_tokens == 30 and s.spec_accepted == 29
    assert s.spec_accepted_per_pos[0] == 10 and s.spec_accepted_per_pos[0] >= s.spec_accepted_per_pos[2]
    n = never.stats
    assert n.generation_tokens == 40 and n.spec_drafts == 39 and n.spec_accepted == 0
    assert t_sure < t_never / 2  # a step per 4 tokens instead of a step per token


def test_a_request_for_an_adapter_waits_while_every_slot_runs_another() -> None:
    engine = SimEngine(EngineConfig(max_loras=1))
    first, second, base = _request(0, lora="a"), _request(1, lora="b"), _request(2)
    _run(engine, [first, second, base])
    assert first.first_token_at is not None and second.first_token_at is not None
    assert second.first_scheduled is not None and second.first_scheduled >= first.finished_at  # waited for the slot
    assert base.first_scheduled is not None and base.first_scheduled < first.finished_at  # the base model did not
    states = engine.stats.lora_states
    assert ("a", "b") in states  # a ran while b waited
    assert ("b", "") in states


def test_the_exposition_adds_vllms_spec_decode_and_lora_families() -> None:
    engine = SimEngine(EngineConfig(spec_tokens=2, max_loras=2))
    exposition = Exposition(engine, "tiny")
    _run(engine, [_request(0, acceptance=0.5, lora="a"), _request(1, acceptance=0.5)])
    families = _families(exposition.render())
    drafts = families["vllm:spec_decode_num_drafts"]
    assert drafts[0].value == engine.stats.spec_drafts > 0
    positions = {s.labels["position"]: s.value for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"]}
    assert set(positions) == {"0", "1"}
    assert sum(positions.values()) == families["vllm:spec_decode_num_accepted_tokens"][0].value
    lora = families["vllm:lora_requests_info"]
    assert {s.labels["running_lora_adapters"] for s in lora} >= {"a"}
    assert all(s.labels["max_lora"] == "2" and s.value > 0 for s in lora)
    plain = _families(Exposition(SimEngine(EngineConfig()), "tiny").render())
    assert "vllm:lora_requests_info" not in plain and "vllm:spec_decode_num_drafts" not in plain


def test_a_request_held_back_for_an_adapter_slot_is_waiting_for_reason_deferred() -> None:
    engine = SimEngine(EngineConfig(max_loras=1))
    exposition = Exposition(engine, "tiny")
    for request in (_request(0, lora="a"), _request(1, lora="b"), _request(2, lora="b")):
        engine.submit(request)
    engine.step(0.0)  # a runs; both requests for b are skipped
    reasons = {
        s.labels["reason"]: s.value for s in _families(exposition.render())["vllm:num_requests_waiting_by_reason"]
    }
    assert reasons == {"capacity": 0.0, "deferred": 2.0}  # vLLM: "deferred by transient constraints (LoRA budget)"
