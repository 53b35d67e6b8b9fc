"""Properties of the simulated scheduler, on random workloads (hypothesis, derandomized: the same
cases on every run): random arrivals, lengths up to ``max_model_len``, caches from the smallest
vLLM accepts to roomy ones, shared prefixes, preemption.

- every admitted request finishes, with all its tokens, within a bound of steps (the work it
  asks for: no path leaves a running request without progress);
- blocks are conserved after every step: free + cached (free, reusable) + held = usable;
- the counters a scrape reads never go down;
- a config whose max_model_len does not fit its cache is refused, with the numbers.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.sim.engine import NULL_BLOCKS, EngineConfig, EngineConfigError, SimEngine, SimRequest

CASES = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[EngineConfig, list[tuple[float, list[int], int]]]:
    block_size = draw(st.sampled_from([4, 16]))
    max_model_len = draw(st.sampled_from([32, 64, 200, 512]))
    smallest = math.ceil(max_model_len / block_size) + NULL_BLOCKS
    num_blocks = draw(st.integers(smallest, smallest * 4))
    config = EngineConfig(
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.sampled_from([8, 64, 2048])),
    )
    prefixes = [[1000 + p * 100 + i for i in range(draw(st.integers(0, max_model_len // 2)))] for p in range(3)]
    requests = []
    t = 0.0
    for _ in range(draw(st.integers(1, 25))):
        t += draw(st.floats(0.0, 0.05))
        shared = prefixes[draw(st.integers(0, 2))] if draw(st.booleans()) else []
        prompt_len = draw(st.integers(1, max_model_len - 1))
        prompt = (shared + [draw(st.integers(1, 50))] * prompt_len)[:prompt_len]
        max_tokens = draw(st.integers(1, max_model_len - prompt_len))
        requests.append((t, prompt, max_tokens))
    return config, requests


COUNTERS = (
    "prompt_tokens",
    "cached_prompt_tokens",
    "generation_tokens",
    "preemptions",
    "prefix_queries",
    "prefix_hits",
)


def counters(engine: SimEngine) -> tuple[int, ...]:
    s = engine.stats
    return (*(getattr(s, name) for name in COUNTERS), *s.finished.values())


def held(engine: SimEngine) -> int:
    """Blocks in use: each running request's private blocks, and each shared prefix block once."""
    return sum(r.blocks - len(r.held_hashes) for r in engine.running) + len(engine.in_use)


@CASES
@given(workloads())
def test_every_admitted_request_finishes_blocks_are_conserved_and_counters_only_grow(case) -> None:
    config, plan = case
    engine = SimEngine(config)
    usable = config.num_blocks - NULL_BLOCKS
    pending = [SimRequest(str(i), prompt, max_tokens, at) for i, (at, prompt, max_tokens) in enumerate(plan)]
    submitted: list[SimRequest] = []
    # a request's own work: its prompt and each output token, a step each at worst; preemptions
    # redo the context, counted as the steps they cost
    bound = sum(len(p) + m + 2 for _at, p, m in plan)
    now, steps, last = 0.0, 0, counters(engine)
    while pending or engine.has_work():
        while pending and pending[0].arrival <= now:
            request = pending.pop(0)
            engine.submit(request)
            submitted.append(request)
        if not engine.has_work():
            now = pending[0].arrival
            continue
        duration, _produced, _finished = engine.step(now)
        now += duration
        steps += 1
        assert engine.free_blocks >= 0 and engine.free_blocks + len(engine.cached) + held(engine) == usable
        assert all(r.blocks * config.block_size >= r.computed for r in engine.running)
        now_counters = counters(engine)
        assert all(b >= a for a, b in zip(last, now_counters, strict=True)), (last, now_counters)
        last = now_counters
        redo = sum(r.preemptions * (r.prompt_len + r.max_tokens) for r in submitted)
        assert steps <= bound + redo, f"{steps} steps for {bound + redo} steps of work: a request is stuck"
    assert all(r.finished_at is not None and r.finish_reason == "length" for r in submitted)
    assert all(r.generated == r.max_tokens for r in submitted)
    assert engine.stats.finished["length"] == len(plan) and engine.stats.finished["abort"] == 0
    assert engine.free_blocks + len(engine.cached) == usable and not engine.in_use


def test_a_cache_too_small_for_max_model_len_is_refused_with_the_numbers() -> None:
    with pytest.raises(EngineConfigError) as error:
        SimEngine(EngineConfig(num_blocks=40, block_size=16, max_model_len=2048))
    message = str(error.value)
    assert "max seq len (2048)" in message and "128 blocks of 16 tokens" in message
    assert "39 blocks, 624 tokens" in message and "at least 129" in message
    SimEngine(EngineConfig(num_blocks=129, block_size=16, max_model_len=2048))  # one request of 2048 fits


def test_requests_at_the_edges_of_max_model_len_get_vllms_answers() -> None:
    engine = SimEngine(EngineConfig(num_blocks=17, block_size=128, max_model_len=2048))
    too_long = SimRequest("a", [7] * 2100, 4, 0.0)
    with pytest.raises(ValueError, match=r"maximum context length is 2048 tokens\. However, your prompt contains 2100"):
        engine.submit(too_long)
    with pytest.raises(ValueError, match=r"max_tokens=3000 cannot be greater than max_model_len=2048"):
        engine.submit(SimRequest("b", [7] * 10, 3000, 0.0))
    with pytest.raises(ValueError, match=r"max_tokens must be at least 1, got 0"):
        engine.submit(SimRequest("c", [7] * 2048, 4, 0.0))
    clipped = SimRequest("d", [7] * 1000, 1100, 0.0)  # vLLM shortens the output to the context left
    engine.submit(clipped)
    now = 0.0
    while engine.has_work():
        now += engine.step(now)[0]
    assert clipped.generated == 1048 and clipped.finish_reason == "length"


def test_a_stalled_engine_keeps_its_requests_running_and_generates_nothing_until_resumed() -> None:
    engine = SimEngine(EngineConfig(num_blocks=64, block_size=16, max_model_len=512))
    engine.submit(SimRequest("a", [5] * 100, 50, 0.0))
    now = engine.step(0.0)[0]
    engine.stalled = True
    before = engine.stats.generation_tokens
    for _ in range(100):
        duration, produced, finished = engine.step(now)
        now += duration
        assert not produced and not finished
    assert engine.stats.generation_tokens == before and len(engine.running) == 1 and engine.kv_usage > 0
    engine.stalled = False
    while engine.has_work():
        now += engine.step(now)[0]
    assert engine.stats.finished["length"] == 1
