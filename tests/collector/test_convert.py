"""Scrapes -> rows: target labels, vLLM renames, fingerprints, series written once."""

from __future__ import annotations

import time

import numpy as np

from collector.convert import Batch, SeriesConverter, canonical_name, fingerprint
from collector.exposition import SeriesCache, parse
from collector.scrape import ScrapeResult
from collector.targets import make_target

OLD_VLLM = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.97
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.1",model_name="m"} 4
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 5
vllm:time_per_output_token_seconds_count{model_name="m"} 5
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.3
vllm:request_time_per_output_token_seconds_count{model_name="m"} 5
some_unknown_metric{instance="engine-side"} 1
"""


def result(text: str, cache: SeriesCache | None = None, up: bool = True) -> ScrapeResult:
    target = make_target(
        "127.0.0.1:8101", job="vllm", labels={"replica": "small-0", "model": "tiny-small"}, interval_s=5, timeout_s=4
    )
    exposition = parse(text, cache=cache) if up else None
    return ScrapeResult(
        target, time.time(), up, 0.01, len(exposition) if exposition else 0, "" if up else "timeout", exposition
    )


def test_old_vllm_names_map_to_current_ones_and_keep_the_original() -> None:
    batch = Batch()
    converter = SeriesConverter()
    converter.convert(result(OLD_VLLM), batch)
    series = batch.tables["series"]
    pairs = dict(zip(series["original_metric"], series["metric"], strict=True))
    assert pairs["vllm:gpu_cache_usage_perc"] == "vllm:kv_cache_usage_perc"
    assert pairs["vllm:time_per_output_token_seconds_bucket"] == "vllm:inter_token_latency_seconds_bucket"
    # a current metric that merely contains the old name is left alone
    assert (
        pairs["vllm:request_time_per_output_token_seconds_count"] == "vllm:request_time_per_output_token_seconds_count"
    )
    assert pairs["some_unknown_metric"] == "some_unknown_metric"  # unknown metrics are stored too
    assert converter.renamed["vllm:gpu_cache_usage_perc"] == "vllm:kv_cache_usage_perc"
    assert canonical_name("vllm:gpu_prefix_cache_hits_total") == "vllm:prefix_cache_hits_total"


def test_target_labels_are_added_and_clashes_kept_as_exported() -> None:
    batch = Batch()
    SeriesConverter().convert(result(OLD_VLLM), batch)
    labels = {
        m: labels
        for m, labels in zip(batch.tables["series"]["original_metric"], batch.tables["series"]["labels"], strict=True)
    }
    unknown = labels["some_unknown_metric"]
    assert unknown["instance"] == "127.0.0.1:8101" and unknown["exported_instance"] == "engine-side"
    assert unknown["job"] == "vllm" and unknown["replica"] == "small-0" and unknown["model"] == "tiny-small"


def test_series_rows_once_samples_every_scrape_with_stable_fingerprints() -> None:
    converter, cache = SeriesConverter(), SeriesCache()
    first, second = Batch(), Batch()
    converter.convert(result(OLD_VLLM, cache), first)
    converter.convert(result(OLD_VLLM.replace("0.97", "0.5"), cache), second)
    assert len(first.tables["series"]["fingerprint"]) == 7 and "series" not in second.tables
    assert first.tables["samples"]["fingerprint"] == list(second.tables["samples"]["fingerprint"])
    assert second.tables["samples"]["value"][0] == 0.5
    fp = first.tables["series"]["fingerprint"][0]
    assert fp == fingerprint("vllm:kv_cache_usage_perc", first.tables["series"]["labels"][0])
    assert 0 <= fp < 2**64


def test_failed_scrape_writes_only_its_health_row() -> None:
    batch = Batch()
    SeriesConverter().convert(result("", up=False), batch)
    assert set(batch.tables) == {"scrapes"}
    assert batch.tables["scrapes"]["up"] == [0] and batch.tables["scrapes"]["error"] == ["timeout"]


def test_old_name_next_to_new_name_and_repeated_series_are_not_counted_twice() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:kv_cache_usage_perc{model_name="m"} 0.6\n'
        'dup{a="1"} 1\n'
        'dup{a="1"} 2\n'
        "future 1 99999999999999999\n"
    )
    batch, converter = Batch(), SeriesConverter()
    converter.convert(result(text), batch)
    rows = list(zip(batch.tables["samples"]["metric"], batch.tables["samples"]["value"], strict=True))
    assert rows == [("vllm:kv_cache_usage_perc", 0.6), ("dup", 1.0)]
    assert converter.duplicates == 2 and converter.out_of_bounds == 1


COUNTERS = """\
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{model_name="m"}} {tokens}
vllm:prompt_tokens_created{{model_name="m"}} 1.7e9
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="1.0",model_name="m"}} {bucket}
vllm:e2e_request_latency_seconds_bucket{{le="+Inf",model_name="m"}} {bucket}
vllm:e2e_request_latency_seconds_sum{{model_name="m"}} {total}
vllm:e2e_request_latency_seconds_count{{model_name="m"}} {bucket}
"""


def resets(converter: SeriesConverter, **values: float) -> dict[str, float]:
    batch = Batch()
    converter.convert(result(COUNTERS.format(**values)), batch)
    s = batch.tables["samples"]
    return dict(zip(s["metric"], s["reset"], strict=True))


def test_counter_resets_are_marked_with_the_value_before_them() -> None:
    c = SeriesConverter()
    first = resets(c, tokens=100, running=3, bucket=5, total=2.5)
    assert set(first.values()) == {0.0}  # nothing to compare the first sample with
    second = resets(c, tokens=160, running=1, bucket=7, total=3.0)
    assert set(second.values()) == {0.0}  # counters went up; the gauge going down is no reset
    restarted = resets(c, tokens=12, running=0, bucket=1, total=0.25)
    assert restarted["vllm:prompt_tokens_total"] == 160  # counts from zero again: 160 came before
    assert restarted["vllm:e2e_request_latency_seconds_count"] == 7
    assert restarted["vllm:e2e_request_latency_seconds_sum"] == 3.0
    assert restarted["vllm:num_requests_running"] == 0  # a gauge
    assert restarted["vllm:prompt_tokens_created"] == 0  # a timestamp, not a counter
    nan = resets(c, tokens=float("nan"), running=0, bucket=1, total=0.25)
    assert nan["vllm:prompt_tokens_total"] == 0
    after_nan = resets(c, tokens=5, running=0, bucket=1, total=0.25)
    assert after_nan["vllm:prompt_tokens_total"] == 12  # NaN did not replace the last good value


def test_a_restarted_collector_continues_from_the_stored_values() -> None:
    batch = Batch()
    SeriesConverter().convert(result(COUNTERS.format(tokens=100, running=3, bucket=5, total=2.5)), batch)
    s = batch.tables["samples"]
    prior = dict(zip(s["fingerprint"], s["value"], strict=True))  # what load_prior reads back
    after = resets(SeriesConverter(prior), tokens=30, running=3, bucket=6, total=3.0)
    assert after["vllm:prompt_tokens_total"] == 100  # a reset across the collector restart is seen
    assert after["vllm:e2e_request_latency_seconds_count"] == 0


def test_repeated_layouts_convert_to_the_same_rows_as_the_general_path() -> None:
    """The fast path (same series as the last scrape) and the general path agree row for row."""
    cache = SeriesCache()
    fast, general = SeriesConverter(), SeriesConverter()
    scrapes = [
        dict(tokens=t, running=r, bucket=b, total=s)
        for t, r, b, s in [
            (100, 3, 5, 2.5),
            (160, 1, 7, 3.0),
            (12, 0, 1, 0.25),
            (float("nan"), 2, 1, 0.25),
            (20, 2, 2, 0.5),
            (25, 1, 3, 0.75),
        ]
    ]
    extra = '# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{model_name="m"} 4\n'
    for i, values in enumerate(scrapes):
        text = COUNTERS.format(**values) + (extra if i == 3 else "")  # a series comes and goes
        got, want = Batch(), Batch()
        fast.convert(result(text, cache=cache), got)
        general._layout = None  # the general path, every time
        general.convert(result(text), want)
        g, w = got.tables["samples"], want.tables["samples"]
        for column in ("metric", "fingerprint", "reset"):
            assert list(g[column]) == list(w[column]), (i, column)
        assert np.array_equal(np.asarray(g["value"], dtype=float), np.asarray(w["value"], dtype=float), equal_nan=True)
    assert isinstance(got.tables["samples"]["value"], np.ndarray)  # the last scrape took the fast path
    assert list(got.tables["samples"]["reset"]) == [0.0] * len(got.tables["samples"]["reset"])
