"""The quality fields of the gateway request log (issue 43) through the collector's real receiver
into chDB: scored lines land with their values, bad values are refused with the line and the
reason, lines and other sources without them are rows not evaluated, and by default the store
holds no answer text (``stored_answer_texts``: the check a gateway end-to-end test reuses)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from collector import otlp_native
from collector.request_columns import AUDIT_DEFAULTS, QUALITY_DEFAULTS
from collector.requestlog import MAX_ANSWER_TEXT, parse_request_log
from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner
from tests.collector.test_otlp import export, llm_span
from tests.collector.test_otlp_native import otlp_json

LITELLM = Path(__file__).parent / "data" / "genai" / "litellm_payloads.ndjson"
JSON = {"Content-Type": "application/json"}
PROTOBUF = {"Content-Type": "application/x-protobuf"}
QUALITY = tuple(QUALITY_DEFAULTS)
NOT_EVALUATED = tuple(QUALITY_DEFAULTS.values())


def line(n: int, **quality: Any) -> str:
    """A gateway request-log line (trace id ``n`` as 32 hex digits) with the given quality fields."""
    record = {"ts": 1_795_000_000.0 + n, "trace_id": f"{n:032x}", "model": "tiny-small", "tenant": "acme"}
    return json.dumps({**record, **quality})


def stored_answer_texts(client: Any) -> int:
    """How many ``requests`` rows hold answer text (0: the store keeps no answer, the default)."""
    return int(client.command("SELECT count() FROM requests WHERE answer_text != ''"))


def post(ch: Any, tmp_path: Path, bodies: list[tuple[str, bytes, dict[str, str], bool]]) -> list[dict[str, Any]]:
    """Each (path, body, headers, store decodes OTLP) to one collector's receiver, then its writer
    flushed into chDB; the JSON answers (``{}`` for an OTLP protobuf answer)."""
    clickhouse_runner.apply(ch)
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool", flush_interval_s=0.1), registry=CollectorRegistry())
    collector = Collector(CollectorConfig(grpc_port=0), writer)

    async def go() -> list[dict[str, Any]]:
        out = []
        async with TestClient(TestServer(collector.app())) as client:
            for path, body, headers, native in bodies:
                assert not native or otlp_native.supported(ch)
                collector.native_otlp = native
                collector._otlp_settings = otlp_native.settings_for(ch)
                r = await client.post(path, data=body, headers=headers)
                assert r.status == 200, await r.text()
                out.append(await r.json() if r.content_type == "application/json" else {})
        return out

    answers = asyncio.run(go())
    writer.start()
    assert writer.close()
    return answers


def quality_of(ch: Any, where: str = "1") -> dict[str, tuple[Any, ...]]:
    rows = ch.query(f"SELECT trace_id, {', '.join(QUALITY)} FROM requests WHERE {where}").result_rows
    return {str(r[0]): tuple(r[1:]) for r in rows}


def test_scored_lines_land_with_their_values_and_plain_lines_are_not_evaluated(ch, tmp_path: Path) -> None:
    body = "\n".join(
        [
            line(
                1,
                evaluated=True,
                answer_hash="0123456789ABCDEF",  # stored in lower case, as trace ids are
                answer_chars=812,
                truncated=True,
                repetition=0.25,
                json_valid=False,
            ),
            line(2, evaluated=True, answer_hash="fedcba9876543210", empty_answer=True, refusal=True, json_valid=True),
            line(3, evaluated=True, answer_hash="00000000000000ff", answer_chars=5, json_valid=None),
            line(4),  # a line from before issue 43, or a request not sampled for evaluation
        ]
    )
    [answer] = post(ch, tmp_path, [("/v1/requests", body.encode(), JSON, False)])
    assert answer["kept"] == 4 and answer["rejected"] == []
    got = quality_of(ch)
    assert got[f"{1:032x}"] == (1, "0123456789abcdef", 812, 1, 0, 0, pytest.approx(0.25), 0, "")
    assert got[f"{2:032x}"] == (1, "fedcba9876543210", 0, 0, 1, 1, 0.0, 1, "")
    assert got[f"{3:032x}"] == (1, "00000000000000ff", 5, 0, 0, 0, 0.0, -1, "")  # JSON not asked
    assert got[f"{4:032x}"] == NOT_EVALUATED == (0, "", 0, 0, 0, 0, 0.0, -1, "")


BAD = [
    ({"evaluated": "true"}, "evaluated: Input should be a valid boolean"),
    ({"truncated": 1}, "truncated: Input should be a valid boolean"),
    ({"refusal": None}, "refusal: Input should be a valid boolean"),
    ({"json_valid": "yes"}, "json_valid: Input should be a valid boolean"),
    ({"repetition": 1.5}, "repetition: Input should be less than or equal to 1"),
    ({"repetition": -0.1}, "repetition: Input should be greater than or equal to 0"),
    ({"repetition": "0.3"}, "repetition: Input should be a valid number"),
    ({"answer_chars": -1}, "answer_chars: Input should be greater than or equal to 0"),
    ({"answer_chars": 2**32}, "answer_chars: Input should be less than or equal to 4294967295"),
    ({"answer_chars": 3.5}, "answer_chars: Input should be a valid integer"),
    ({"answer_hash": "not-hex-at-all!!"}, "answer_hash: String should match pattern"),
    ({"answer_hash": "0123456789abcde"}, "answer_hash: String should match pattern"),  # 15 digits
    ({"answer_text": 42}, "answer_text: Input should be a valid string"),
    # the router audit's fields (migration 0015)
    ({"audit_of": "abc"}, "audit_of: String should match pattern"),
    ({"audit_direction": "sideways"}, "audit_direction: Input should be"),
    ({"agreement": 1.2}, "agreement: Input should be less than or equal to 1"),
    ({"judge_routed": "0.5"}, "judge_routed: Input should be a valid number"),
    ({"judge_shadow": -0.25}, "judge_shadow: Input should be greater than or equal to 0"),
]


@pytest.mark.parametrize(("fields", "reason"), BAD, ids=[next(iter(f)) + repr(next(iter(f.values()))) for f, _ in BAD])
def test_a_bad_quality_value_refuses_its_line_with_the_reason(fields: dict[str, Any], reason: str) -> None:
    rows, errors = parse_request_log("\n".join([line(1, evaluated=True), line(2, **fields), line(3)]))
    assert [r["trace_id"] for r in rows] == [f"{1:032x}", f"{3:032x}"]  # the good lines are kept
    assert len(errors) == 1
    number, why = errors[0]
    assert number == 2 and why.startswith(reason), why


def test_a_shadow_line_lands_with_its_audit_fields_and_others_get_the_defaults(ch, tmp_path: Path) -> None:
    shadow = line(2, route="shadow", audit_of=f"{1:032X}", audit_direction="small_to_large", agreement=0.75)
    judged = line(3, audit_of=f"{1:032x}", audit_direction="large_to_small", judge_routed=0.5, judge_shadow=1.0)
    body = "\n".join([line(1, evaluated=True), shadow, judged])
    [answer] = post(ch, tmp_path, [("/v1/requests", body.encode(), JSON, False)])
    assert answer["kept"] == 3 and answer["rejected"] == []
    columns = ", ".join(AUDIT_DEFAULTS)
    rows = {str(r[0]): tuple(r[1:]) for r in ch.query(f"SELECT trace_id, {columns} FROM requests").result_rows}
    assert rows[f"{1:032x}"] == tuple(AUDIT_DEFAULTS.values()) == ("", "", -1.0, -1.0, -1.0)
    assert rows[f"{2:032x}"] == (f"{1:032x}", "small_to_large", 0.75, -1.0, -1.0)  # trace ids in lower case
    assert rows[f"{3:032x}"] == (f"{1:032x}", "large_to_small", -1.0, 0.5, 1.0)


def test_a_nan_repetition_is_refused() -> None:
    _rows, errors = parse_request_log(line(1, evaluated=True).replace("}", ', "repetition": NaN}'))
    assert errors == [(1, "repetition: Input should be a finite number")]


def test_refused_lines_are_answered_to_the_gateway_and_not_stored(ch, tmp_path: Path) -> None:
    body = "\n".join([line(1, evaluated=True, refusal=True), line(2, evaluated=True, repetition=2.0)])
    [answer] = post(ch, tmp_path, [("/v1/requests", body.encode(), JSON, False)])
    assert answer["kept"] == 1
    assert answer["rejected"] == [{"line": 2, "error": "repetition: Input should be less than or equal to 1"}]
    assert list(quality_of(ch)) == [f"{1:032x}"]


def test_engine_and_mapped_gateway_rows_still_insert_as_not_evaluated(ch, tmp_path: Path) -> None:
    """One writer batch mixes scored gateway lines, engine spans (decoded in Python, as protobuf and
    OTLP/JSON, and by the store's view) and LiteLLM records: all land; the ones without scores with
    the defaults; the rollup saw every row."""
    litellm = LITELLM.read_text().splitlines()
    bodies = [
        ("/v1/requests", line(1, evaluated=True, refusal=True, answer_hash="ab" * 8).encode(), JSON, False),
        ("/v1/traces", export(llm_span("a" * 32)), PROTOBUF, False),
        ("/v1/traces", otlp_json(export(llm_span("b" * 32))), JSON, False),
        ("/v1/litellm", "\n".join(litellm).encode(), JSON, False),
        ("/v1/traces", export(llm_span("c" * 32)), PROTOBUF, True),  # ClickHouse's view (migration 0010)
    ]
    answers = post(ch, tmp_path, bodies)
    assert answers[3]["kept"] == len(litellm)
    got = quality_of(ch)
    total = 1 + 3 + len(litellm)
    assert len(got) == total == int(ch.command("SELECT count() FROM requests"))
    assert got.pop(f"{1:032x}") == (1, "abababababababab", 0, 0, 0, 1, 0.0, -1, "")
    for trace in ("a" * 32, "b" * 32, "c" * 32):
        assert got.pop(trace) == NOT_EVALUATED, trace
    assert set(got.values()) == {NOT_EVALUATED}  # the LiteLLM rows
    gateways = ch.query("SELECT DISTINCT gateway FROM requests WHERE source = 'gateway'").result_rows
    assert {g for (g,) in gateways} == {"fleetscope", "litellm"}
    assert int(ch.command("SELECT sum(rows) FROM requests_1m")) == total  # the rollup (0006) saw every row


def test_by_default_the_store_holds_no_answer_text(ch, tmp_path: Path) -> None:
    """The gateway without ``quality.keep_text`` sends scores and a hash, never the answer: no row
    holds text. With keep_text it sends ``answer_text``, which the check finds (it can fail)."""
    scored = [line(n, evaluated=True, answer_hash=f"{n:016x}", answer_chars=40 + n) for n in range(1, 6)]
    post(ch, tmp_path, [("/v1/requests", "\n".join([*scored, line(9)]).encode(), JSON, False)])
    assert int(ch.command("SELECT count() FROM requests WHERE evaluated = 1")) == 5
    assert stored_answer_texts(ch) == 0
    kept = line(7, evaluated=True, answer_hash="7" * 16, answer_chars=11, answer_text="hello world")
    post(ch, tmp_path, [("/v1/requests", kept.encode(), JSON, False)])
    assert stored_answer_texts(ch) == 1


def test_a_kept_answer_longer_than_the_cap_is_cut_and_keeps_its_length() -> None:
    text = "x" * (MAX_ANSWER_TEXT + 10)
    rows, errors = parse_request_log(line(1, evaluated=True, answer_chars=len(text), answer_text=text))
    assert not errors
    assert len(rows[0]["answer_text"]) == MAX_ANSWER_TEXT and rows[0]["answer_chars"] == MAX_ANSWER_TEXT + 10
