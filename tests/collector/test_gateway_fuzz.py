"""1,000 fuzzed variants of each gateway-telemetry body kind through the real receiver: no crash
(every answer is a 200 or a 400 with a reason), and no row from garbage — every row that comes
out is one a request could make (a model name, counts a UInt32 holds, a plausible time, a trace
id that is one), and random bytes or JSON make none."""

from __future__ import annotations

import asyncio
import json
import math
import random
import string
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from collector.service import Collector, CollectorConfig
from tests.collector.test_gateway_telemetry import DATA, JSON, PROTOBUF, TARGETS, to_protobuf

VARIANTS = 1_000
BASES = {
    "traces": [json.loads((DATA / f).read_text()) for f in ("spans_current.json", "spans_legacy.json")],
    "logs": [json.loads((DATA / "envoy_logs.json").read_text())],
}
LITELLM = [json.loads(line) for line in (DATA / "litellm_payloads.ndjson").read_text().splitlines() if line.strip()]


class RowsOnly:
    """Stands in for the collector's writer (the store is not what is fuzzed): keeps the rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.client = None

    def add(self, table: str, columns: dict[str, list[Any]]) -> None:
        assert table == "requests"
        names = list(columns)
        self.rows.extend(dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True))

    def spool_size(self) -> tuple[int, int]:
        return 0, 0


def _odd_value(rng: random.Random) -> Any:
    return rng.choice(
        [
            -1,
            2**40,
            2**64,
            -(2**63),
            1e308,
            "NaN",
            "inf",
            "-0",
            "",
            "1e400",
            "٣",  # an Arabic-Indic digit
            "\x00\x01",
            "x" * 5000,
            "1" * 400,  # an integer no float holds
            int("9" * 300),
            "http://h:99999/v1",  # a port out of range
            "http://[::1/v1",  # a broken IPv6 literal
            None,
            True,
            [],
            {},
            [1, [2, [3]]],
            {"a": {"b": {"c": 1}}},
            rng.random() * 1e20,
            "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 40))),
        ]
    )


def _json_leaf(rng: random.Random, value: Any) -> Any:
    # an OTLP/JSON AnyValue replaced by another kind (or a broken one)
    return rng.choice(
        [
            {"intValue": str(_odd_value(rng))},
            {"doubleValue": _odd_value(rng)},
            {"stringValue": _odd_value(rng)},
            {"boolValue": _odd_value(rng)},
            {"arrayValue": {"values": [value, value]}},
            {"kvlistValue": {"values": [{"key": "k", "value": value}]}},
            {"bytesValue": "!!notbase64"},
            {},
            _odd_value(rng),
        ]
    )


def _mutate_tree(rng: random.Random, node: Any, rate: float) -> Any:
    """A structural mutation of a decoded JSON body: values of other kinds, keys dropped or renamed."""
    if isinstance(node, dict):
        out = {}
        for name, value in node.items():
            roll = rng.random()
            if roll < rate * 0.2:
                continue  # dropped
            key = name + rng.choice(["", "_", ".x", "Z"]) if roll < rate * 0.3 else name
            if key == "value" and rng.random() < rate:
                out[key] = _json_leaf(rng, value)
            elif rng.random() < rate * 0.3:
                out[key] = _odd_value(rng)
            else:
                out[key] = _mutate_tree(rng, value, rate)
        return out
    if isinstance(node, list):
        items = [_mutate_tree(rng, v, rate) for v in node]
        if items and rng.random() < rate:
            items.append(items[rng.randrange(len(items))])
        return items
    return node


def _mutate_bytes(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    for _ in range(rng.randint(1, 8)):
        kind = rng.random()
        if not data:
            break
        at = rng.randrange(len(data))
        if kind < 0.4:
            data[at] ^= 1 << rng.randrange(8)
        elif kind < 0.6:
            del data[at : at + rng.randint(1, 16)]
        elif kind < 0.8:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            data = data[:at]
    return bytes(data)


def _variants(kind: str, rng: random.Random) -> list[tuple[str, bytes, dict[str, str], bool]]:
    """(path, body, headers, garbage: a body that must make no row)."""
    out: list[tuple[str, bytes, dict[str, str], bool]] = []
    for i in range(VARIANTS):
        third = i % 3
        if kind == "litellm":
            if third == 2:
                garbage = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
                out.append(("/v1/litellm", garbage, JSON, True))
                continue
            items = [_mutate_tree(rng, item, 0.3) for item in rng.sample(LITELLM, k=min(3, len(LITELLM)))]
            text = "\n".join(json.dumps(item) for item in items)
            body = text.encode() if third == 0 else _mutate_bytes(rng, text.encode())
            out.append(("/v1/litellm", body, JSON, False))
            continue
        path = f"/v1/{kind.split('-')[0]}"
        base = rng.choice(BASES[kind.split("-")[0]])
        message = ExportTraceServiceRequest() if path == "/v1/traces" else ExportLogsServiceRequest()
        if kind.endswith("json"):
            if third == 2:
                junk = (
                    _odd_value(rng)
                    if rng.random() < 0.5
                    else {"resourceSpans": _odd_value(rng), "resourceLogs": _odd_value(rng)}
                )
                out.append((path, json.dumps(junk).encode(), JSON, True))
            else:
                # the OTLP/JSON decoder refuses a body with one malformed value: a light touch leaves some whole
                body = json.dumps(_mutate_tree(rng, base, 0.03 if third == 0 else 0.0)).encode()
                out.append((path, body if third == 0 else _mutate_bytes(rng, body), JSON, False))
        else:
            if third == 2:
                out.append((path, bytes(rng.randrange(256) for _ in range(rng.randint(0, 400))), PROTOBUF, True))
                continue
            try:
                body = to_protobuf(_mutate_tree(rng, base, 0.15), message) if third == 0 else to_protobuf(base, message)
            except Exception:  # noqa: BLE001 - a mutation protobuf's own JSON parser refuses: mutate the bytes
                body = to_protobuf(base, message)
            out.append((path, _mutate_bytes(rng, body) if third == 1 else body, PROTOBUF, False))
    return out


def _plausible(row: dict[str, Any]) -> str | None:
    """Why ``row`` is no request row, or None."""
    model = row["model"]
    gateway = row["source"] == "gateway"  # an engine span's model and time are what the engine said
    if gateway and (not isinstance(model, str) or not model or not model.isprintable() or len(model) > 512):
        return f"model {model!r}"
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "max_tokens"):
        value = row[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
            return f"{name} {value!r}"
    if gateway and not 1e9 <= row["ts"] <= 1e10:
        return f"ts {row['ts']!r}"
    for name in ("ttft_seconds", "e2e_seconds", "queue_seconds", "decode_seconds", "tpot_seconds"):
        if not (isinstance(row[name], float) and math.isfinite(row[name]) and row[name] >= 0):
            return f"{name} {row[name]!r}"
    trace = row["trace_id"]
    if trace and (len(trace) != 32 or any(c not in "0123456789abcdef" for c in trace)):
        return f"trace_id {trace!r}"
    if not 100 <= row["status_code"] <= 599:
        return f"status_code {row['status_code']!r}"
    if row["source"] == "gateway" and not row["gateway"]:
        return "a gateway row without its gateway"
    return None


@pytest.mark.parametrize("kind", ["traces-protobuf", "traces-json", "logs-protobuf", "logs-json", "litellm"])
def test_fuzzed_bodies_never_crash_and_make_no_row_from_garbage(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(f"fuzz-{kind}")
    variants = _variants(kind, rng)
    writer = RowsOnly()
    collector = Collector(
        CollectorConfig(grpc_port=0, static_targets=TARGETS, otlp_decode="python"), writer, CollectorRegistry()
    )  # type: ignore[arg-type]
    collector._set_targets()
    statuses: dict[int, int] = {}
    garbage_rows = 0

    async def go() -> None:
        nonlocal garbage_rows
        async with TestClient(TestServer(collector.app())) as client:
            for path, body, headers, garbage in variants:
                before = len(writer.rows)
                r = await client.post(path, data=body, headers=headers)
                statuses[r.status] = statuses.get(r.status, 0) + 1
                if r.status == 400:
                    assert (await r.json()).get("error") or (await r.json()).get("rejected"), body[:80]
                if garbage:
                    garbage_rows += len(writer.rows) - before

    asyncio.run(go())
    assert set(statuses) <= {200, 400}, statuses  # no 500: nothing crashed
    crashes = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert not crashes, crashes[:3]  # no record met an error the mapping did not foresee
    assert statuses.get(400, 0) >= VARIANTS // 4, statuses  # the garbage third (and more) refused
    assert statuses.get(200, 0) >= VARIANTS // 6, statuses  # and mutated bodies still read
    assert garbage_rows == 0
    bad = [(why, row) for row in writer.rows if (why := _plausible(row))]
    assert not bad, bad[:3]
    # the mutated bodies made rows (a record repeated with its request id is stored once): the fuzz reached the mapping
    repeated = sum(
        collector.registry.get_sample_value(
            "fleetscope_collector_gateway_records_total", {"endpoint": e, "result": "duplicate"}
        )
        or 0
        for e in ("traces", "logs", "litellm")
    )
    assert len(writer.rows) + repeated > VARIANTS // 5, (len(writer.rows), repeated)
