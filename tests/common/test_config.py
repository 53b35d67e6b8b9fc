"""common.config: a YAML file with FLEETSCOPE_* overrides -> a validated, frozen model, or one
``ConfigError`` line that names the file and line (or the variable), the key and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, ValidationError

from common.config import CONFIG_ENV, ConfigError, Section, config_path, env_var_for, load_config


class Store(Section):
    url: str = "chdb:data"
    timeout_s: float = Field(default=5.0, gt=0)


class Limits(Section):
    models: list[str] = Field(default_factory=list)


class Settings(Section):
    store: Store = Store()
    limits: Limits = Limits()
    name: str = "fleet"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleetscope.yaml"
    path.write_text(text)
    return path


def test_the_environment_overrides_the_file_key_by_key(tmp_path: Path) -> None:
    path = write(tmp_path, "store:\n  url: chdb:from-file\n  timeout_s: 2\nname: a\n")
    got = load_config(Settings, path, environ={"FLEETSCOPE_STORE_URL": "chdb:from-env"})
    assert (got.store.url, got.store.timeout_s, got.name) == ("chdb:from-env", 2.0, "a")
    assert env_var_for(("store", "timeout_s")) == "FLEETSCOPE_STORE_TIMEOUT_S"


def test_a_list_is_given_in_the_environment_as_flow_yaml(tmp_path: Path) -> None:
    got = load_config(Settings, write(tmp_path, ""), environ={"FLEETSCOPE_LIMITS_MODELS": "[a, b]"})
    assert got.limits.models == ["a", "b"]
    with pytest.raises(ConfigError, match=r"^environment: FLEETSCOPE_LIMITS_MODELS is not valid YAML/JSON"):
        load_config(Settings, write(tmp_path, ""), environ={"FLEETSCOPE_LIMITS_MODELS": "[a, b"})


def test_a_bad_value_in_the_file_names_the_file_line_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, "name: a\nstore:\n  url: chdb:x\n  timeout_s: -1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(Settings, path, environ={})
    message = str(caught.value)
    assert message.startswith(f"{path}:4: store.timeout_s: ") and "greater than 0" in message
    assert "\n" not in message


def test_a_bad_value_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^environment FLEETSCOPE_STORE_TIMEOUT_S: store.timeout_s: "):
        load_config(Settings, write(tmp_path, ""), environ={"FLEETSCOPE_STORE_TIMEOUT_S": "soon"})


def test_a_misspelt_key_or_variable_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, "store:\n  ulr: chdb:x\n")
    with pytest.raises(ConfigError, match=r":2: store.ulr: unknown key \(did you mean 'url'\?\); known keys here: url"):
        load_config(Settings, path, environ={})
    with pytest.raises(
        ConfigError, match=r"FLEETSCOPE_STORE_ULR is not a fleetscope setting \(did you mean FLEETSCOPE_STORE_URL\?\)"
    ):
        load_config(Settings, write(tmp_path, ""), environ={"FLEETSCOPE_STORE_ULR": "x"})


def test_a_part_of_the_configuration_reads_its_own_keys_only(tmp_path: Path) -> None:
    path = write(tmp_path, "url: chdb:part\nother_component: {x: 1}\n")
    got = load_config(Store, path, environ={"FLEETSCOPE_SOMETHING_ELSE": "1"}, strict=False)
    assert got.url == "chdb:part"


def test_a_missing_or_invalid_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config file not found: .*nowhere.yaml$"):
        load_config(Settings, tmp_path / "nowhere.yaml", environ={})
    with pytest.raises(ConfigError, match=r"^.*fleetscope.yaml:2: invalid YAML: "):
        load_config(Settings, write(tmp_path, "name: a\n  store: [\n"), environ={})


def test_the_file_is_the_one_asked_for_or_the_default_when_there_is_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert config_path(None, environ={}) == (None, False)
    assert config_path(None, environ={CONFIG_ENV: "elsewhere.yaml"}) == (Path("elsewhere.yaml"), True)
    assert config_path("given.yaml", environ={CONFIG_ENV: "elsewhere.yaml"}) == (Path("given.yaml"), True)
    write(tmp_path, "name: here\n")
    assert config_path(None, environ={}) == (Path("fleetscope.yaml"), False)
    assert load_config(Settings, environ={}).name == "here"


def test_a_loaded_section_is_frozen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no fleetscope.yaml here: the defaults and the environment only
    got = load_config(Settings, None, environ={"FLEETSCOPE_NAME": "b"})
    with pytest.raises(ValidationError):
        got.name = "c"  # type: ignore[misc]
