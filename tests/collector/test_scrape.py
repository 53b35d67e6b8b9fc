"""Scraper against local HTTP targets: good, slow, 500, garbage, oversized, gzip, counter resets."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from analytics.counters import increase
from analytics.metrics import counter_increase
from collector.convert import Batch, SeriesConverter, load_prior
from collector.scrape import Scraper, ScrapeResult, scrape_once
from collector.targets import FileDiscovery, TargetError, make_target
from collector.writer import Writer, WriterConfig
from migrations import clickhouse_runner
from tests.collector.helpers import Targets


def scrape(kind: str, **kw) -> ScrapeResult:
    async def go() -> ScrapeResult:
        async with Targets() as t, aiohttp.ClientSession() as client:
            return await scrape_once(client, t.target(kind), **kw)

    return asyncio.run(go())


def test_good_target_gzip() -> None:
    result = scrape("good")
    assert result.up and result.error == "" and result.samples == 432
    assert result.exposition is not None and len(result.exposition) == 432


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("slow", "timeout after 0.5s"),
        ("error", "HTTP status 500"),
        ("garbage", "parse error: line 1"),
        ("missing", "HTTP status 404"),
    ],
)
def test_failed_scrapes_are_down_with_a_reason_and_no_samples(kind: str, reason: str) -> None:
    result = scrape(kind)
    assert not result.up and reason in result.error
    assert result.samples == 0 and result.exposition is None


def test_oversized_body_fails_the_scrape() -> None:
    result = scrape("huge", max_body_bytes=100_000)
    assert not result.up and "body larger than 100000 bytes" in result.error


def test_timeout_must_not_exceed_interval() -> None:
    with pytest.raises(TargetError, match=r"timeout \(5s\) must be > 0 and <= interval \(2s\)"):
        make_target("127.0.0.1:1", job="x", interval_s=2, timeout_s=5)


def test_a_slow_target_does_not_delay_the_others() -> None:
    results: list[ScrapeResult] = []

    async def go() -> dict[str, int]:
        async with Targets() as t:
            scraper = Scraper(results.append)
            scraper.set_targets([t.target("slow", 0.5, 0.5), t.target("good", 0.5, 0.4), t.target("error", 0.5, 0.4)])
            await asyncio.sleep(2.6)
            await scraper.close()
            return dict(t.hits)

    asyncio.run(go())
    by_kind: dict[str, list[ScrapeResult]] = {}
    for r in results:
        by_kind.setdefault(r.target.replica, []).append(r)
    assert len(by_kind["good"]) >= 4 and all(r.up for r in by_kind["good"])
    assert all(not r.up for r in by_kind["slow"]) and all(not r.up for r in by_kind["error"])
    gaps = [b.timestamp - a.timestamp for a, b in zip(by_kind["good"], by_kind["good"][1:], strict=False)]
    assert all(0.4 < g < 0.6 for g in gaps), gaps  # on schedule despite the slow neighbour


def test_counter_reset_never_gives_a_negative_increase(ch, tmp_path: Path) -> None:
    clickhouse_runner.apply(ch)
    writer = Writer(ch, WriterConfig(spool_dir=tmp_path / "spool"))
    converter = SeriesConverter()

    async def go() -> None:
        async with Targets() as t, aiohttp.ClientSession() as client:
            target = t.target("counter")
            for _ in range(4):
                batch = Batch()
                converter.convert(await scrape_once(client, target), batch)
                for table, cols in batch.tables.items():
                    writer.add(table, cols)
                await asyncio.sleep(0.01)

    start = datetime.now(UTC)
    asyncio.run(go())
    assert writer.flush()
    df = increase(ch, "vllm:prompt_tokens_total", start, datetime.now(UTC), by="replica")
    # 100 -> 150 (+50), reset to 3 (+3), 3 -> 10 (+7)
    assert df.to_dict("records") == [{"replica": "counter", "increase": 60.0}]
    # the stored reset marks give the same, and a restarted collector starts from the last values
    assert ch.command("SELECT sum(reset) FROM samples WHERE metric = 'vllm:prompt_tokens_total'") == 150
    fast = counter_increase(ch, "vllm:prompt_tokens_total", start, datetime.now(UTC), by="replica", tier="raw")
    assert fast.to_dict("records") == [{"replica": "counter", "increase": 60.0}]
    prior = load_prior(ch)
    last = ch.command("SELECT fingerprint FROM samples WHERE metric = 'vllm:prompt_tokens_total' LIMIT 1")
    assert prior[int(last)] == 10.0


def test_file_sd_is_reread_on_change_and_keeps_good_targets_on_error(tmp_path: Path) -> None:
    path = tmp_path / "targets.json"
    path.write_text('[{"targets": ["127.0.0.1:9001", "127.0.0.1:9002"], "labels": {"replica": "a", "job": "vllm"}}]')
    sd = FileDiscovery(path, "file_sd", interval_s=5, timeout_s=4)
    assert sd.poll() and [t.instance for t in sd.targets] == ["127.0.0.1:9001", "127.0.0.1:9002"]
    assert sd.targets[0].job == "vllm" and sd.targets[0].replica == "a"
    assert not sd.poll()  # unchanged
    time.sleep(0.01)
    path.write_text("[{broken")
    import os

    os.utime(path, (time.time() + 5, time.time() + 5))
    assert not sd.poll() and "not valid JSON" in (sd.error or "")
    assert len(sd.targets) == 2
    path.write_text('[{"targets": ["127.0.0.1:9003"]}]')
    os.utime(path, (time.time() + 10, time.time() + 10))
    assert sd.poll() and [t.instance for t in sd.targets] == ["127.0.0.1:9003"] and sd.error is None
