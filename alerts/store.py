"""Where alert state lives: current instances in the metadata DB, history in ClickHouse.

In:  metadata sessions (``alert_states``, ``silences``), a ClickHouse client (``alert_events``),
     ``alerts.state.Instance`` / ``Transition`` objects.
Out: ``load_states`` (rule -> fingerprint -> Instance, as the evaluator left them, so a restart
     continues a pending ``for`` and does not page again), ``save_states`` (one transaction per
     rule group), ``save_evaluation`` / ``evaluations`` (each group's last evaluation and the
     rules that failed in it), ``write_events``, ``history`` (the newest state changes), and silences:
     ``add_silence``, ``expire_silence``, ``silences``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select

from alerts.model import Matcher
from alerts.state import Instance, Transition
from common.timeutil import as_utc
from storage.metadata import AlertEvaluation, AlertState, Silence

__all__ = [
    "Evaluation",
    "SilenceRow",
    "add_silence",
    "evaluations",
    "expire_silence",
    "history",
    "load_states",
    "prune_states",
    "save_evaluation",
    "save_states",
    "silences",
    "write_events",
]


def load_states(sessions: Any, rules: list[str] | None = None) -> dict[str, dict[str, Instance]]:
    out: dict[str, dict[str, Instance]] = {}
    with sessions() as s:
        query = select(AlertState)
        if rules is not None:
            query = query.where(AlertState.rule.in_(rules))
        for row in s.scalars(query):
            out.setdefault(row.rule, {})[row.fingerprint] = Instance(
                row.fingerprint,
                dict(row.labels),
                dict(row.annotations),
                row.state,
                row.value,
                row.active_at,
                row.fired_at,
                row.last_true_at,
                row.resolved_at,
                row.evaluated_at,
            )
    return out


def save_states(sessions: Any, states: dict[str, dict[str, Instance]]) -> None:
    """Replace the stored instances of the rules in ``states`` with these (one transaction)."""
    with sessions.begin() as s:
        if states:
            s.execute(delete(AlertState).where(AlertState.rule.in_(list(states))))
        for rule, instances in states.items():
            for inst in instances.values():
                s.add(
                    AlertState(
                        rule=rule,
                        fingerprint=inst.fingerprint,
                        labels=inst.labels,
                        annotations=inst.annotations,
                        state=inst.state,
                        value=None if inst.value is None or inst.value != inst.value else inst.value,
                        active_at=inst.active_at,
                        fired_at=inst.fired_at,
                        last_true_at=inst.last_true_at,
                        resolved_at=inst.resolved_at,
                        evaluated_at=inst.evaluated_at or inst.active_at,
                    )
                )


@dataclass(frozen=True)
class Evaluation:
    group: str
    evaluated_at: datetime
    seconds: float
    rules: int
    errors: dict[str, str]


def save_evaluation(
    sessions: Any, group: str, at: datetime, seconds: float, rules: int, errors: dict[str, str]
) -> None:
    """Record a rule group's evaluation (the last one per group is kept)."""
    with sessions.begin() as s:
        row = s.get(AlertEvaluation, group)
        if row is None:
            s.add(AlertEvaluation(group_name=group, evaluated_at=at, seconds=seconds, rules=rules, errors=errors))
        else:
            row.evaluated_at, row.seconds, row.rules, row.errors = at, seconds, rules, errors


def evaluations(sessions: Any) -> list[Evaluation]:
    """Each rule group's last evaluation, by group name."""
    with sessions() as s:
        rows = list(s.scalars(select(AlertEvaluation).order_by(AlertEvaluation.group_name)))
    return [Evaluation(r.group_name, r.evaluated_at, r.seconds, r.rules, dict(r.errors)) for r in rows]


def prune_states(sessions: Any, keep: list[str]) -> int:
    """Forget the states of rules that no longer exist (removed or renamed); how many rows went."""
    with sessions.begin() as s:
        return s.execute(delete(AlertState).where(AlertState.rule.not_in(keep))).rowcount or 0


