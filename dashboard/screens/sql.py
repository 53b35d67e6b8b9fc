"""SQL: ad-hoc ClickHouse SQL on the store, read-only. An editor (its text in the URL, so a query
can be sent as a link), a row limit and Run; the result as a table, a CSV download, and line
charts when it has a time column; saved queries (load, save, delete); the tables and their
columns. The statement check, the limits and the read-only session are ``adhoc.runner``'s; the
saved queries are ``adhoc.saved``'s. The SQL here is the user's own."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import altair as alt
import pandas as pd
import streamlit as st
from sqlalchemy.exc import SQLAlchemyError

from adhoc.formats import jsonable, render
from adhoc.runner import Limits, QueryFailed, ReadOnlyRunner, Refused, Result, TableInfo
from adhoc.saved import EXAMPLE_QUERY, delete_query, save_query, saved_queries
from dashboard.context import page_context
from dashboard.marks import LINE, TS_TIP, time_x, with_gaps
from dashboard.view import FILTER_KEYS
from storage.errors import StoreError

DEFAULT_SQL = EXAMPLE_QUERY
DEFAULT_LIMIT = 1000
URL_MAX_CHARS = 2000  # a longer query stays out of the link (browsers and proxies cut long URLs)
SCHEMA_TTL_S = 60
FRESH_S = 10  # the saved queries are read at most this often (a save or delete here shows at once)
MAX_CHARTS = 6  # numeric columns drawn over time
MAX_COLORS = 12  # a text column with at most this many values colours the lines
MAX_POINTS = 300  # rows up to which a chart marks each one (past that the dots hide the line, and slow the browser)
_AS_TEXT = (
    "Map",
    "Array",
    "Tuple",
    "Nested",
    "UUID",
    "IPv",
    "JSON",
    "Object",
    "Variant",
    "Dynamic",
    "Point",
    "Ring",
    "Polygon",
    "MultiPolygon",
    "LineString",
    "MultiLineString",
)
_TEXT, _LIMIT, _PICK = "sql_text", "sql_limit", "sql_saved"
_SAVE_KEYS = ("sql_save_name", "sql_save_description")  # emptied after a save; the author stays
_KEPT = "fleetscope_sql_kept"  # the editor's text and row limit, kept while another page is open (widget state is not)
_LAST = "fleetscope_sql_last"  # the last run: (sql, row limit, Result or (kind, message))
_RUN_NEXT = "fleetscope_sql_run_next"  # a saved query was loaded: run it
_FLASH = "fleetscope_sql_flash"
_SAVED_LIST = "fleetscope_sql_saved_list"  # what the selectbox offered, for its callback
_AFTER_SAVE = "fleetscope_sql_after_save"  # the name just saved: select it, empty the form


def _md(text: str) -> str:
    """``text`` shown as itself in a Markdown table cell."""
    return "".join("\\" + c if c in "\\`*_[]<>|#" else c for c in str(text)).replace("\n", " ")


def _columns_text(columns: list[tuple[str, str, str]]) -> str:
    """A table's columns as a Markdown table: name, type, comment."""
    lines = ["| Column | Type | Comment |", "|---|---|---|"]
    lines += [f"| {_md(name)} | {_md(kind)} | {_md(comment)} |" for name, kind, comment in columns]
    return "\n".join(lines)


def _store(sessions: Any) -> str:
    """What the metadata cache is keyed on: the sessionmaker and its database (password hidden)."""
    return f"{id(sessions)}:{getattr(sessions, 'kw', {}).get('bind')!r}"


@st.cache_resource(show_spinner=False, max_entries=8)
def _runner(
    url: str,
    database: str | None,
    limits: tuple[float, int, int],
    connect_timeout_s: float,
    server_enforces_readonly: bool = False,
) -> ReadOnlyRunner:
    """One runner per store (thread-safe; it keeps its read-only ClickHouse sessions open)."""
    return ReadOnlyRunner(
        url,
        database=database,
        limits=Limits(*limits),
        connect_timeout_s=connect_timeout_s,
        server_enforces_readonly=server_enforces_readonly,
    )


@st.cache_data(ttl=SCHEMA_TTL_S, show_spinner=False, max_entries=16)
def _schema(store: str, _reader: ReadOnlyRunner) -> list[TableInfo]:
    return _reader.schema()


@st.cache_data(ttl=FRESH_S, show_spinner=False, max_entries=64)
def _saved(store: str, _sessions: Any) -> list[Any]:
    return saved_queries(_sessions)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


def _base(kind: str) -> str:
    """A ClickHouse type without its Nullable/LowCardinality wrappers."""
    for wrapper in ("Nullable(", "LowCardinality("):
        while kind.startswith(wrapper):
            kind = kind[len(wrapper) : -1]
    return kind


