"""The alert state machine, pure: (a rule, its instances' last states, one evaluation) -> new
states and the transitions made.

In:  ``Timing`` (``for``, ``keep_firing_for``, how long resolved instances are kept), the prior
     ``Instance`` map (fingerprint -> instance, as loaded from the metadata DB after a restart),
     and an ``Outcome``: the samples whose condition holds (``active``), whether the expression
     returned any sample at all, or the error it raised; plus the rule's ``no_data`` / ``error``
     policy (Grafana's: NoData, Error, OK, KeepLast).
Out: the new instance map and ``Transition`` rows (``inactive -> pending``, ``pending -> firing``,
     ``firing -> resolved``, ``pending -> inactive``, ...) for the ``alert_events`` history.

Semantics (Prometheus): an instance whose condition holds becomes *pending*; after holding
for ``for`` it is *firing* (at once with ``for: 0``). A pending instance whose condition stops
holding is dropped. A firing one stays firing while its condition held within
``keep_firing_for``, then becomes *resolved*, and is kept that way ``resolved_keep`` (so the
resolve is notified) before it is dropped. A resolved instance whose condition holds again
starts over as pending. ``NoData``/``Error`` create one instance labelled
``alertstate_reason=NoData|Error`` that goes through the same states (with ``for`` at least
``SPECIAL_FOR_S``: one failed query does not page); ``KeepLast`` leaves every
instance as it was (timers included); ``OK`` treats the evaluation as "nothing holds".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from alerts.model import fingerprint

__all__ = ["Instance", "Outcome", "Timing", "Transition", "step"]

REASON = "alertstate_reason"
SPECIAL_FOR_S = 60.0


@dataclass(frozen=True)
class Timing:
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    resolved_keep_s: float = 900.0


@dataclass(frozen=True)
class Instance:
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: str  # pending | firing | resolved
    value: float | None
    active_at: datetime
    fired_at: datetime | None = None
    last_true_at: datetime | None = None
    resolved_at: datetime | None = None
    evaluated_at: datetime | None = None


@dataclass(frozen=True)
class Active:
    """One sample whose condition holds, its labels (rule labels added) and annotations rendered."""

    labels: dict[str, str]
    annotations: dict[str, str]
    value: float | None


@dataclass(frozen=True)
class Outcome:
    active: list[Active]
    any_data: bool = True
    error: str | None = None


@dataclass(frozen=True)
class Transition:
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    before: str  # inactive | pending | firing | resolved
    after: str
    value: float | None
    at: datetime


def _special(base: dict[str, str], reason: str, message: str) -> Active:
    labels = {**base, REASON: reason}
    return Active(
        labels,
        {"summary": f"{base.get('alertname', 'rule')}: {message}", "error": message}
        if reason == "Error"
        else {"summary": f"{base.get('alertname', 'rule')}: {message}"},
        None,
    )


def _under_policy(
    outcome: Outcome, base_labels: dict[str, str], no_data: str, error: str
) -> tuple[list[Active], bool] | None:
    """What holds after ``outcome`` under the rule's ``no_data`` and ``error`` policies, and whether
    the real instances are kept as they were; None: change nothing (``KeepLast``)."""
    if outcome.error is not None:
        if error == "KeepLast":
            return None
        active = [] if error == "OK" else [_special(base_labels, "Error", outcome.error)]
        return active, error == "Error"  # an unanswered query says nothing about the real instances
    if not outcome.any_data:
        if no_data == "KeepLast":
            return None
        if no_data == "NoData":
            return [_special(base_labels, "NoData", "the expression returned no data")], True
        if no_data == "Error":
            return [_special(base_labels, "Error", "the expression returned no data")], True
        return [], False
    return outcome.active, False


def step(
    timing: Timing,
    prior: dict[str, Instance],
    outcome: Outcome,
    at: datetime,
    *,
    base_labels: dict[str, str],
    no_data: str = "NoData",
    error: str = "Error",
) -> tuple[dict[str, Instance], list[Transition]]:
    """One evaluation of a rule at ``at``: the new instances and the transitions made."""
    holds = _under_policy(outcome, base_labels, no_data, error)
    if holds is None:
        return dict(prior), []
    active, keep_real = holds
    new: dict[str, Instance] = {}
    moves: list[Transition] = []

    def move(inst: Instance, before: str, after: str) -> None:
        moves.append(Transition(inst.fingerprint, inst.labels, inst.annotations, before, after, inst.value, at))

    holding = {}
    for a in active:
        holding[fingerprint(a.labels)] = a
    for fp, a in holding.items():
        old = prior.get(fp)
        # a NoData/Error instance waits at least SPECIAL_FOR_S: one failed query is not a page
        for_s = max(timing.for_s, SPECIAL_FOR_S) if REASON in a.labels else timing.for_s
        if old is None or old.state == "resolved":
            inst = Instance(
                fp, a.labels, a.annotations, "pending", a.value, active_at=at, last_true_at=at, evaluated_at=at
            )
            before = "inactive" if old is None else "resolved"
            if for_s <= 0:
                inst = replace(inst, state="firing", fired_at=at)
                move(inst, before, "pending")
                move(inst, "pending", "firing")
            else:
                move(inst, before, "pending")
        else:
            inst = replace(
                old, labels=a.labels, annotations=a.annotations, value=a.value, last_true_at=at, evaluated_at=at
            )
            if old.state == "pending" and at - old.active_at >= timedelta(seconds=for_s):
                inst = replace(inst, state="firing", fired_at=at)
                move(inst, "pending", "firing")
        new[fp] = inst
    for fp, old in prior.items():
        if fp in holding:
            continue
        special = REASON in old.labels
        if keep_real and not special:
            new[fp] = old  # no answer about this instance: it stays as it was
            continue
        if old.state == "pending":
            move(old, "pending", "inactive")
        elif old.state == "firing":
            last = old.last_true_at or old.active_at
            if timing.keep_firing_for_s > 0 and at - last < timedelta(seconds=timing.keep_firing_for_s):
                new[fp] = replace(old, evaluated_at=at)
                continue
            gone = replace(old, state="resolved", resolved_at=at, evaluated_at=at)
            move(gone, "firing", "resolved")
            new[fp] = gone
        elif (
            old.state == "resolved"
            and old.resolved_at is not None
            and at - old.resolved_at < timedelta(seconds=timing.resolved_keep_s)
        ):
            new[fp] = old
    return new, moves