def write_events(client: Any, rule_moves: list[tuple[str, Transition]]) -> None:
    if not rule_moves:
        return
    rows = [
        [
            t.at,
            rule,
            t.fingerprint,
            t.labels,
            t.before,
            t.after,
            None if t.value is None or t.value != t.value else float(t.value),
            t.annotations.get("summary", ""),
        ]
        for rule, t in rule_moves
    ]
    client.insert(
        "alert_events",
        rows,
        column_names=["ts", "rule", "fingerprint", "labels", "state_before", "state", "value", "summary"],
    )


def history(client: Any, start: datetime, end: datetime, limit: int = 500) -> list[dict[str, Any]]:
    """State changes in ``[start, end)``, newest first."""
    result = client.query(
        "SELECT ts, rule, fingerprint, labels, state_before, state, value, summary FROM alert_events "
        "WHERE ts >= {s:DateTime64(3)} AND ts < {e:DateTime64(3)} ORDER BY ts DESC LIMIT {n:UInt32}",
        parameters={
            "s": start.astimezone(UTC).replace(tzinfo=None),
            "e": end.astimezone(UTC).replace(tzinfo=None),
            "n": limit,
        },
    )
    return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]


@dataclass(frozen=True)
class SilenceRow:
    id: int
    matchers: list[Matcher]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str

    def active(self, at: datetime) -> bool:
        return self.starts_at <= at < self.ends_at

    def mutes(self, labels: dict[str, str], at: datetime) -> bool:
        return self.active(at) and all(m.matches(labels) for m in self.matchers)


def add_silence(
    sessions: Any, matchers: list[Matcher], starts_at: datetime, ends_at: datetime, created_by: str, comment: str
) -> int:
    if not matchers:
        raise ValueError("a silence needs at least one matcher")
    if not any(_specific(m) for m in matchers):
        raise ValueError(
            "these matchers match every alert: add one that names what to silence "
            '(name="value", or name=~"regex" that does not match anything)'
        )
    if as_utc(ends_at) <= as_utc(starts_at):
        raise ValueError("a silence must end after it starts")
    if not created_by.strip() or not comment.strip():
        raise ValueError("a silence needs an author and a comment (why it is silenced)")
    with sessions.begin() as s:
        row = Silence(
            matchers=[[m.name, m.op, m.value] for m in matchers],
            starts_at=starts_at,
            ends_at=ends_at,
            created_by=created_by.strip(),
            comment=comment.strip(),
        )
        s.add(row)
        s.flush()
        return int(row.id)


def _specific(m: Matcher) -> bool:
    """A matcher that picks some alerts: = a value, or =~ a regex that neither anything nor nothing fits."""
    import re

    if m.op == "=":
        return m.value != ""
    if m.op == "=~":
        return not re.fullmatch(m.value, "") and not re.fullmatch(m.value, "\x00probe-fleetscope")
    return False


def expire_silence(sessions: Any, silence_id: int, at: datetime | None = None) -> bool:
    at = at or datetime.now(UTC)
    with sessions.begin() as s:
        row = s.get(Silence, silence_id)
        if row is None or row.ends_at <= at:
            return False
        row.ends_at = max(at, row.starts_at)
        return True


def silences(sessions: Any, *, active_at: datetime | None = None, limit: int = 500) -> list[SilenceRow]:
    """All silences (newest first), or those active at ``active_at``."""
    with sessions() as s:
        query = select(Silence).order_by(Silence.id.desc()).limit(limit)
        if active_at is not None:
            query = query.where(Silence.ends_at > active_at, Silence.starts_at <= active_at)
        rows = list(s.scalars(query))
    return [
        SilenceRow(r.id, [Matcher(*m) for m in r.matchers], r.starts_at, r.ends_at, r.created_by, r.comment)
        for r in rows
    ]