def _is_time(kind: str) -> bool:
    return _base(kind).startswith("Date")  # Date, Date32, DateTime, DateTime64


def _is_number(kind: str) -> bool:
    return _base(kind).startswith(("Int", "UInt", "Float", "Decimal"))


def _is_text(kind: str) -> bool:
    return _base(kind).startswith(("String", "FixedString", "Enum"))


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple):
        return json.dumps(jsonable(value), ensure_ascii=False)
    return str(value)


def _set_column(df: pd.DataFrame, i: int, values: pd.Series) -> None:
    """Column ``i`` of ``df`` (by position: two columns may share a name) set to ``values``."""
    df.isetitem(i, cast(Any, values))  # pandas takes a Series; pandas-stubs type the value as an array only


def _table(result: Result) -> pd.DataFrame:
    """The result as the table shows it: repeated column names made unique (``x``, ``x (2)``), and
    maps, arrays, tuples, UUIDs and addresses as text (as in the CSV), which the table cannot hold."""
    df = result.frame()
    for i, kind in enumerate(result.types):
        if _base(kind).startswith(_AS_TEXT):
            _set_column(df, i, df.iloc[:, i].map(_cell))
        elif _base(kind).startswith("DateTime"):  # shown in UTC, whatever zone the column has
            _set_column(df, i, pd.to_datetime(df.iloc[:, i], utc=True))
    seen: dict[str, int] = {}
    names = []
    for name in result.columns:
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    df.columns = names
    return df


def _time_columns(result: Result, df: pd.DataFrame) -> dict[str, Any]:
    """DateTime columns labelled UTC, to the second (to the millisecond for DateTime64 with a fraction)."""
    config = {}
    for name, kind in zip(df.columns, result.types, strict=True):
        base = _base(kind)
        if base.startswith("DateTime"):
            fraction = base.startswith("DateTime64(") and not base.startswith("DateTime64(0")
            config[name] = st.column_config.DatetimeColumn(
                f"{name} (UTC)", format="YYYY-MM-DD HH:mm:ss" + (".SSS" if fraction else "")
            )
    return config


def _charts(result: Result, df: pd.DataFrame) -> tuple[list[alt.Chart], str]:
    """Line charts of each numeric column over the first time column (UTC), coloured by a text column
    with few values; the other text columns split the lines. Also a caption saying what was drawn."""
    kinds = dict(zip(df.columns, result.types, strict=True))
    time = next((c for c, k in kinds.items() if _is_time(k)), None)
    numbers = [c for c, k in kinds.items() if _is_number(k) and c != time and df[c].notna().any()]
    if time is None or not numbers or df.empty:
        return [], ""
    ts = pd.to_datetime(df[time], utc=True, errors="coerce")
    texts = [c for c, k in kinds.items() if _is_text(k)]
    group = next((c for c in texts if df[c].nunique(dropna=False) <= MAX_COLORS), None)
    others = [c for c in texts if c != group]
    span = ts.max() - ts.min() if ts.notna().any() else pd.Timedelta(0)
    x = time_x(SimpleNamespace(span=span), title=f"{time} (UTC)")
    charts = []
    for column in numbers[:MAX_CHARTS]:
        data = pd.DataFrame({"ts": ts, "value": pd.to_numeric(df[column], errors="coerce")})
        # renamed: Vega reads dots and brackets in field names (``count()``, ``quantile(0.99)(x)``) as paths
        tooltip = [TS_TIP, alt.Tooltip("value:Q", title=column, format=",.6~g")]
        encoding: dict[str, Any] = {}
        if group is not None:
            data["group"] = df[group].astype(str).to_numpy()
            encoding["color"] = alt.Color("group:N", title=group)
            tooltip.append(alt.Tooltip("group:N", title=group))
        if others:
            data["line"] = df[others].astype(str).agg(" · ".join, axis=1).to_numpy()
            encoding["detail"] = "line:N"
            tooltip.append(alt.Tooltip("line:N", title=" · ".join(others)))
        series = [c for c in ("group", "line") if c in data]
        chart = (
            alt.Chart(with_gaps(data.dropna(subset=["ts"]), by=series), title=column)
            .mark_line(point=len(data) <= MAX_POINTS, **LINE)
            .encode(x=x, y=alt.Y("value:Q", title=column), tooltip=tooltip, **encoding)
            .properties(height=240)
        )
        charts.append(chart)
    said = (
        f"{', '.join(numbers[:MAX_CHARTS])} over {time}"
        + (f", by {group}" if group else "")
        + (f", one line per {' · '.join(others)}" if others else "")
    )
    if len(numbers) > MAX_CHARTS:
        said += f" (the first {MAX_CHARTS} numeric columns of {len(numbers)})"
    return charts, said


