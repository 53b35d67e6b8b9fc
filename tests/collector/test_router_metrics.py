"""Routers' own metrics, from recordings made of their documented families (neither router can be
installed here: tests/collector/data/routers/): the production-stack router's ``vllm:*`` families
are told apart from an engine's and stored as ``production_stack:*``; llm-d's endpoint picker's
``inference_*`` families are stored as they are; an engine's series are left alone."""

from __future__ import annotations

import time
from pathlib import Path

from collector.convert import Batch, SeriesConverter
from collector.exposition import parse
from collector.scrape import ScrapeResult
from collector.targets import make_target

DATA = Path(__file__).parent / "data"
STACK = (DATA / "routers" / "production_stack_router.prom").read_text()
EPP = (DATA / "routers" / "llmd_epp.default.prom").read_text()
ENGINE = (DATA / "vllm-0.32-cpu-metrics.txt").read_text()


def converted(text: str, job: str, labels: dict[str, str]) -> dict[str, str]:
    """original name -> stored name of every series of one scrape."""
    target = make_target("127.0.0.1:9000", job=job, labels=labels, interval_s=5, timeout_s=4)
    exposition = parse(text)
    batch = Batch()
    SeriesConverter().convert(ScrapeResult(target, time.time(), True, 0.01, len(exposition), "", exposition), batch)
    series = batch.tables["series"]
    return dict(zip(series["original_metric"], series["metric"], strict=True))


def test_the_production_stack_routers_vllm_families_are_not_an_engines() -> None:
    names = converted(STACK, "router", {"gateway": "production-stack"})
    router_vllm = {old: new for old, new in names.items() if old.startswith("vllm:")}
    assert len(router_vllm) >= 15  # every family the recording has samples of
    assert all(new == "production_stack:" + old[len("vllm:") :] for old, new in router_vllm.items()), router_vllm
    # the live collision: the router's in-flight count is not the engines' running batch
    assert names["vllm:num_requests_running"] == "production_stack:num_requests_running"
    # and its per-model counter, which has no server label, is known by its name
    assert names["vllm:num_incoming_requests_total"] == "production_stack:num_incoming_requests_total"
    assert names["router_cpu_usage_percent"] == "router_cpu_usage_percent"


def test_an_engines_series_keep_their_names_beside_a_router() -> None:
    names = converted(ENGINE, "vllm", {"replica": "small-0", "model": "tiny-small"})
    assert names and all(new == old or old.startswith("vllm:gpu_") for old, new in names.items())
    assert "vllm:num_requests_running" in names.values()
    assert not any(new.startswith("production_stack:") for new in names.values())


def test_the_endpoint_pickers_families_are_stored_as_they_are() -> None:
    names = converted(EPP, "epp", {"gateway": "llm-d"})
    epp = [
        n for n in names.values() if n.startswith(("inference_objective_", "inference_pool_", "inference_extension_"))
    ]
    assert len({n.rsplit("_bucket", 1)[0] for n in epp}) >= 10
    assert all(old == new for old, new in names.items())
