"""Fleet spec validation: every bad spec is one line naming file:line and key, before anything starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from common.yamlfile import YamlConfigError
from fleet.spec import check_ready, load_spec

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
models:
  tiny-small: {path: models/small, generate: small}
replicas:
  - name: small-0
    model: tiny-small
    port: 18101
    engine_args: {max_model_len: 2048, enforce_eager: true, disable_log_stats: false}
  - name: small-1
    model: tiny-small
    port: 18102
"""


def spec_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(body)
    return path


def error(tmp_path: Path, body: str) -> str:
    with pytest.raises(YamlConfigError) as info:
        load_spec(spec_file(tmp_path, body), base_dir=tmp_path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_shipped_fleet_has_two_small_and_one_large_replica() -> None:
    spec = load_spec(ROOT / "fleet.yaml", base_dir=ROOT)
    assert sorted(r.model for r in spec.replicas) == ["tiny-large", "tiny-small", "tiny-small"]
    assert all(r.engine == "vllm" for r in spec.replicas)
    assert spec.models["tiny-small"].path == ROOT / "data" / "models" / "tiny-small"


def test_engine_args_become_vllm_flags(tmp_path: Path) -> None:
    spec = load_spec(spec_file(tmp_path, GOOD), base_dir=tmp_path)
    assert spec.replicas[0].engine_flags() == ["--max-model-len", "2048", "--enforce-eager"]
    assert spec.models["tiny-small"].path == tmp_path / "models" / "small"


def test_non_integer_gpu_count_names_line_and_key(tmp_path: Path) -> None:
    body = GOOD.replace("    port: 18102\n", "    port: 18102\n    gpu_count: two\n")
    message = error(tmp_path, body)
    assert ":11: replicas.1.gpu_count:" in message and "'two'" in message


def test_duplicate_port_is_refused(tmp_path: Path) -> None:
    message = error(tmp_path, GOOD.replace("18102", "18101"))
    assert "port 18101 is used by 'small-0' and 'small-1'" in message


def test_unknown_model_reference(tmp_path: Path) -> None:
    message = error(
        tmp_path, GOOD.replace("    model: tiny-small\n    port: 18102", "    model: tiny-huge\n    port: 18102")
    )
    assert "serves model 'tiny-huge', which is not in models (tiny-small)" in message


def test_unknown_key_in_a_replica(tmp_path: Path) -> None:
    message = error(tmp_path, GOOD.replace("    port: 18102\n", "    port: 18102\n    gpus: 2\n"))
    assert "replicas.1.gpus: unknown key" in message and "gpu_count" in message


def test_reserved_engine_arg(tmp_path: Path) -> None:
    message = error(tmp_path, GOOD.replace("enforce_eager: true", "port: 9000"))
    assert "'port' is set by fleetscope" in message


def test_missing_model_dir_without_generate_is_refused(tmp_path: Path) -> None:
    spec = load_spec(spec_file(tmp_path, GOOD.replace(", generate: small", "")), base_dir=tmp_path)
    with pytest.raises(YamlConfigError, match=r"directory .*models/small does not exist; generate one with"):
        check_ready(spec)


def test_taken_port_is_refused_before_start(tmp_path: Path) -> None:
    spec = load_spec(spec_file(tmp_path, GOOD), base_dir=tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 18102))
        holder.listen()
        with pytest.raises(YamlConfigError, match="replica 'small-1': port 18102 on 127.0.0.1 is already in use"):
            check_ready(spec)


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(YamlConfigError, match="fleet spec not found"):
        load_spec(tmp_path / "nope.yaml")


def test_slo_targets_in_the_spec_reach_the_metadata_db_once_and_never_overwrite(
    tmp_path: Path, metadata_url: str
) -> None:
    from fleetscope.slo_ledger import seed_slos
    from storage.catalog import SloTarget, set_slo, slo_targets
    from tests.conftest import migrated_sessions

    spec = load_spec(
        spec_file(tmp_path, GOOD.replace("generate: small}", "generate: small, slo: {ttft: 3.0, itl: 0.5}}")),
        base_dir=tmp_path,
    )
    for sessions in migrated_sessions(metadata_url):
        set_slo(sessions, SloTarget("tiny-small", "itl", 0.2))  # set by hand before the first `up`
        assert seed_slos(spec, sessions) == ["tiny-small ttft p99 <= 3s"]
        assert {(t.metric, t.threshold_seconds) for t in slo_targets(sessions)} == {("ttft", 3.0), ("itl", 0.2)}
        assert seed_slos(spec, sessions) == []  # the next start adds nothing


def test_a_non_positive_slo_target_is_refused(tmp_path: Path) -> None:
    message = error(tmp_path, GOOD.replace("generate: small}", "generate: small, slo: {ttft: 0}}"))
    assert "fleet.yaml:2" in message and "ttft target must be a positive number of seconds" in message
    unknown = error(tmp_path, GOOD.replace("generate: small}", "generate: small, slo: {ttfb: 2}}"))
    assert "models.tiny-small.slo" in unknown and "'ttft', 'itl', 'tpot' or 'e2e' (got 'ttfb')" in unknown
