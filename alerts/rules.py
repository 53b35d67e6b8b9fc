"""Rule files: YAML -> validated rule groups, with ``FILE:LINE: key: problem`` errors.

In:  a rules file (or the built-in pack, ``alerts/packs/builtin.yaml``)::

        groups:
          - name: capacity
            interval: 15s
            rules:
              - name: KVCacheSaturated
                expr: kv_cache_usage_max{window="1m"}     # a built-in signal with parameters
                op: ">="
                threshold: 0.9
                for: 5m
                keep_firing_for: 1m
                labels: {severity: page, team: inference}
                annotations:
                  summary: "KV cache of {{ $labels.replica }} at {{ $value | percent }}"
                no_data: OK            # NoData | OK | KeepLast | Error
                error: Error           # Error | OK | KeepLast

     ``expr`` is either a built-in signal (``alerts.signals.SIGNALS``) or a ClickHouse
     ``SELECT`` returning a numeric ``value`` column and label columns.
Out: ``RuleGroup`` / ``Rule`` objects, with durations as seconds, the parsed expression and
     the templates checked; ``render`` fills annotation templates.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from alerts.expr import Expr, parse_expr
from common.durations import Duration, parse_duration
from common.yamlfile import YamlConfigError, describe_validation_error, read_yaml

__all__ = ["OPS", "Duration", "Rule", "RuleFile", "RuleGroup", "load_rules", "parse_duration", "render"]

PACK = Path(__file__).resolve().parent / "packs" / "builtin.yaml"
OPS = {
    ">": float.__gt__,
    ">=": float.__ge__,
    "<": float.__lt__,
    "<=": float.__le__,
    "==": float.__eq__,
    "!=": float.__ne__,
}
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEMPLATE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_FIELD = re.compile(
    r"^\$(value|labels\.([A-Za-z_][A-Za-z0-9_]*)|labels|extra\.([A-Za-z_][A-Za-z0-9_]*))"
    r"(?:\s*\|\s*(percent|humanize|seconds|round))?$"
)


def _check_template(text: str) -> str:
    for inner in _TEMPLATE.findall(text):
        if not _FIELD.match(inner):
            raise ValueError(
                f"unknown template field {{{{ {inner} }}}}: use {{{{ $value }}}}, {{{{ $labels.NAME }}}}, "
                "{{ $extra.NAME }} (what a signal says about its value, e.g. coverage), "
                "optionally with | percent, | humanize, | seconds or | round"
            )
    return text


def _format(value: float | None, how: str | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if how == "percent":
        return f"{value:.0%}"
    if how == "seconds":
        return f"{value:.3g} s" if value < 60 else f"{value / 60:.1f} min"
    if how == "round":
        return f"{value:.0f}"
    if how == "humanize" or how is None:
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.4g}"
    return str(value)


def render(text: str, labels: dict[str, str], value: float | None, extra: dict[str, float] | None = None) -> str:
    """Fill ``{{ $value }}``, ``{{ $labels.NAME }}``, ``{{ $extra.NAME }}`` (what the signal says
    about the value; "n/a" when it says nothing) and ``| percent`` etc. in ``text``."""

    def one(m: re.Match[str]) -> str:
        f = _FIELD.match(m.group(1).strip())
        if f is None:
            return m.group(0)
        how = f.group(4)
        if f.group(1) == "value":
            return _format(value, how)
        if f.group(1) == "labels":
            return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
        if f.group(3) is not None:
            return _format((extra or {}).get(f.group(3)), how)
        raw = labels.get(f.group(2), "")
        if how:
            try:
                return _format(float(raw), how)
            except ValueError:
                return raw
        return raw

    return _TEMPLATE.sub(one, text)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(min_length=1, max_length=200)
    expr: str = Field(min_length=1)
    op: Literal[">", ">=", "<", "<=", "==", "!="] = ">"
    threshold: float = 0.0
    for_s: Duration = Field(default=0.0, alias="for")
    keep_firing_for_s: Duration = Field(default=0.0, alias="keep_firing_for")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    no_data: Literal["NoData", "OK", "KeepLast", "Error"] = "NoData"
    error: Literal["Error", "OK", "KeepLast"] = "Error"
    parsed: Expr | None = Field(default=None, exclude=True)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_:.-]*$", v):
            raise ValueError(f"rule name {v!r}: use letters, digits, _ : . - (no spaces)")
        return v

    @field_validator("threshold", mode="before")
    @classmethod
    def _threshold(cls, v: object) -> object:
        if isinstance(v, str) and v.strip().endswith("%"):
            return float(v.strip()[:-1]) / 100
        return v

    @field_validator("labels", "annotations", mode="before")
    @classmethod
    def _strings(cls, v: object) -> object:
        if isinstance(v, dict):
            return {str(k): ("" if x is None else str(x)) for k, x in v.items()}
        return v

    @field_validator("labels")
    @classmethod
    def _label_names(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _LABEL.match(key):
                raise ValueError(f"label name {key!r}: use letters, digits and _ (not starting with a digit)")
        if "alertname" in v:
            raise ValueError("labels: alertname is the rule's name; do not set it")
        return v

    @field_validator("annotations")
    @classmethod
    def _templates(cls, v: dict[str, str]) -> dict[str, str]:
        for text in v.values():
            _check_template(text)
        return v

    @model_validator(mode="after")
    def _parse(self) -> Rule:
        object.__setattr__(self, "parsed", parse_expr(self.expr))
        return self

    def holds(self, value: float) -> bool:
        return not math.isnan(value) and OPS[self.op](float(value), float(self.threshold))

    def condition(self) -> str:
        return f"{self.op} {self.threshold:g}"


class RuleGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=200)
    interval_s: Duration = Field(default=15.0, alias="interval")
    rules: list[Rule] = Field(min_length=1)

    @field_validator("interval_s")
    @classmethod
    def _interval(cls, seconds: float) -> float:
        if seconds < 1:
            raise ValueError("interval must be at least 1s")
        return seconds

    @model_validator(mode="after")
    def _unique(self) -> RuleGroup:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"rule {rule.name!r} appears twice in group {self.name!r}")
            seen.add(rule.name)
        return self


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: list[RuleGroup] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> RuleFile:
        seen: set[str] = set()
        for group in self.groups:
            if group.name in seen:
                raise ValueError(f"group {group.name!r} appears twice")
            seen.add(group.name)
        return self


def load_rules(path: Path) -> RuleFile:
    """Read and validate a rules file; any problem is one ``YamlConfigError`` line."""
    data, lines = read_yaml(Path(path), "rules file")
    try:
        return RuleFile.model_validate(data)
    except ValidationError as exc:
        raise YamlConfigError(describe_validation_error(exc, RuleFile, str(path), lines)) from None


def merge(files: list[RuleFile]) -> list[RuleGroup]:
    """The groups of several files; a group name may appear once across them."""
    groups: list[RuleGroup] = []
    seen: set[str] = set()
    for f in files:
        for g in f.groups:
            if g.name in seen:
                raise YamlConfigError(f"rule group {g.name!r} is defined in more than one rules file")
            seen.add(g.name)
            groups.append(g)
    return groups
