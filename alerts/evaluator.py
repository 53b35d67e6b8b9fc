"""The evaluator: rule groups on a schedule -> states, history and notifications.

In:  rule groups (``alerts.rules``), a ``reading.Context`` (ClickHouse client, metadata
     sessions), the ``alerts`` settings (receivers, routes), and the evaluation time.
Out: per evaluation of a group: the instances' new states saved in the metadata DB
     (``alert_states``), their state changes appended to ClickHouse (``alert_events``), and
     the notifications due put in the outbox (``alerts.notify``). ``Evaluator.start`` runs
     every group on APScheduler (one interval job per group: a run that is late is run once,
     not once per missed interval, and a group never overlaps itself) and the deliverer
     (``alerts.delivery``) in a thread; ``stop`` ends both.

State is reloaded from the metadata DB when an ``Evaluator`` is made, so a restart continues
a pending ``for`` where it was, and a firing alert already notified is not notified again.
A running evaluator evaluates and delivers only while it holds the ``alerts`` lease
(``storage.leases``): start several, one works and the others stand by.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from alerts.config import AlertsSettings
from alerts.errors import ExprError, SignalError
from alerts.expr import evaluate, parse_expr
from alerts.model import Alert
from alerts.notify import Notifier, Sent
from alerts.reading import Context
from alerts.rules import Rule, RuleGroup, render
from alerts.state import REASON, Active, Instance, Outcome, Timing, Transition, step
from alerts.store import load_states, prune_states, save_evaluation, save_states, write_events

if TYPE_CHECKING:
    from storage.leases import Bind

__all__ = ["Evaluator", "GroupReport"]

log = logging.getLogger(__name__)

# rule signal -> the latency the Investigate page should open on
_INVESTIGATE = {
    "itl_p99": "itl",
    "cost_per_mtok": "cost",
    "cost_per_mtok_change": "cost",
    "cost_per_mtok_jump": "cost",
    "spend_per_hour_change": "cost",
}
LEASE = "alerts"
MAX_UNWRITTEN_EVENTS = 10_000


@dataclass
class GroupReport:
    group: str
    at: datetime
    seconds: float = 0.0
    rules: int = 0
    firing: int = 0
    pending: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    transitions: list[tuple[str, Transition]] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)


class Evaluator:
    def __init__(self, groups: list[RuleGroup], ctx: Context, sessions: Any, settings: AlertsSettings) -> None:
        names = [r.name for g in groups for r in g.rules]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"rule {min(dup)!r} is defined in more than one group: rule names must be unique")
        self.groups = groups
        self.ctx = ctx
        self.sessions = sessions
        self.settings = settings
        self.notifier = Notifier(sessions, settings, {r.name: g.interval_s for g in groups for r in g.rules})
        longest = max(
            [r.group_interval_s for r in [*settings.routes, *filter(None, [settings.default_route()])]], default=300.0
        )
        self.resolved_keep_s = max(900.0, 2 * longest)  # a resolve is kept until its group was told
        self.rule_names = names
        self.states: dict[str, dict[str, Instance]] = load_states(sessions, names)
        self._lock = threading.Lock()
        self._cycle_at: datetime | None = None
        self._events: list[tuple[str, Transition]] = []  # state changes not yet in ClickHouse
        self._scheduler: Any = None
        self._deliverer: Any = None
        self._delivery_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.last: dict[str, GroupReport] = {}
        from storage.leases import holder_id

        self.holder = holder_id()
        self.lease_ttl_s = max(
            10.0, 3 * min([g.interval_s for g in groups], default=15.0)
        )  # a killed holder's lease lapses after this
        self._held = False
        self._lease_lock = threading.Lock()

    # -- one evaluation -------------------------------------------------------------------------

    def evaluate_group(self, group: RuleGroup, at: datetime | None = None) -> GroupReport:
        at = (at or datetime.now(UTC)).astimezone(UTC)
        began = time.perf_counter()
        report = GroupReport(group.name, at, rules=len(group.rules))
        with self._lock:
            if at != self._cycle_at:  # answers are shared by the groups evaluated at one time
                self.ctx.new_cycle()
                self._cycle_at = at
            changed: dict[str, dict[str, Instance]] = {}
            for rule in group.rules:
                new, moves = self._rule(rule, at, report)
                changed[rule.name] = new
                report.transitions.extend((rule.name, t) for t in moves)
            save_states(self.sessions, changed)  # first: memory follows what was saved
            self.states.update(changed)
            self._events.extend(report.transitions)
            try:
                write_events(self.ctx.client, self._events)
                self._events.clear()
            except Exception as exc:  # noqa: BLE001 - history is secondary to state and paging: kept for the next try
                del self._events[:-MAX_UNWRITTEN_EVENTS]
                log.warning(
                    "could not write %d alert event(s) to ClickHouse (kept for the next evaluation): %s",
                    len(self._events),
                    exc,
                )
            report.sent = self.notifier.dispatch(self.current_alerts(), at)
            for instances in changed.values():
                for inst in instances.values():
                    report.firing += inst.state == "firing"
                    report.pending += inst.state == "pending"
            report.seconds = time.perf_counter() - began
            save_evaluation(self.sessions, group.name, at, report.seconds, report.rules, report.errors)
        self.last[group.name] = report
        return report

    def evaluate_all(self, at: datetime | None = None) -> list[GroupReport]:
        at = at or datetime.now(UTC)
        return [self.evaluate_group(g, at) for g in self.groups]

    def _rule(self, rule: Rule, at: datetime, report: GroupReport) -> tuple[dict[str, Instance], list[Transition]]:
        base = {**rule.labels, "alertname": rule.name}
        try:
            # a validated rule holds its parsed expression; one made without validation is parsed here
            expr = rule.parsed if rule.parsed is not None else parse_expr(rule.expr)
            samples = evaluate(self.ctx, expr, at)
            active = []
            for s in samples:
                if rule.holds(s.value):
                    labels = {**s.labels, **base}
                    notes = {k: render(v, labels, s.value, s.extra) for k, v in rule.annotations.items()}
                    active.append(Active(labels, notes, s.value))
            outcome = Outcome(active, any_data=bool(samples))
        except (SignalError, ExprError) as exc:  # the rule's own error; the group's other rules go on
            report.errors[rule.name] = str(exc)
            log.warning("rule %s: %s", rule.name, exc)
            outcome = Outcome([], error=str(exc))
        timing = Timing(rule.for_s, rule.keep_firing_for_s, self.resolved_keep_s)
        return step(
            timing,
            self.states.get(rule.name, {}),
            outcome,
            at,
            base_labels=base,
            no_data=rule.no_data,
            error=rule.error,
        )

    def current_alerts(self) -> list[Alert]:
        """Every firing alert and every resolved one still kept, as receivers see them."""
        out = []
        rules = {r.name: r for g in self.groups for r in g.rules}
        for name, instances in self.states.items():
            rule = rules.get(name)
            for inst in instances.values():
                if inst.state == "pending":
                    continue
                out.append(
                    Alert(
                        labels=inst.labels,
                        annotations=inst.annotations,
                        status="firing" if inst.state == "firing" else "resolved",
                        starts_at=inst.fired_at or inst.active_at,
                        ends_at=inst.resolved_at if inst.state == "resolved" else None,
                        generator_url=self.link(rule, inst),
                        value=inst.value,
                        fingerprint=inst.fingerprint,
                    )
                )
        return out

    def link(self, rule: Rule | None, inst: Instance) -> str:
        """The dashboard page that explains this alert around when it began: Quality for a quality
        signal's rule (its rates, the explained break, the router audit), else Investigate."""
        base = self.settings.external_url.rstrip("/")
        if not base:
            return ""
        start = inst.active_at - timedelta(hours=1)
        end = (inst.resolved_at or inst.active_at) + timedelta(minutes=30)
        signal = rule.parsed.signal if rule is not None and rule.parsed is not None else None
        page = "quality" if signal in QUALITY_SIGNALS else "investigate"
        query = {"metric": _latency(rule, inst)} if page == "investigate" else {}
        query["from"] = start.strftime("%Y-%m-%dT%H:%M:%SZ")
        query["to"] = end.strftime("%Y-%m-%dT%H:%M:%SZ")
        for key in ("model", "tenant"):  # the alert's own view: a pool, or a tenant (cost rules)
            if inst.labels.get(key) and REASON not in inst.labels:
                query[key] = inst.labels[key]
        return f"{base}/{page}?{urlencode(query)}"

    # -- running --------------------------------------------------------------------------------

    def holding(self) -> bool:
        """Take or renew the ``alerts`` lease (metadata DB): only its holder evaluates and
        delivers, so evaluators on standby (several processes on a ClickHouse server) page once."""
        from storage.leases import acquire

        with self._lease_lock:  # groups run in two threads: the lease changes hands once, states load once
            return self._holding(acquire)

    def _holding(self, acquire: Callable[[Bind, str, str, float], bool]) -> bool:
        try:
            held = acquire(self.sessions.kw["bind"], LEASE, self.holder, self.lease_ttl_s)
        except Exception as exc:  # noqa: BLE001 - the metadata DB is down: nobody can save state either
            log.warning("cannot renew the %s lease: %s", LEASE, exc)
            return False
        if held != self._held:
            log.info(
                "%s the %s lease (%s)", "holding" if held else "standing by: another process holds", LEASE, self.holder
            )
            if held:  # taking over: continue from what the last holder saved, not from this process's start
                with self._lock:
                    self.states = load_states(self.sessions, self.rule_names)
                    prune_states(self.sessions, self.rule_names)
            self._held = held
        return held

    def start(self, *, deliver: bool = True) -> None:
        """Evaluate every group on its interval (APScheduler) and deliver the outbox in a thread."""
        # APScheduler ships no type information
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=2)},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone=UTC,
        )
        for g in self.groups:
            # a run that could not start in time is dropped once the next one is due
            self._scheduler.add_job(
                self._safe,
                "interval",
                seconds=g.interval_s,
                args=[g],
                id=f"group:{g.name}",
                name=g.name,
                misfire_grace_time=max(1, int(g.interval_s)),
                next_run_time=datetime.now(UTC),
            )
        self._scheduler.start()
        if deliver and self.settings.receivers:
            from alerts.delivery import Deliverer

            self._deliverer = Deliverer(self.sessions, {r.name: r for r in self.settings.receivers})
            self._delivery_thread = threading.Thread(target=self._deliver, name="alerts-delivery", daemon=True)
            self._delivery_thread.start()

    def _deliver(self) -> None:
        while not self._stop.is_set():
            if self.holding():
                try:
                    self._deliverer.run_once()
                except Exception:
                    log.warning("notification delivery pass failed; trying again", exc_info=True)
            self._stop.wait(self.settings.delivery_poll_s)

    def _safe(self, group: RuleGroup) -> None:
        if not self.holding():
            return
        try:
            report = self.evaluate_group(group, aligned(datetime.now(UTC), group.interval_s))
        except Exception:
            log.exception("evaluating rule group %s failed", group.name)
            return
        for rule, t in report.transitions:
            log.info("%s %s: %s -> %s", rule, _short(t.labels), t.before, t.after)

    def stop(self) -> None:
        self._stop.set()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if self._delivery_thread is not None:
            self._delivery_thread.join(timeout=30)
            self._delivery_thread = None
        if self._held:
            from storage.leases import release

            try:
                release(self.sessions.kw["bind"], LEASE, self.holder)  # a standby takes over at once
            except Exception as exc:  # noqa: BLE001
                log.warning("could not release the %s lease: %s", LEASE, exc)
            self._held = False


def aligned(now: datetime, interval_s: float) -> datetime:
    """``now`` floored to the group's interval: groups due together share one evaluation time, so
    rules reading the same signal share one query (the cycle cache) as in ``make bench``."""
    step = max(1, int(interval_s))
    return datetime.fromtimestamp(int(now.timestamp()) // step * step, UTC)


QUALITY_SIGNALS = frozenset({"refusal_rate", "truncation_rate", "router_agreement"})  # the Quality page's


def _latency(rule: Rule | None, inst: Instance) -> str:
    """What Investigate should open on: the alert's own latency (ITL for an ITL rule), cost for a
    cost rule, else TTFT."""
    from analytics.latency import LATENCIES

    metric = inst.labels.get("metric") or (rule.parsed.kwargs.get("metric") if rule and rule.parsed else None)
    if metric is None and rule is not None and rule.parsed is not None:
        metric = _INVESTIGATE.get(rule.parsed.signal or "")
    return metric if metric in LATENCIES or metric == "cost" else "ttft"


def _short(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
