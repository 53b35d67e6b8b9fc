"""The gateway's sampled answers, on simulated engines in real time: a sampled request's record
carries the scores of the very answer the client got (its hash and length), truncated when
max_tokens stopped it, JSON judged only where it was asked; no answer text unless keep_text, and
then redacted and capped; an unsampled request, or one that failed, carries no quality field; the
sampling follows the request id; a bad pattern in the fleet spec is one clear line."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from collector.requestlog import parse_request_log
from common.yamlfile import YamlConfigError
from fleet.gateway.config import GatewaySpec, QualitySpec
from fleet.gateway.quality import Quality
from fleet.gateway.routing import ReplicaState
from fleet.gateway.server import Gateway
from fleet.sim.engine import EngineConfig
from fleet.sim.server import SimFleet, SimReplica
from fleet.spec import load_spec

QUALITY_FIELDS = {
    "evaluated",
    "answer_hash",
    "answer_chars",
    "truncated",
    "empty_answer",
    "refusal",
    "repetition",
    "json_valid",
}
Body = Callable[[httpx.AsyncClient, str], Awaitable[Any]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(quality: QualitySpec, body: Body, sim_port: int = 0, **settings: Any) -> tuple[Any, list[dict[str, Any]]]:
    """One simulated replica (a token every 5 ms, on ``sim_port`` if given), a request-log intake
    and a gateway with ``quality`` (and other gateway ``settings``): ``body(client, gateway url)``; its
    result and the records the gateway shipped."""

    async def main() -> tuple[Any, list[dict[str, Any]]]:
        received: list[dict[str, Any]] = []

        async def intake(request: web.Request) -> web.Response:
            lines = [json.loads(line) for line in (await request.text()).splitlines() if line]
            received.extend(lines)
            return web.json_response({"accepted": len(lines), "kept": len(lines), "rejected": []})

        app = web.Application()
        app.router.add_post("/v1/requests", intake)
        runner = web.AppRunner(app)
        await runner.setup()
        log_port = free_port()
        await web.TCPSite(runner, "127.0.0.1", log_port).start()
        sim = SimReplica(
            "small-0", "tiny-small", sim_port or free_port(), EngineConfig(max_model_len=2048, step_overhead_s=0.005)
        )
        fleet = SimFleet([sim])
        await fleet.start()
        spec = GatewaySpec(
            port=free_port(),
            request_log_url=f"http://127.0.0.1:{log_port}/v1/requests",
            request_log_flush_s=0.1,
            quality=quality,
            **settings,
        )
        gateway = Gateway(spec, [ReplicaState("small-0", "tiny-small", f"http://127.0.0.1:{sim.port}")])
        await gateway.start("127.0.0.1", spec.port)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                result = await body(client, f"http://127.0.0.1:{spec.port}")
        finally:
            await gateway.stop()
            await fleet.stop()
            await runner.cleanup()
        return result, received

    random.seed(43)  # the simulator's text
    return asyncio.run(main())


async def streamed_chat(client: httpx.AsyncClient, gw: str, max_tokens: int, **extra: Any) -> str:
    """A streamed chat answer's text, as the client reads it."""
    body = {"model": "tiny-small", "messages": [{"role": "user", "content": "hi " * 30}], "max_tokens": max_tokens}
    text = ""
    async with client.stream("POST", f"{gw}/v1/chat/completions", json={**body, "stream": True, **extra}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice.get("delta", {}).get("content") or ""
    return text


async def completion(client: httpx.AsyncClient, gw: str, max_tokens: int, **extra: Any) -> str:
    """A non-streamed completion's text."""
    body = {"model": "tiny-small", "prompt": "hello " * 20, "max_tokens": max_tokens, **extra}
    answer = await client.post(f"{gw}/v1/completions", json=body)
    assert answer.status_code == 200
    return str(answer.json()["choices"][0]["text"])


def sha16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def by_trace(records: list[dict[str, Any]], status: int = 200) -> list[dict[str, Any]]:
    return sorted((r for r in records if r["status_code"] == status), key=lambda r: r["ts"])


def test_sampled_answers_streamed_and_not_are_scored_with_no_text_by_default() -> None:
    async def body(client: httpx.AsyncClient, gw: str) -> dict[str, Any]:
        texts = {
            "stream": await streamed_chat(client, gw, 6),
            "plain": await completion(client, gw, 40, response_format={"type": "json_object"}),
        }
        missing = await client.post(f"{gw}/v1/completions", json={"model": "nope", "prompt": "x"})
        texts["missing"] = str(missing.status_code)
        return texts

    texts, records = run(QualitySpec(sample_rate=1.0), body)
    assert texts["missing"] == "503"
    stream, plain = by_trace(records)
    assert stream["stream"] and not plain["stream"]
    for record, text, max_tokens in ((stream, texts["stream"], 6), (plain, texts["plain"], 40)):
        assert set(record) >= QUALITY_FIELDS
        assert record["evaluated"] is True
        # the scores are of the very answer the client got
        assert record["answer_chars"] == len(text) > 0
        assert record["answer_hash"] == sha16(text) and re.fullmatch(r"[0-9a-f]{16}", record["answer_hash"])
        assert record["completion_tokens"] == max_tokens and record["truncated"] is True  # stopped at max_tokens
        assert record["empty_answer"] is False and record["refusal"] is False
        assert 0.0 <= record["repetition"] <= 1.0
        assert "answer_text" not in record  # no text kept by default
    assert stream["json_valid"] is None  # JSON not asked
    assert plain["json_valid"] is False  # asked, and the simulator's text is not JSON
    (failed,) = by_trace(records, 503)
    assert not QUALITY_FIELDS & set(failed)  # nothing answered, nothing scored
    rows, errors = parse_request_log("\n".join(json.dumps(r) for r in records))  # as the collector reads them
    assert errors == [] and [(r["evaluated"], r["json_valid"], r["answer_text"]) for r in rows] == [
        (1, -1, ""),  # the columns: evaluated, JSON not asked, no text
        (1, 0, ""),  # JSON asked and invalid
        (0, -1, ""),  # the failed request: not evaluated
    ]


def test_keep_text_keeps_the_answer_redacted_and_capped() -> None:
    async def body(client: httpx.AsyncClient, gw: str) -> list[str]:
        return [await completion(client, gw, 60), await streamed_chat(client, gw, 60)]

    secret = r"[aeiou]\b"  # a word's last vowel (the simulator's words are syllables)
    quality = QualitySpec(sample_rate=1.0, keep_text=True, redact=[secret], max_chars=50)
    texts, records = run(quality, body)
    for record, text in zip(by_trace(records), texts, strict=True):
        kept = record["answer_text"]
        assert len(text) > 50 and re.search(secret, text[:50])  # the answer had something to hide
        assert kept == re.sub(secret, "[redacted]", text[:50])  # redacted, and capped at max_chars
        assert record["answer_chars"] == len(text)  # still counted whole
        assert record["answer_hash"] == sha16(text[:50])  # the hash of the text scored
    # the collector takes the records as they are (the contract's names and types)
    rows, errors = parse_request_log("\n".join(json.dumps(r) for r in records))
    assert errors == [] and all(r["evaluated"] and r["answer_text"].count("[redacted]") for r in rows)


def test_at_sample_rate_zero_no_record_carries_quality_fields() -> None:
    async def body(client: httpx.AsyncClient, gw: str) -> None:
        await streamed_chat(client, gw, 6)
        await completion(client, gw, 6)

    _, records = run(QualitySpec(sample_rate=0.0), body)
    assert len(records) == 2
    assert all(not QUALITY_FIELDS & set(r) and "answer_text" not in r for r in records)


def test_sampling_follows_the_request_id_so_a_retry_is_sampled_alike() -> None:
    quality = Quality(QualitySpec(sample_rate=0.05))
    keys = [f"req-{i}" for i in range(20_000)]
    share = sum(quality.sampled(k) for k in keys) / len(keys)
    assert 0.04 < share < 0.06
    assert [quality.sampled(k) for k in keys[:500]] == [quality.sampled(k) for k in keys[:500]]

    half = QualitySpec(sample_rate=0.5)
    ids = [f"retry-{i}" for i in range(8)]

    async def body(client: httpx.AsyncClient, gw: str) -> None:
        for request_id in ids * 2:  # each request sent twice: the retry
            await client.post(
                f"{gw}/v1/completions",
                json={"model": "tiny-small", "prompt": "x", "max_tokens": 4},
                headers={"x-request-id": request_id},
            )

    _, records = run(half, body)
    expected = [Quality(half).sampled(i) for i in ids * 2]
    assert [("evaluated" in r) for r in by_trace(records)] == expected
    assert 0 < sum(expected) < len(expected)  # some sampled, some not: the decision is per id


def test_a_bad_pattern_in_the_fleet_spec_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    good = (
        "models:\n  tiny-small: {path: models/small, generate: small}\n"
        "replicas:\n  - {name: small-0, model: tiny-small, port: 18101}\n"
        "gateway:\n  quality:\n    sample_rate: 0.1\n"
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(good + "    refusal_patterns: ['I can.t help', '(unclosed']\n")
    with pytest.raises(YamlConfigError) as info:
        load_spec(path, base_dir=tmp_path)
    message = str(info.value)
    assert "fleet.yaml:" in message and "gateway.quality.refusal_patterns" in message
    assert "'(unclosed' is not a regular expression" in message and "\n" not in message
    path.write_text(good + "    redact: ['[a-z']\n")
    with pytest.raises(YamlConfigError, match=r"gateway.quality.redact: redact pattern '\[a-z' is not a regular"):
        load_spec(path, base_dir=tmp_path)
    path.write_text(good.replace("0.1", "1.5"))
    with pytest.raises(YamlConfigError, match="gateway.quality.sample_rate"):
        load_spec(path, base_dir=tmp_path)
    path.write_text(good)
    spec = load_spec(path, base_dir=tmp_path)
    assert spec.gateway is not None and spec.gateway.quality.sample_rate == 0.1
    assert spec.gateway.quality.keep_text is False  # privacy default


def test_an_answer_cut_by_a_timeout_is_not_scored() -> None:
    port = free_port()

    async def body(client: httpx.AsyncClient, gw: str) -> list[str]:
        chat = {"model": "tiny-small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
        lines = []
        async with client.stream("POST", f"{gw}/v1/chat/completions", json={**chat, "stream": True}) as r:
            async for line in r.aiter_lines():
                lines.append(line)
                if len(lines) == 1:  # the engine stops producing in the middle of the answer
                    await client.post(f"http://127.0.0.1:{port}/sim/stall", json={"stalled": True})
        return lines

    lines, records = run(QualitySpec(sample_rate=1.0), body, sim_port=port, upstream_first_byte_timeout_s=0.5)
    assert any("timeout" in line for line in lines)
    (record,) = records
    assert record["outcome"] == "timeout"
    assert not QUALITY_FIELDS & set(record)  # a partial answer is not scored as if it were whole
