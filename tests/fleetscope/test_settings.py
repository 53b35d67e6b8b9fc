"""Settings: file + environment, and one clear line for every kind of bad config."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.cost import ReferencePrice, TokenWeights
from fleetscope.settings import SettingsError, env_var_for, load_settings

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fleetscope.yaml"
    path.write_text(body)
    return path


def test_shipped_example_config_is_valid() -> None:
    settings = load_settings(ROOT / "fleetscope.yaml", environ={})
    assert settings.clickhouse.url.startswith("chdb:")
    assert settings.metadata.url.startswith("sqlite:///")


def test_defaults_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(environ={})
    assert settings.clickhouse.url == "chdb:data/clickhouse"
    assert settings.clickhouse.cluster is None


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "clickhouse:\n  url: chdb:a\n  connect_timeout_s: 3\n")
    settings = load_settings(
        path,
        environ={
            "FLEETSCOPE_CLICKHOUSE_URL": "http://ch.example:8123/fleet",
            "FLEETSCOPE_CLICKHOUSE_CONNECT_TIMEOUT_S": "7.5",
            "FLEETSCOPE_METADATA_URL": "postgresql://u@db:5432/meta",
            "FLEETSCOPE_LOG_LEVEL": "debug",
        },
    )
    assert settings.clickhouse.url == "http://ch.example:8123/fleet"
    assert settings.clickhouse.connect_timeout_s == 7.5
    # the bare postgresql:// scheme is routed to the psycopg 3 driver that ships
    assert settings.metadata.url == "postgresql+psycopg://u@db:5432/meta"
    assert settings.log_level == "DEBUG"


def test_every_key_has_an_env_name() -> None:
    assert env_var_for(("clickhouse", "url")) == "FLEETSCOPE_CLICKHOUSE_URL"
    assert env_var_for(("metadata", "url")) == "FLEETSCOPE_METADATA_URL"


def one_line_error(path: Path | None, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ=environ or {})
    message = str(info.value)
    assert "\n" not in message
    return message


def test_wrong_type_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "log_level: INFO\nclickhouse:\n  url: chdb:x\n  connect_timeout_s: soon\n")
    message = one_line_error(path)
    assert f"{path}:4" in message
    assert "clickhouse.connect_timeout_s" in message
    assert "'soon'" in message


def test_unknown_key_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "clickhouse:\n  ulr: chdb:x\n")
    message = one_line_error(path)
    assert f"{path}:2" in message
    assert "clickhouse.ulr: unknown key" in message
    assert "did you mean 'url'" in message


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = one_line_error(write(tmp_path, "clikhouse:\n  url: chdb:x\n"))
    assert "clikhouse: unknown key" in message and "'clickhouse'" in message


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    message = one_line_error(missing)
    assert message == f"config file not found: {missing}"


def test_config_env_var_names_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "other.yaml"
    message = one_line_error(None, {"FLEETSCOPE_CONFIG": str(missing)})
    assert str(missing) in message


def test_bad_url_scheme(tmp_path: Path) -> None:
    message = one_line_error(write(tmp_path, "clickhouse:\n  url: mysql://x\n"))
    assert "clickhouse.url" in message and "chdb:" in message


def test_bad_env_value_names_the_variable(tmp_path: Path) -> None:
    message = one_line_error(write(tmp_path, ""), {"FLEETSCOPE_CLICKHOUSE_QUERY_TIMEOUT_S": "-1"})
    assert message.startswith("environment FLEETSCOPE_CLICKHOUSE_QUERY_TIMEOUT_S: clickhouse.query_timeout_s")


def test_unknown_env_variable_is_refused(tmp_path: Path) -> None:
    message = one_line_error(write(tmp_path, ""), {"FLEETSCOPE_CLICKHOUSE_ULR": "chdb:x"})
    assert "FLEETSCOPE_CLICKHOUSE_ULR" in message and "FLEETSCOPE_CLICKHOUSE_URL" in message


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "clickhouse:\n  url: chdb:x\n   cluster: [\n")
    message = one_line_error(path)
    assert message.startswith(f"{path}:") and "invalid YAML" in message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    assert "mapping" in one_line_error(write(tmp_path, "- a\n- b\n"))


def test_several_problems_are_counted(tmp_path: Path) -> None:
    message = one_line_error(write(tmp_path, "clickhouse:\n  ulr: x\nmetadata:\n  url: ftp://x\n"))
    assert "(and 1 more problem)" in message


def test_cost_weights_and_reference_prices(tmp_path: Path) -> None:
    shipped = load_settings(ROOT / "fleetscope.yaml", environ={}).cost
    assert shipped.weights() == TokenWeights(input=1.0, cached=0.25, output=4.0)
    assert [r.name for r in shipped.references()][:1] == ["gpt-4o-mini (list, 2025)"]
    path = write(tmp_path, "cost:\n  output_weight: 3\n  reference_prices:\n    - {name: mine, input: 1, output: 2}\n")
    cost = load_settings(path, environ={"FLEETSCOPE_COST_CACHED_WEIGHT": "0.1"}).cost
    assert cost.weights() == TokenWeights(input=1.0, cached=0.1, output=3.0)
    assert cost.references() == [ReferencePrice("mine", 1.0, 2.0, None)]
    bad = write(tmp_path, "cost:\n  input_weight: 0\n  output_weight: 0\n")
    assert "input_weight + output_weight must be > 0" in one_line_error(bad)


def test_oidc_needs_an_allow_list_that_matches_addresses_and_domains(tmp_path: Path) -> None:
    message = one_line_error(write(tmp_path, "dashboard:\n  oidc: true\n"))
    assert "allowed_emails" in message
    path = write(tmp_path, 'dashboard:\n  oidc: true\n  allowed_emails: ["sre@acme.io", "@example.com"]\n')
    dash = load_settings(path, environ={}).dashboard
    assert dash.protected
    assert dash.allows("SRE@acme.io") and dash.allows("ana@example.com")
    assert not dash.allows("ana@acme.io") and not dash.allows("eve@example.com.evil") and not dash.allows(None)
