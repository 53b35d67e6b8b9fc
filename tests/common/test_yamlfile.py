"""common.yamlfile: a YAML file -> a model, or one ``FILE:LINE: KEY: PROBLEM`` line."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from common.yamlfile import YamlConfigError, line_map, load_model, read_yaml


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    threshold: float


class Rules(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: list[Rule]


def test_a_bad_item_of_a_list_names_its_line_and_index(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - name: a\n    threshold: 1\n  - name: b\n    threshold: high\n")
    with pytest.raises(YamlConfigError) as caught:
        load_model(path, Rules, "rule file")
    assert str(caught.value).startswith(f"{path}:5: rules.1.threshold: ")
    assert "(got 'high')" in str(caught.value)
    assert isinstance(caught.value, ValueError)  # callers catch it as one


def test_two_problems_are_one_line_that_counts_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - name: a\n  - threshold: 2\n")
    message = str(pytest.raises(YamlConfigError, load_model, path, Rules).value)
    assert message.startswith(f"{path}:2: rules.0.threshold: ") and message.endswith("(and 1 more problem)")


def test_a_file_that_is_not_a_mapping_or_not_there_says_so(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(YamlConfigError, match="the top level must be a mapping of keys, got list"):
        read_yaml(path)
    with pytest.raises(YamlConfigError, match=r"^scenario not found: .*missing.yaml$"):
        read_yaml(tmp_path / "missing.yaml", "scenario")


def test_an_empty_file_is_an_empty_mapping(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing yet\n")
    assert read_yaml(path) == ({}, {})


def test_every_key_path_has_its_line() -> None:
    import yaml

    lines = line_map(yaml.compose("a:\n  b: 1\n  c:\n    - x\n    - y\n"))
    assert lines == {("a",): 1, ("a", "b"): 2, ("a", "c"): 3, ("a", "c", "0"): 4, ("a", "c", "1"): 5}
