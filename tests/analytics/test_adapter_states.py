"""Adapter states read from an engine that showed none before its first step.

vLLM exposes ``vllm:lora_requests_info`` only once the engine has stepped: a replica scraped
while idle has no state series at all. When its first requests (an adapter's among them) all run
between two scrapes, the state that names the adapter appears in the same scrape as the first
state series of all, and never grows again. It ran, and the residency must say so (on real
engines this lost the adapter: tests/integration/test_specdecode_lora_engines.py, CI 2026-12-06).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from analytics.adapters import residency, states
from collector.convert import Batch, SeriesConverter
from collector.exposition import parse
from collector.scrape import ScrapeResult
from collector.targets import make_target
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
INTERVAL_S = 15
LORA = "vllm:lora_requests_info"


def _exposition(at: float, i: int) -> str:
    text = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="base"} 0\n'
    if i < 3:  # idle: no state yet
        return text
    # from scrape 3: the adapter ran (with the base) between scrapes 2 and 3 and stood still after;
    # the engine has stepped with nothing running since
    burst = T0.timestamp() + 2 * INTERVAL_S + 5
    return text + (
        f"# TYPE {LORA} gauge\n"
        f'{LORA}{{max_lora="1",waiting_lora_adapters="",running_lora_adapters="ad-a"}} {burst}\n'
        f'{LORA}{{max_lora="1",waiting_lora_adapters="",running_lora_adapters=""}} {min(at, burst + 1 + i)}\n'
    )


def test_a_state_seen_first_with_the_engines_first_states_counts(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    target = make_target(
        "10.0.0.2:8000", job="vllm", interval_s=INTERVAL_S, timeout_s=5, labels={"replica": "r", "model": "base"}
    )
    converter, batch = SeriesConverter(), Batch()
    for i in range(12):
        ts = (T0 + timedelta(seconds=INTERVAL_S * i)).timestamp()
        converter.convert(ScrapeResult(target, ts, True, 0.01, 2, "", parse(_exposition(ts, i))), batch)
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path))
    writer.add_tables(batch.tables)
    assert writer.flush()
    window = (T0, T0 + timedelta(minutes=5))

    seen = states(ch, *window)
    first = seen[seen["ts"] == T0 + timedelta(seconds=3 * INTERVAL_S)]
    assert sorted(tuple(r) for r in first["running"]) == [(), ("ad-a",)], "both states appeared at scrape 3, both count"
    # the adapter's state stood still after: counted once; the idle state grew at scrapes 4-11
    assert sum(tuple(r) == ("ad-a",) for r in seen["running"]) == 1
    found = residency(ch, *window).set_index("adapter")
    assert list(found.index) == ["ad-a"]
    assert found.loc["ad-a", "resident_share"] > 0

    # a window that starts after the burst: the adapter's state is old news there
    later = residency(ch, T0 + timedelta(seconds=INTERVAL_S * 5), window[1])
    assert later.empty