def _run(runner: ReadOnlyRunner, sql: str, max_rows: int) -> None:
    """Run ``sql`` and keep what came of it for this and later reruns (a download, a save)."""
    try:
        with st.spinner("Running…"):
            outcome: Any = runner.run(sql, max_rows=max_rows)
    except Refused as exc:
        outcome = ("refused", str(exc))
    except QueryFailed as exc:
        outcome = ("failed", str(exc))
    except StoreError as exc:
        outcome = ("store", _first_line(exc))
    st.session_state[_LAST] = (sql, max_rows, outcome)
    if len(sql) <= URL_MAX_CHARS:
        st.query_params["q"] = sql
    elif "q" in st.query_params:
        del st.query_params["q"]


def _load() -> None:
    """The saved query picked in the selectbox, into the editor (and run)."""
    name = st.session_state.get(_PICK)
    found = next((q for q in st.session_state.get(_SAVED_LIST, []) if q.name == name), None)
    if found is not None:
        st.session_state[_TEXT] = found.sql
        st.session_state[_RUN_NEXT] = True


ctx = page_context("SQL")
client, sessions, settings = ctx.client, ctx.sessions, ctx.settings
if settings is None:
    st.info("No settings: the SQL page needs `clickhouse.url` and the `sql` limits (fleetscope.yaml).")
    st.stop()
limits = settings.sql.limits()
st.caption(
    f"One read-only statement: SELECT, DESCRIBE, SHOW or EXPLAIN (no SETTINGS or FORMAT clause, nothing "
    f"that reaches files, the network or other databases). At most {limits.max_rows:,} rows, "
    f"{limits.timeout_s:g} s and {limits.max_memory_bytes / 1024**3:g} GiB per query. Times are UTC. "
    "Examples are in `docs/queries/`, every table and column in `docs/schema.md` and in *Tables* on the right. "
    "Ctrl+Enter runs the query."
)
if any(getattr(ctx.view.filters, key) for key in FILTER_KEYS):
    st.caption("The sidebar's time range and filters do not apply here: the query says what it reads.")
st.html("<style>.st-key-sql_text textarea { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }</style>")

runner = _runner(
    settings.clickhouse.url,
    getattr(client, "database", None),
    (limits.timeout_s, limits.max_rows, limits.max_memory_bytes),
    settings.clickhouse.connect_timeout_s,
    settings.sql.server_enforces_readonly,
)
schema_key = f"{settings.clickhouse.url}|{runner.database}"

# before the widgets are drawn: the only time their values may be set
kept_text, kept_limit = st.session_state.get(_KEPT, (None, None))
st.session_state.setdefault(_TEXT, st.query_params.get("q") or kept_text or DEFAULT_SQL)
st.session_state.setdefault(_LIMIT, min(kept_limit or DEFAULT_LIMIT, limits.max_rows))
st.session_state.setdefault(_PICK, None)
if (just_saved := st.session_state.pop(_AFTER_SAVE, None)) is not None:
    for key in _SAVE_KEYS:
        st.session_state[key] = ""
    st.session_state[_PICK] = just_saved or None

