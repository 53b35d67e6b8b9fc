"""YAML file -> validated pydantic model, with one-line errors that name file:line and key.

In:  a path (or text) and a pydantic model class.
Out: the validated model, or ``YamlConfigError`` whose message is a single line
     ``FILE:LINE: KEY: PROBLEM``. Used for the fleet spec and scenarios, alert rule files, and by
     ``fleetscope.settings`` for the main configuration.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from common.errors import YamlConfigError

__all__ = ["YamlConfigError", "describe_validation_error", "line_map", "load_model", "read_yaml"]

M = TypeVar("M", bound=BaseModel)


def line_map(node: yaml.Node | None, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Map each key path (list items by index) in a composed YAML document to its line."""
    lines: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (str(key_node.value),)
            lines[path] = key_node.start_mark.line + 1
            lines.update(line_map(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = prefix + (str(index),)
            lines[path] = item.start_mark.line + 1
            lines.update(line_map(item, path))
    return lines


def read_yaml(path: Path, what: str = "config file") -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Read a YAML mapping and its key lines; missing/unreadable/invalid files are one line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlConfigError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise YamlConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlConfigError(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise YamlConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data, line_map(node)


def _model_at(model: type[BaseModel], path: tuple[str, ...]) -> type[BaseModel] | None:
    from typing import get_args

    current: type[BaseModel] | None = model
    for part in path:
        if current is None:
            return None
        field = current.model_fields.get(part)
        if field is None:
            if part.isdigit():  # list index: stay on the item model chosen below
                continue
            return None
        candidates = [field.annotation, *get_args(field.annotation)]
        for arg in list(candidates):
            candidates.extend(get_args(arg))
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return current


def describe_validation_error(
    exc: ValidationError,
    model: type[BaseModel],
    source: str | None,
    lines: dict[tuple[str, ...], int],
    env_names: dict[tuple[str, ...], str] | None = None,
) -> str:
    """One line for the first problem: ``WHERE: key.path: problem (and N more)``."""
    errors = exc.errors()
    first = errors[0]
    path = tuple(str(part) for part in first["loc"] if not str(part).startswith("function-"))
    key = ".".join(path) or "(top level)"
    if first["type"] == "extra_forbidden":
        parent = _model_at(model, path[:-1])
        known = list(parent.model_fields) if parent else []
        hint = difflib.get_close_matches(path[-1], known, n=1)
        problem = "unknown key" + (f" (did you mean {hint[0]!r}?)" if hint else "")
        if known:
            problem += f"; known keys here: {', '.join(known)}"
    else:
        problem = first["msg"].removeprefix("Value error, ")
        if first["type"] != "value_error" and "input" in first and not isinstance(first["input"], dict | list):
            problem += f" (got {first['input']!r})"
    if env_names and path in env_names:
        where = f"environment {env_names[path]}"
    elif source is not None:
        line = next((lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in lines), None)
        where = f"{source}:{line}" if line else source
    else:
        where = "settings"
    count = len(errors) - 1
    more = f" (and {count} more problem{'s' if count > 1 else ''})" if count else ""
    return f"{where}: {key}: {problem}{more}"


def load_model(path: Path, model: type[M], what: str = "config file") -> M:
    """Read ``path`` and validate it as ``model``; raise ``YamlConfigError`` on any problem."""
    data, lines = read_yaml(path, what)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise YamlConfigError(describe_validation_error(exc, model, str(path), lines)) from None
