"""Collector sharding (Prometheus hashmod): N collectors split the targets, each exactly once."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from collector.service import Collector, CollectorConfig
from collector.targets import FileDiscovery, Shard, Target, TargetError, make_target, shard_of
from tests.conftest import ROOT, run_cli


def targets(n: int) -> list[Target]:
    return [make_target(f"10.{i // 250}.{i % 250}.7:8000", job="vllm", interval_s=5, timeout_s=4) for i in range(n)]


def md5_mod(url: str, count: int) -> int:
    """The assignment computed independently of collector.targets."""
    return int(hashlib.md5(url.encode()).hexdigest(), 16) % count


def test_every_target_goes_to_exactly_one_of_three_shards() -> None:
    all_targets = targets(300)
    shards = [Shard(i, 3).select(all_targets) for i in range(3)]
    owners = Counter(t.url for shard in shards for t in shard)
    assert len(owners) == 300 and set(owners.values()) == {1}
    for index, shard in enumerate(shards):
        assert 0.20 <= len(shard) / 300 <= 0.47, [len(s) for s in shards]
        assert all(md5_mod(t.url, 3) == index for t in shard)


def test_one_shard_keeps_every_target_in_order() -> None:
    all_targets = targets(50)
    assert Shard().select(all_targets) == all_targets
    assert Shard(0, 1).select(all_targets) == all_targets


def test_assignment_is_the_same_in_another_process() -> None:
    """No per-process hash seed: a second interpreter (other PYTHONHASHSEED) agrees."""
    all_targets = targets(60)
    code = (
        "import json, sys\n"
        "from collector.targets import make_target, shard_of\n"
        "urls = json.load(sys.stdin)\n"
        "ts = [make_target(u, job='vllm', interval_s=5, timeout_s=4) for u in urls]\n"
        "print(json.dumps([shard_of(t, 3) for t in ts]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps([t.url for t in all_targets]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
        timeout=60,
    )
    other = json.loads(result.stdout)
    assert other == [shard_of(t, 3) for t in all_targets] == [md5_mod(t.url, 3) for t in all_targets]


def test_static_and_file_sd_targets_are_sharded_alike(tmp_path: Path) -> None:
    static = targets(40)
    sd_file = tmp_path / "sd.json"
    sd_file.write_text(json.dumps([{"targets": [f"192.168.1.{i}:9100" for i in range(40)], "labels": {"zone": "a"}}]))
    shards = []
    for index in range(3):
        discovery = FileDiscovery(sd_file, "node", 5, 4)
        discovery.poll()
        config = CollectorConfig(static_targets=static, file_sd=[discovery], shard=Shard(index, 3))
        collector = Collector(config, writer=None)  # type: ignore[arg-type]  # targets only, no writes
        assert len(collector.all_targets()) == 80
        shards.append(collector.targets())
    owners = Counter(t.key for shard in shards for t in shard)
    assert len(owners) == 80 and set(owners.values()) == {1}
    for index, shard in enumerate(shards):
        assert {t.job for t in shard} == {"vllm", "node"}  # both sources are split
        assert all(md5_mod(t.url, 3) == index for t in shard)


@pytest.mark.parametrize(("index", "count"), [(3, 3), (0, 0), (-1, 2)])
def test_a_bad_shard_is_refused(index: int, count: int) -> None:
    with pytest.raises(TargetError, match="shard"):
        Shard(index, count)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"FLEETSCOPE_COLLECTOR_SHARD_INDEX": "3", "FLEETSCOPE_COLLECTOR_SHARD_COUNT": "3"},
            "error: environment FLEETSCOPE_COLLECTOR_SHARD_INDEX: collector.shard_index: "
            "must be less than collector.shard_count (3)",
        ),
        (
            {"FLEETSCOPE_COLLECTOR_SHARD_COUNT": "0"},
            "error: environment FLEETSCOPE_COLLECTOR_SHARD_COUNT: collector.shard_count: "
            "Input should be greater than or equal to 1",
        ),
        (
            {"FLEETSCOPE_COLLECTOR_SHARD_INDEX": "1"},  # count defaults to 1
            "error: environment FLEETSCOPE_COLLECTOR_SHARD_INDEX: collector.shard_index: "
            "must be less than collector.shard_count (1)",
        ),
    ],
)
def test_config_check_refuses_bad_shard_settings(tmp_path: Path, env: dict[str, str], expected: str) -> None:
    result = run_cli("config", "check", cwd=tmp_path, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr


def test_config_check_names_the_file_line(tmp_path: Path) -> None:
    (tmp_path / "fleetscope.yaml").write_text("collector:\n  shard_count: 2\n  shard_index: 2\n")
    result = run_cli("config", "check", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: fleetscope.yaml:3: collector.shard_index: must be less than")
    good = run_cli("config", "check", cwd=tmp_path, env={"FLEETSCOPE_COLLECTOR_SHARD_INDEX": "1"})
    assert good.returncode == 0, good.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_three_collect_processes_split_the_targets(tmp_path: Path) -> None:
    """``fleetscope collect`` x3, shard settings from the environment: each scrapes its share."""
    addresses = [f"127.0.0.1:{port}" for port in range(1, 31)]  # nothing listens: scrapes just fail
    expected = Counter(md5_mod(f"http://{a}/metrics", 3) for a in addresses)
    exe = Path(sys.executable).parent / "fleetscope"
    procs = []
    for index in range(3):
        workdir = tmp_path / f"c{index}"
        workdir.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
        env.update(
            {
                "FLEETSCOPE_COLLECTOR_SHARD_INDEX": str(index),
                "FLEETSCOPE_COLLECTOR_SHARD_COUNT": "3",
                "FLEETSCOPE_COLLECTOR_FLEET_TARGETS": "false",
                "FLEETSCOPE_COLLECTOR_STATIC_TARGETS": json.dumps([{"job": "t", "targets": addresses}]),
                "FLEETSCOPE_COLLECTOR_SCRAPE_INTERVAL_S": "60",
                "FLEETSCOPE_COLLECTOR_SCRAPE_TIMEOUT_S": "1",
                "FLEETSCOPE_COLLECTOR_OTLP_HTTP_PORT": str(free_port()),
                "FLEETSCOPE_COLLECTOR_OTLP_GRPC_PORT": "0",
            }
        )
        procs.append(
            subprocess.Popen(
                [str(exe), "collect"],
                cwd=workdir,
                env=env,
                text=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
    found: dict[int, str] = {}

    def watch(index: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "scraping" in line and "targets" in line:
                found[index] = line.strip()
                return

    watchers = [threading.Thread(target=watch, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for w in watchers:
        w.start()
    deadline = time.monotonic() + 120
    try:
        for w in watchers:
            w.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    for index in range(3):
        assert f"shard {index} of 3: scraping {expected[index]} of 30 targets" in found.get(index, ""), found
