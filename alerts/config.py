"""The ``alerts`` section of ``fleetscope.yaml``: rule files, receivers, routes, inhibition.

In:  the YAML mapping under ``alerts:`` (validated with the rest of the settings).
Out: ``AlertsSettings`` with ``Route`` (which receiver gets which alerts, grouped how and how
     often, Alertmanager's ``group_by`` / ``group_wait`` / ``group_interval`` /
     ``repeat_interval``) and ``InhibitRule`` (a firing source alert mutes matching targets
     that share the ``equal`` labels). Durations are seconds.

An ``alertmanager`` receiver is not routed: every alert goes to it, and Alertmanager routes,
groups and repeats (``alerts.alertmanager``); a route naming one is refused.

Without receivers the evaluator still evaluates and records state and history; notifications
have nowhere to go, and ``fleetscope alerts run`` says so at start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alerts.model import Matcher, parse_matchers
from alerts.receivers import ReceiverConfig
from common.durations import Duration

if TYPE_CHECKING:
    from alerts.rules import RuleGroup

__all__ = ["AlertsSettings", "InhibitRule", "Route", "rule_groups"]


def _matchers(value: object) -> list[Matcher]:
    if value is None:
        return []
    if isinstance(value, str):
        return parse_matchers(value)
    if isinstance(value, list):
        out: list[Matcher] = []
        for item in value:
            out.extend([item] if isinstance(item, Matcher) else parse_matchers(str(item)))
        return out
    raise ValueError('write matchers as a list of strings such as ["severity=page", "model=~\\"tiny-.*\\""]')


class Route(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    receiver: str = Field(min_length=1)
    matchers: list[Matcher] = Field(default_factory=list, description="alerts this route takes (all must match)")
    group_by: list[str] = Field(
        default_factory=lambda: ["alertname"], description="labels that make a group; ['...'] groups by every label"
    )
    group_wait_s: Duration = Field(default=30.0, alias="group_wait")
    group_interval_s: Duration = Field(default=300.0, alias="group_interval")
    repeat_interval_s: Duration = Field(default=4 * 3600.0, alias="repeat_interval")
    continue_: bool = Field(default=False, alias="continue", description="also try the routes after this one")

    _m = field_validator("matchers", mode="before")(classmethod(lambda cls, v: _matchers(v)))

    def takes(self, labels: dict[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def group_labels(self, labels: dict[str, str]) -> dict[str, str]:
        if self.group_by == ["..."]:
            return dict(labels)
        return {k: labels[k] for k in self.group_by if k in labels}


class InhibitRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source_matchers: list[Matcher] = Field(min_length=1)
    target_matchers: list[Matcher] = Field(min_length=1)
    equal: list[str] = Field(default_factory=list)

    _m = field_validator("source_matchers", "target_matchers", mode="before")(classmethod(lambda cls, v: _matchers(v)))

    def mutes(self, target: dict[str, str], firing: list[dict[str, str]]) -> bool:
        if not all(m.matches(target) for m in self.target_matchers):
            return False
        for source in firing:
            if source is target or source == target:
                continue
            if all(m.matches(source) for m in self.source_matchers) and all(
                source.get(k, "") == target.get(k, "") for k in self.equal
            ):
                return True
        return False


def _default_inhibit() -> list[InhibitRule]:
    # a replica that is down explains its latency, cache and queue alerts: page once, for the cause
    return [
        InhibitRule(
            source_matchers=parse_matchers('alertname="ReplicaDown"'),
            target_matchers=parse_matchers('alertname!="ReplicaDown"'),
            equal=["replica"],
        )
    ]


class AlertsSettings(BaseModel):
    """Alert rules and where their notifications go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    builtin_rules: bool = Field(default=True, description="evaluate the shipped rule pack (alerts/packs/builtin.yaml)")
    rule_files: list[Path] = Field(
        default_factory=list, description="more rule files (YAML, `fleetscope alerts check`)"
    )
    receivers: list[ReceiverConfig] = Field(default_factory=list)
    route: Route | None = Field(
        default=None, description="the default route (default: every alert to the first receiver)"
    )
    routes: list[Route] = Field(default_factory=list, description="routes tried before the default, first match wins")
    inhibit_rules: list[InhibitRule] = Field(default_factory=_default_inhibit)
    external_url: str = Field(
        default="http://127.0.0.1:8501", description="the dashboard's address, for links in notifications"
    )
    delivery_poll_s: float = Field(default=1.0, gt=0, description="how often the outbox is looked at")

    @model_validator(mode="after")
    def _receivers_known(self) -> AlertsSettings:
        names = [r.name for r in self.receivers]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"receiver {min(dup)!r} is defined twice")
        pushed = {r.name for r in self.receivers if r.type == "alertmanager"}
        for route in [*self.routes, *([self.route] if self.route else [])]:
            if route.receiver not in names:
                raise ValueError(
                    f"route to receiver {route.receiver!r}, which is not defined"
                    + (f" (receivers: {', '.join(names)})" if names else " (no receivers are defined)")
                )
            if route.receiver in pushed:
                raise ValueError(
                    f"route to receiver {route.receiver!r}, an alertmanager receiver: it gets every alert, and "
                    "Alertmanager routes and groups them (its alertmanager.yml); remove this route"
                )
        return self

    def default_route(self) -> Route | None:
        """The route of alerts no other route takes: ``route``, else the first receiver that is not an
        Alertmanager (those get every alert without a route)."""
        if self.route is not None:
            return self.route
        routed = [r.name for r in self.receivers if r.type != "alertmanager"]
        return Route(receiver=routed[0]) if routed else None

    def routes_for(self, labels: dict[str, str]) -> list[Route]:
        """The routes an alert goes to (Alertmanager's first match, or more with ``continue``)."""
        out: list[Route] = []
        for route in self.routes:
            if route.takes(labels):
                out.append(route)
                if not route.continue_:
                    return out
        default = self.default_route()
        if default is not None and not out:
            out.append(default)
        return out


def rule_groups(settings: AlertsSettings) -> list[RuleGroup]:
    """The rule groups to evaluate: the built-in pack (unless turned off) and ``rule_files``."""
    from alerts.rules import PACK, load_rules, merge

    files = ([load_rules(PACK)] if settings.builtin_rules else []) + [load_rules(p) for p in settings.rule_files]
    return merge(files)
