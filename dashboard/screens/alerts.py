"""Alerts: what is firing or pending now (and what resolved in the last minutes), with a link to
Investigate around when each began; the state changes in the window; the silences (listed,
expired, created here); and the notification log. Reads what the evaluator keeps through
``alerts.store`` and ``alerts.outbox``; silences are written through ``alerts.store``, which
checks them. No SQL here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import altair as alt
import pandas as pd
import streamlit as st
from clickhouse_connect.driver.exceptions import DatabaseError
from sqlalchemy.exc import SQLAlchemyError

from alerts import outbox
from alerts.model import parse_matchers
from alerts.state import REASON
from alerts.store import add_silence, evaluations, expire_silence, history, load_states, silences
from analytics.latency import LATENCIES
from dashboard.cache import cached
from dashboard.context import page_context, plain, shown
from dashboard.format import NONE
from dashboard.marks import TS_TIP, time_x, with_annotations
from dashboard.view import FILTER_KEYS

FRESH_S = 10  # metadata reads are kept this long (the shortest grain): the evaluator runs every 15 s or more
DURATIONS = {
    "30m": timedelta(minutes=30),
    "1h": timedelta(hours=1),
    "2h": timedelta(hours=2),
    "4h": timedelta(hours=4),
    "1d": timedelta(days=1),
}
STATE_COLORS = {"firing": "#dc2626", "pending": "#f59e0b", "resolved": "#16a34a", "inactive": "#9ca3af"}
TIME = "YYYY-MM-DD HH:mm:ss"
_FLASH = "fleetscope_alerts_flash"
_CLEAR_FORM = "fleetscope_alerts_clear_form"
_FORM_KEYS = ("silence_matchers", "silence_comment")  # emptied after a silence is made; author and duration stay


def _store(sessions: Any) -> str:
    """What the metadata caches are keyed on: the sessionmaker and its database (password hidden)."""
    return f"{id(sessions)}:{getattr(sessions, 'kw', {}).get('bind')!r}"


@st.cache_data(ttl=FRESH_S, show_spinner=False, max_entries=64)
def _states(store: str, _sessions: Any) -> dict[str, dict[str, Any]]:
    return load_states(_sessions)


@st.cache_data(ttl=FRESH_S, show_spinner=False, max_entries=64)
def _evaluations(store: str, _sessions: Any) -> list[Any]:
    return evaluations(_sessions)


@st.cache_data(ttl=FRESH_S, show_spinner=False, max_entries=64)
def _silences(store: str, _sessions: Any) -> list[Any]:
    return silences(_sessions)


@st.cache_data(ttl=FRESH_S, show_spinner=False, max_entries=64)
def _notifications(store: str, _sessions: Any) -> tuple[list[Any], dict[str, int]]:
    return outbox.log(_sessions, 100), outbox.counts(_sessions)


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")


def _investigate(inst: Any, now: datetime) -> str:
    """Investigate from an hour before the condition first held to now (or 30 minutes past the resolve)."""
    end = min(now, inst.resolved_at + timedelta(minutes=30)) if inst.resolved_at else now
    metric = inst.labels.get("metric", "ttft")
    query = {
        "metric": metric if metric in LATENCIES else "ttft",
        "from": (inst.active_at - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "to": end.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if inst.labels.get("model") and REASON not in inst.labels:
        query["model"] = inst.labels["model"]
    return f"investigate?{urlencode(query)}"  # relative: the page sits beside this one, also under a base path


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:300]


ctx = page_context("Alerts")
v, client, sessions, settings = ctx.view, ctx.client, ctx.sessions, ctx.settings
if sessions is None:
    st.info("No metadata DB configured: alert states, silences and the notification log live there (`metadata.url`).")
    st.stop()
now = datetime.now(UTC)
try:
    states = _states(_store(sessions), sessions)
    silence_rows = _silences(_store(sessions), sessions)
    log_rows, sent = _notifications(_store(sessions), sessions)
    groups = _evaluations(_store(sessions), sessions)
except SQLAlchemyError as exc:
    st.error(f"The alert tables cannot be read (run `fleetscope migrate`): {_first_line(exc)}")
    st.stop()
if any(getattr(v.filters, key) for key in FILTER_KEYS):
    st.caption("The sidebar's filters do not apply here: this page lists every alert.")

instances = [(rule, inst) for rule, found in states.items() for inst in found.values()]
firing = [(r, i) for r, i in instances if i.state == "firing"]
pending = [(r, i) for r, i in instances if i.state == "pending"]
resolved = [(r, i) for r, i in instances if i.state == "resolved"]
active = [s for s in silence_rows if s.active(now)]
muted = sum(any(s.mutes(i.labels, now) for s in active) for _, i in firing)
cols = st.columns(4)
cols[0].metric("Firing", f"{len(firing)}")
cols[1].metric("Pending", f"{len(pending)}", help="the condition holds; firing once it has held for the rule's `for`")
cols[2].metric("Active silences", f"{len(active)}", help=f"{muted} of the firing alerts are muted by them")
cols[3].metric(
    "Notifications pending or failed",
    f"{sent['pending'] + sent['failed']}",
    help=f"{sent['pending']} waiting for delivery, {sent['failed']} given up on, {sent['delivered']} delivered",
)
last_run = max((g.evaluated_at for g in groups), default=None)
failing = {f"{g.group}/{rule}": error for g in groups for rule, error in g.errors.items()}

st.subheader("Firing and pending")
if not firing and not pending:
    if last_run is not None:
        st.info(
            f"No alert is firing or pending: {sum(g.rules for g in groups)} rules in {len(groups)} groups, "
            f"last evaluated at {last_run:%Y-%m-%d %H:%M:%S} UTC."
        )
    else:
        st.info(
            "No alert is firing or pending, and the evaluator has not run yet: start it with `fleetscope alerts run`."
        )
else:
    order = sorted(firing, key=lambda ri: ri[1].fired_at or ri[1].active_at, reverse=True) + sorted(
        pending, key=lambda ri: ri[1].active_at, reverse=True
    )
    table = pd.DataFrame(
        [
            {
                "state": i.state,
                "alert": i.labels.get("alertname", r),
                "labels": _labels(i.labels),
                "summary": i.annotations.get("summary", ""),
                "value": shown(i.value, "{:.4g}"),
                "since": i.fired_at if i.state == "firing" and i.fired_at else i.active_at,
                "silenced": any(s.mutes(i.labels, now) for s in active),
                "investigate": _investigate(i, now),
            }
            for r, i in order
        ]
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "state": st.column_config.TextColumn("state", width="small"),
            "labels": st.column_config.TextColumn("labels", width="medium"),
            "summary": st.column_config.TextColumn("summary", width="medium"),
            "value": st.column_config.TextColumn("value", width="small"),
            "since": st.column_config.DatetimeColumn(
                "since (UTC)", format=TIME, help="firing: when it fired; pending: when the condition began to hold"
            ),
            "silenced": st.column_config.CheckboxColumn("silenced", width="small", help="muted by an active silence"),
            "investigate": st.column_config.LinkColumn("investigate", display_text="Investigate", width="small"),
        },
    )
    if last_run is not None:
        st.caption(f"Last evaluation recorded at {last_run:%H:%M:%S} UTC.")
if resolved:
    st.caption("Resolved in the last minutes (kept until the resolve is notified):")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "alert": i.labels.get("alertname", r),
                    "labels": _labels(i.labels),
                    "summary": i.annotations.get("summary", ""),
                    "fired": i.fired_at,
                    "resolved": i.resolved_at,
                    "investigate": _investigate(i, now),
                }
                for r, i in sorted(resolved, key=lambda ri: ri[1].resolved_at or now, reverse=True)
            ]
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "fired": st.column_config.DatetimeColumn("fired (UTC)", format=TIME),
            "resolved": st.column_config.DatetimeColumn("resolved (UTC)", format=TIME),
            "investigate": st.column_config.LinkColumn("investigate", display_text="Investigate", width="small"),
        },
    )

if failing:
    st.error(
        f"{len(failing)} rule(s) could not be evaluated last time (they raise an Error alert unless their "
        "`error` policy says otherwise):\n\n" + "\n".join(f"- **{k}**: {e}" for k, e in sorted(failing.items()))
    )
if groups:
    with st.expander(f"Rule groups ({len(groups)}; last evaluated {last_run:%H:%M:%S} UTC)"):
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "group": g.group,
                        "rules": g.rules,
                        "last evaluated": g.evaluated_at,
                        "took (ms)": round(g.seconds * 1000),
                        "failing rules": len(g.errors),
                    }
                    for g in groups
                ]
            ),
            hide_index=True,
            width="stretch",
            column_config={"last evaluated": st.column_config.DatetimeColumn("last evaluated (UTC)", format=TIME)},
        )

st.subheader("History")
try:
    changes = cached(history, client, v.start, v.end)
except DatabaseError as exc:
    st.warning(f"The alert history cannot be read (run `fleetscope migrate`): {_first_line(exc)}")
    changes = None
if changes is not None and not changes:
    st.info(f"No alert changed state between {v.start:%H:%M} and {v.end:%H:%M} UTC. Try a longer time range.")
elif changes:
    events = pd.DataFrame(
        [
            {
                "ts": e["ts"],
                "alert": e["rule"],
                "labels": _labels(dict(e["labels"])),
                "change": f"{e['state_before']} → {e['state']}",
                "state": e["state"],
                "value": shown(e["value"], "{:.4g}"),
                "summary": e["summary"],
            }
            for e in changes
        ]
    )
    events["ts"] = pd.to_datetime(events["ts"], utc=True)  # ClickHouse gives UTC, with or without the zone
    alerts_shown = events["alert"].nunique()
    window = [
        alt.DateTime(year=t.year, month=t.month, date=t.day, hours=t.hour, minutes=t.minute, seconds=t.second, utc=True)
        for t in (v.start, v.end)
    ]  # the whole range, so a change shows when in it
    chart = (
        alt.Chart(events)
        .mark_point(filled=True, size=90, opacity=0.9)
        .encode(
            x=time_x(v).scale(type="utc", domain=window),
            y=alt.Y("alert:N", title=None),
            color=alt.Color(
                "state:N",
                title="state entered",
                scale=alt.Scale(domain=list(STATE_COLORS), range=list(STATE_COLORS.values())),
            ),
            tooltip=[TS_TIP, "alert:N", "labels:N", "change:N", "value:N", "summary:N"],
        )
        .properties(height=max(120, 28 * alerts_shown))
    )
    st.altair_chart(with_annotations(chart, ctx), width="stretch")
    st.dataframe(
        plain(events.drop(columns=["state"])),
        hide_index=True,
        width="stretch",
        column_config={"ts": st.column_config.DatetimeColumn("time (UTC)", format=TIME)},
    )
    if len(changes) >= 500:
        st.caption("The newest 500 changes: pick a shorter time range to see the older ones.")

st.subheader("Silences")
st.caption("A silence mutes the notifications of the alerts that match every matcher; they still show here.")
if flash := st.session_state.pop(_FLASH, None):
    st.success(flash)
# active, or starting later (one expired before it started ends when it starts: it never mutes anything)
upcoming = [s for s in silence_rows if s.ends_at > now and s.ends_at > s.starts_at]
ended = [s for s in silence_rows if s not in upcoming]
if not silence_rows:
    st.caption("No silences yet.")
for s in upcoming:
    left, right = st.columns([6, 1])
    when = (
        f"until {s.ends_at:%Y-%m-%d %H:%M} UTC"
        if s.active(now)
        else f"from {s.starts_at:%Y-%m-%d %H:%M} to {s.ends_at:%Y-%m-%d %H:%M} UTC"
    )
    left.markdown(f"**#{s.id}** `{', '.join(map(str, s.matchers))}` {when} — {s.created_by}: {s.comment}")
    if right.button("Expire", key=f"expire_{s.id}"):
        done = expire_silence(sessions, s.id)
        _silences.clear()
        if done:
            st.session_state[_FLASH] = f"Silence #{s.id} expired."
            st.rerun()
        st.warning(f"Silence #{s.id} had already ended.")
if ended:
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "id": s.id,
                    "matchers": ", ".join(map(str, s.matchers)),
                    "started": s.starts_at,
                    "ended": s.ends_at,
                    "by": s.created_by,
                    "comment": s.comment,
                }
                for s in ended
            ]
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "started": st.column_config.DatetimeColumn("started (UTC)", format=TIME),
            "ended": st.column_config.DatetimeColumn("ended (UTC)", format=TIME),
        },
    )

dash = getattr(settings, "dashboard", None)
user = st.user.get("email") if dash is not None and dash.oidc and st.user.is_logged_in else None
if st.session_state.pop(_CLEAR_FORM, False):  # before the widgets are drawn: the only time their value may be set
    for key in _FORM_KEYS:
        st.session_state[key] = ""
with st.form("silence"):
    st.markdown("**New silence**")
    text = st.text_input(
        "Matchers",
        key="silence_matchers",
        placeholder='alertname="KVCacheSaturated", replica="small-0"',
        help='name="value", name!="value", name=~"regex" or name!~"regex", separated by commas',
    )
    a, b = st.columns([1, 2])
    duration = a.selectbox("Duration", list(DURATIONS), index=2, key="silence_duration", help="from now")
    author = b.text_input("Author", value=user or "", key="silence_author")
    comment = st.text_input("Comment", key="silence_comment", placeholder="draining small-0 for a driver update")
    if st.form_submit_button("Create silence"):
        try:
            matchers = parse_matchers(text)
            begins = datetime.now(UTC)
            silence_id = add_silence(
                sessions, matchers, begins, begins + DURATIONS[duration], author or "", comment
            )  # author is never None (the box has a value)
        except ValueError as exc:
            st.error(f"Not saved: {exc}")
        else:
            _silences.clear()
            st.session_state[_CLEAR_FORM] = True
            st.session_state[_FLASH] = (
                f"Silence #{silence_id} created: {', '.join(map(str, matchers))} "
                f"until {begins + DURATIONS[duration]:%Y-%m-%d %H:%M} UTC."
            )
            st.rerun()

st.subheader("Notification log")
st.caption(
    f"{sent['delivered']} delivered · {sent['pending']} pending · {sent['failed']} failed "
    "(the newest 100 below; `fleetscope alerts outbox` prints them too)."
)
if not log_rows:
    receivers = getattr(getattr(settings, "alerts", None), "receivers", None)
    st.info(
        "No notification yet: "
        + (
            "no receiver is configured (`alerts.receivers` in fleetscope.yaml)."
            if not receivers
            else "none has been due (a firing alert is sent to the receivers its route names)."
        )
    )
else:
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "created": r.created_at,
                    "receiver": r.receiver,
                    "status": r.status,
                    "attempts": r.attempts,
                    "last HTTP status": shown(r.last_status, "{:.0f}"),
                    "error": r.last_error or "",
                    # text: Streamlit prints an empty datetime cell "None"; one not delivered yet reads "–"
                    "delivered": f"{r.delivered_at:%Y-%m-%d %H:%M:%S}" if r.delivered_at else NONE,
                }
                for r in log_rows
            ]
        ),
        hide_index=True,
        width="stretch",
        column_config={
            "created": st.column_config.DatetimeColumn("created (UTC)", format=TIME),
            "delivered": st.column_config.TextColumn("delivered (UTC)"),
        },
    )
