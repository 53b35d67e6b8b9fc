"""Exposition parser: same samples as prometheus_client on valid input, one error type on bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from collector.exposition import ExpositionError, SeriesCache, parse

DATA = Path(__file__).parent / "data"
VLLM = (DATA / "vllm-0.32-cpu-metrics.txt").read_text()


def norm_value(v: float) -> object:
    return "nan" if math.isnan(v) else float(v)


def reference(text: str, openmetrics: bool = False) -> list[tuple]:
    families = om_families(text) if openmetrics else text_families(text)
    return [
        (s.name, dict(s.labels), norm_value(s.value), None if s.timestamp is None else float(s.timestamp))
        for f in families
        for s in f.samples
    ]


def ours(text: str, **kw) -> list[tuple]:
    return [(s.name, dict(s.labels), norm_value(s.value), s.timestamp) for s in parse(text, **kw).samples]


HANDWRITTEN = [
    # escapes in label values, trailing comma, tabs, NaN/Inf, ms timestamps, untyped
    "# HELP esc A help with \\\\ and \\n escapes\n# TYPE esc gauge\n"
    'esc{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb",} 1.5\n'
    'esc{path="x"}\t+Inf\n'
    'esc{path="y"} -Inf 1700000000123\n'
    'esc{path="z"} NaN\n'
    "plain 42\n"
    "\n"
    "# just a comment\n"
    "ts_only 3 1700000000000\n",
    # a histogram with _created and a summary
    "# TYPE lat histogram\n"
    'lat_bucket{le="0.1"} 1\nlat_bucket{le="+Inf"} 3\nlat_count 3\nlat_sum 0.7\nlat_created 1.7e9\n'
    '# TYPE q summary\nq{quantile="0.5"} 0.2\nq_sum 1\nq_count 5\n',
    # label values with braces, spaces and '#'
    'odd{a="}{ # x",b="sp ace"} 7\n',
]


@pytest.mark.parametrize("text", [VLLM, *HANDWRITTEN], ids=["vllm-0.32", "escapes", "histogram", "odd-labels"])
def test_same_samples_as_prometheus_client_text(text: str) -> None:
    assert ours(text) == reference(text)


def test_same_samples_with_a_warm_cache() -> None:
    cache = SeriesCache()
    first = ours(VLLM, cache=cache)
    second = ours(VLLM, cache=cache)
    assert first == second == reference(VLLM)
    changed = VLLM.replace(
        'vllm:num_requests_running{engine="0",model_name="tiny-small"} 0.0',
        'vllm:num_requests_running{engine="0",model_name="tiny-small"} 7.0',
    )
    values = {(s.name, s.labels.get("model_name")): s.value for s in parse(changed, cache=cache).samples}
    assert values[("vllm:num_requests_running", "tiny-small")] == 7.0


def test_vllm_exposition_has_types_and_helps() -> None:
    result = parse(VLLM)
    assert len(result) == 432
    assert result.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert result.types["vllm:num_preemptions_total"] == "counter"
    assert "KV-cache usage" in result.helps["vllm:kv_cache_usage_perc"]


OPENMETRICS = (
    "# TYPE req counter\n# HELP req Requests.\n"
    'req_total{code="200"} 10 1700000000.5 # {trace_id="abc"} 1 1700000000.25\n'
    'req_created{code="200"} 1699999999.0 1700000000.5\n'
    "# TYPE temp_celsius gauge\n# UNIT temp_celsius celsius\ntemp_celsius 21.5\n"
    "# EOF\n"
)


def test_openmetrics_matches_prometheus_client() -> None:
    result = parse(OPENMETRICS, "application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert result.openmetrics
    assert ours(OPENMETRICS, content_type="application/openmetrics-text") == reference(OPENMETRICS, openmetrics=True)
    # seconds in OpenMetrics (the text format's are milliseconds)
    assert result.samples[0].timestamp == 1700000000.5
    (exemplar,) = result.exemplars
    assert exemplar.sample_index == 0 and dict(exemplar.labels) == {"trace_id": "abc"} and exemplar.value == 1


def test_openmetrics_is_detected_by_its_eof() -> None:
    assert parse(OPENMETRICS).openmetrics


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("ok 1\nbad{a=1} 2\n", 2, "invalid label set"),
        ('ok 1\n# TYPE x gauge\nx{a="1"}\n', 3, "expected a value"),
        ("x 1_000\n", 1, "invalid number"),
        ("x one\n", 1, "invalid number"),
        ('x{a="1",a="2"} 1\n', 1, "duplicate label"),
        ('x{a="1" 1\n', 1, "unterminated label set"),
        ("9x 1\n", 1, "invalid metric name"),
        ("# TYPE x gauge\n# TYPE x counter\nx 1\n", 2, "second TYPE line"),
        ("# TYPE x flavour\n", 1, "unknown or missing metric type"),
        ("x 1 2 3\n", 1, "expected a value and an optional timestamp"),
    ],
)
def test_malformed_text_names_line_and_reason(text: str, line: int, reason: str) -> None:
    with pytest.raises(ExpositionError) as info:
        parse(text)
    assert info.value.line == line
    assert reason in info.value.reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("x 1\n", "does not end with # EOF"),
        ("x 1\n# EOF\ny 2\n", "content after # EOF"),
        ("x 1\n\n# EOF\n", "empty line"),
    ],
)
def test_malformed_openmetrics(text: str, reason: str) -> None:
    with pytest.raises(ExpositionError, match=reason):
        parse(text, "application/openmetrics-text")


def test_bad_line_in_a_cached_exposition_is_still_caught() -> None:
    cache = SeriesCache()
    parse(VLLM, cache=cache)
    broken = VLLM.replace(
        'vllm:num_requests_waiting{engine="0",model_name="tiny-small"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="tiny-small"} zero',
    )
    with pytest.raises(ExpositionError, match="invalid number 'zero'"):
        parse(broken, cache=cache)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list('ab_:{}="\\, \t\n#+-.0123456789eEINaf')), max_size=200))
def test_fuzzed_text_parses_or_raises_exposition_error(text: str) -> None:
    try:
        result = parse(text)
    except ExpositionError:
        return
    for sample in result.samples:
        assert isinstance(sample.value, float)


label_value = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
series = st.tuples(
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True),
    st.dictionaries(st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,6}", fullmatch=True), label_value, max_size=3),
    st.one_of(st.floats(allow_nan=False, width=64), st.sampled_from([float("inf"), float("-inf")])),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(series, max_size=8, unique_by=lambda s: (s[0], tuple(sorted(s[1].items())))))
def test_generated_valid_expositions_match_prometheus_client(items: list) -> None:
    lines = []
    for name, labels, value in items:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value!r}" if labels else f"{name} {value!r}")
    text = "\n".join(lines) + "\n"
    assert sorted(ours(text), key=repr) == sorted(reference(text), key=repr)


def test_text_format_treats_eof_and_unspaced_type_as_comments() -> None:
    for text in ("a 1\n# EOF\nb 2\n", "#TYPE a counter\na 1\n"):
        result = parse(text, "text/plain; version=0.0.4")
        assert ours(text, content_type="text/plain") == reference(text)
        assert result.types == {}


@pytest.mark.parametrize("ts", ["NaN", "+Inf", "1e30", "17.5"])
def test_text_timestamps_are_integer_milliseconds(ts: str) -> None:
    with pytest.raises(ExpositionError, match="invalid timestamp"):
        parse(f"a 1 {ts}\n")