main, side = st.columns([3, 1], gap="large")
with main:
    if flash := st.session_state.pop(_FLASH, None):
        st.success(flash)
    saved: list[Any] = []
    saved_problem = None
    if sessions is None:
        saved_problem = "No metadata DB configured: saved queries live there (`metadata.url`)."
    else:
        try:
            saved = _saved(_store(sessions), sessions)
        except SQLAlchemyError as exc:
            saved_problem = f"Saved queries cannot be read (run `fleetscope migrate`): {_first_line(exc)}"
    st.session_state[_SAVED_LIST] = saved
    names = [q.name for q in saved]
    if st.session_state[_PICK] is not None and st.session_state[_PICK] not in names:
        st.session_state[_PICK] = None  # deleted, here or elsewhere
    if saved_problem:
        st.caption(saved_problem)
    else:
        pick_col, delete_col = st.columns([5, 1], vertical_alignment="bottom")
        picked = pick_col.selectbox(
            "Saved queries",
            names,
            key=_PICK,
            on_change=_load,
            placeholder="Load a saved query…" if names else "No saved queries yet: save one below",
            help="Puts the query in the editor and runs it.",
        )
        if delete_col.button(
            "Delete",
            key="sql_delete",
            disabled=picked is None,
            width="stretch",
            help="Delete the saved query picked on the left.",
        ):
            done = delete_query(sessions, picked)
            _saved.clear()
            st.session_state[_AFTER_SAVE] = ""  # nothing picked
            st.session_state[_FLASH] = (
                f"Deleted the saved query “{picked}”." if done else f"“{picked}” was already gone."
            )
            st.rerun()
        chosen = next((q for q in saved if q.name == picked), None)
        if chosen is not None:
            st.caption(
                f"{chosen.description or 'No description.'} — {chosen.created_by or 'anonymous'}, "
                f"saved {chosen.updated_at:%Y-%m-%d %H:%M} UTC"
            )

    dash = getattr(settings, "dashboard", None)
    user = st.user.get("email") if dash is not None and dash.oidc and st.user.is_logged_in else None
    with st.form("sql"):
        sql = st.text_area(
            "Query", key=_TEXT, height=180, label_visibility="collapsed", placeholder="SELECT … FROM requests …"
        )
        left, right = st.columns([1, 4], vertical_alignment="bottom")
        max_rows = left.number_input(
            "Row limit",
            min_value=1,
            max_value=limits.max_rows,
            step=100,
            key=_LIMIT,
            help=f"At most {limits.max_rows:,} (`sql.max_rows`); a longer result is cut.",
        )
        run_clicked = right.form_submit_button("Run", type="primary")
        with st.expander("Save this query"):
            name = st.text_input(
                "Name", key="sql_save_name", max_chars=200, help="Saving under a name that exists replaces that query."
            )
            description = st.text_input("Description", key="sql_save_description")
            author = st.text_input("Author", value=user or "", key="sql_save_author", max_chars=128)
            save_clicked = st.form_submit_button("Save query")
    st.session_state[_KEPT] = (sql, int(max_rows))
    if save_clicked:
        if sessions is None:
            st.error("Not saved: no metadata DB configured (`metadata.url`).")
        else:
            try:
                replaced = save_query(sessions, name, sql, description, author or "")  # never None: value given
            except ValueError as exc:  # a bad name, or a statement the check refuses (adhoc.guard.Refused)
                st.error(f"Not saved: {exc}")
            except SQLAlchemyError as exc:
                st.error(f"Not saved (run `fleetscope migrate`?): {_first_line(exc)}")
            else:
                _saved.clear()
                st.session_state[_AFTER_SAVE] = name.strip()
                st.session_state[_FLASH] = f"{'Replaced' if replaced else 'Saved'} the query “{name.strip()}”."
                st.rerun()

    if run_clicked or st.session_state.pop(_RUN_NEXT, False) or _LAST not in st.session_state:
        _run(runner, sql, int(max_rows))
    ran_sql, ran_rows, outcome = st.session_state[_LAST]
    if ran_sql.strip() != sql.strip() or ran_rows != max_rows:
        st.caption(
            "The results below are of the last run: the query or the row limit changed since. **Run** to update."
        )
    if isinstance(outcome, tuple):
        kind, message = outcome
        if kind == "refused":
            st.error(f"Refused: {message.rstrip('.')}. Nothing ran.")
        elif kind == "failed":
            st.error(f"The query failed: {message}")
        else:
            st.error(f"The store cannot be read: {message}")
    else:
        result: Result = outcome
        n = len(result.rows)
        took = f"{n:,} row{'s' if n != 1 else ''} in {result.elapsed_s * 1000:,.0f} ms"
        if result.truncated:
            took += f", cut at the row limit ({ran_rows:,}): add a LIMIT or an aggregation, or raise the row limit"
        if not n:
            st.info(f"No rows: the {result.kind.upper()} ran ({result.elapsed_s * 1000:,.0f} ms) and returned nothing.")
        else:
            table = _table(result)
            charts, drawn = _charts(result, table)
            for chart in charts:
                st.altair_chart(chart, width="stretch")
            if drawn:
                st.caption(f"Charted: {drawn}. Times are UTC.")
            st.dataframe(table, hide_index=True, width="stretch", column_config=_time_columns(result, table))
            cap, download = st.columns([4, 1], vertical_alignment="center")
            cap.caption(took)
            download.download_button(
                "Download CSV",
                render(result, "csv"),
                file_name="query.csv",
                mime="text/csv",
                on_click="ignore",
                width="stretch",
            )

with side:
    st.subheader("Tables")
    try:
        tables = _schema(schema_key, runner)
    except (QueryFailed, StoreError) as exc:
        st.warning(f"The tables cannot be listed: {_first_line(exc)}")
        tables = []
    else:
        if not tables:
            st.info("No tables in this database: run `fleetscope migrate`.")
    for info in tables:
        rows = "–" if info.rows is None else f"{info.rows:,} row{'' if info.rows == 1 else 's'}"
        with st.expander(f"**{info.name}** · {rows}"):
            st.caption(f"{info.engine}" + (f" — {info.comment}" if info.comment else ""))
            # text, not a table widget: sixteen grids mounted in closed expanders cost the page
            # most of a second in the browser, for lists nobody sorts
            st.markdown(_columns_text(info.columns))
    if tables:
        st.caption(f"Read at most every {SCHEMA_TTL_S} s. Views and materialized views have no row count.")
