"""Configuration loading: a YAML file + ``FLEETSCOPE_*`` environment -> a validated model.

In:  a pydantic model (the components' own sections, composed by ``fleetscope.settings``, or a
     part of them), a YAML file (``--config``, ``$FLEETSCOPE_CONFIG`` or ``./fleetscope.yaml``)
     and the process environment. Every leaf key has an override named after its path:
     ``clickhouse.url`` -> ``FLEETSCOPE_CLICKHOUSE_URL``. The environment wins over the file.
Out: the frozen model, or one ``ConfigError`` whose message is a single line naming the
     file/line or variable, the key, and the problem. ``Section`` is the base of every config
     section (unknown keys refused, frozen).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from common.errors import ConfigError
from common.yamlfile import YamlConfigError, describe_validation_error, read_yaml

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG_NAME",
    "ENV_PREFIX",
    "ConfigError",
    "Section",
    "config_path",
    "env_var_for",
    "load_config",
]

ENV_PREFIX = "FLEETSCOPE_"
CONFIG_ENV = "FLEETSCOPE_CONFIG"
DEFAULT_CONFIG_NAME = "fleetscope.yaml"
# FLEETSCOPE_* variables that are not settings keys
NON_SETTING_ENV = frozenset({CONFIG_ENV, "FLEETSCOPE_TEST_POSTGRES_URL"})

M = TypeVar("M", bound=BaseModel)


class Section(BaseModel):
    """A config section: unknown keys are refused (a typo is noticed), values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def env_var_for(path: tuple[str, ...]) -> str:
    """The environment variable that overrides a settings key path."""
    return ENV_PREFIX + "_".join(part.upper() for part in path)


def _leaf_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _leaf_paths(annotation, (*prefix, name))
        else:
            yield (*prefix, name)


def _apply_env(
    data: dict[str, Any], environ: Mapping[str, str], model: type[BaseModel], strict: bool
) -> dict[tuple[str, ...], str]:
    """Overlay FLEETSCOPE_* variables onto ``data``; return path -> variable name used. An unknown
    variable is an error when ``strict`` (a model that reads only a part skips the others)."""
    known = {env_var_for(path): path for path in _leaf_paths(model)}
    used: dict[tuple[str, ...], str] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in NON_SETTING_ENV:
            continue
        path = known.get(name)
        if path is None:
            if not strict:
                continue
            hint = difflib.get_close_matches(name, known, n=1)
            suggestion = f" (did you mean {hint[0]}?)" if hint else ""
            raise ConfigError(f"environment: {name} is not a fleetscope setting{suggestion}")
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        value: Any = None if raw == "" else raw
        if raw[:1] in ("[", "{"):  # lists and mappings as YAML/JSON flow text
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError:
                raise ConfigError(f"environment: {name} is not valid YAML/JSON: {raw[:80]!r}") from None
        node[path[-1]] = value
        used[path] = name
    return used


def config_path(
    explicit: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Path | None, bool]:
    """Which file to read, and whether the user asked for it (then it must exist)."""
    environ = os.environ if environ is None else environ
    if explicit:
        return Path(explicit), True
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV]), True
    default = Path(DEFAULT_CONFIG_NAME)
    return (default, False) if default.exists() else (None, False)


def load_config(
    model: type[M],
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    strict: bool = True,
) -> M:
    """Read, overlay and validate the configuration as ``model``. Raises ``ConfigError``.
    ``strict=False``: ``model`` is a part of the configuration (it ignores the rest of the file,
    and the variables of other keys)."""
    environ = os.environ if environ is None else environ
    source, _ = config_path(path, environ)
    data: dict[str, Any] = {}
    lines: dict[tuple[str, ...], int] = {}
    if source is not None:
        try:
            data, lines = read_yaml(source)
        except YamlConfigError as exc:
            raise ConfigError(str(exc)) from None
    if not strict:
        data = {key: value for key, value in data.items() if key in model.model_fields}
    from_env = _apply_env(data, environ, model, strict)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            describe_validation_error(exc, model, str(source) if source else None, lines, from_env)
        ) from None
